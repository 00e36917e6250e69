/**
 * A call that finds its engine dead before the engine produced anything for it (the engine killed:
 * connection refused; or its stream broken off before the first token) is made again on another
 * healthy rank, once, so the agent gets its answer and the rollout loses no call. A stream cut
 * after the agent saw part of the answer is still a lost call. Three real engine-sim processes, a
 * real gateway and Redis, the OpenAI SDK as agent; no health round comes during the test.
 */
import type { CompletionRecord } from "@rollgate/protocol";
import type OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { stopChild } from "../support/apps.js";
import { EngineFleet, type FleetSession } from "../support/engine-fleet.js";
import { poll } from "../support/poll.js";

const fleet = new EngineFleet("dead-engine-retry", 3, 5);
const { api } = fleet;
const open = fleet.open;
const oa = fleet.openai;

beforeAll(fleet.start, 60_000);
afterAll(fleet.stop);

/** Sessions until one is on `engine` (sessions go to the least-loaded rank). */
const openOn = async (engine: number): Promise<FleetSession> => {
  for (let i = 0; i < 12; i++) {
    const s = await open();
    if (s.engine === engine) return s;
  }
  throw new Error(`no session was assigned to engine ${engine}`);
};
const script = (text: string, tokens = 0) => `go\n#sim: ${JSON.stringify([{ text, ...(tokens ? { tokens } : {}) }])}`;
const fault = (engine: number, body: Record<string, unknown>) =>
  fetch(`${fleet.engines[engine]!.ready}/sim/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
const records = async (s: FleetSession) =>
  (await poll(async () => (await api(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[], (r) => r.length >= 2, 5_000, 20)) as CompletionRecord[];
const lostCount = async (s: FleetSession) => (await api(`/v1/sessions/${s.id}`)).body.lost_calls.count as number;

/**
 * The session's two records are one token-exact trace: the second call's prompt is the first
 * call's prompt and answer token for token, and the trajectory merges them with no lost call.
 */
async function expectWholeTrajectory(s: FleetSession, recs: CompletionRecord[]): Promise<void> {
  const [first, second] = recs;
  const base = [...first!.prompt_ids, ...first!.output_ids];
  expect(second!.prompt_ids.slice(0, base.length)).toEqual(base);
  const traj = (await api(`/v1/sessions/${s.id}/trajectory`)).body;
  expect(traj.traces).toHaveLength(1);
  expect(traj.traces[0].completion_ids).toEqual([first!.id, second!.id]);
  expect(traj.stats.lost_calls.count).toBe(0);
  expect(traj.stats.failed_calls).toEqual([]);
}

/** The calls made again elsewhere, over every failed rank and reason. */
const retriedMetric = async () => {
  const text = (await api("/metrics")).body as string;
  return text
    .split("\n")
    .filter((l) => l.startsWith("rollgate_engine_calls_retried_total{"))
    .reduce((sum, l) => sum + Number(l.split(" ").at(-1)), 0);
};

describe("a call whose engine is dead before it answered anything", () => {
  it("a stream cut after the agent saw part of its answer is still a lost call", async () => {
    const s = await openOn(0);
    await fault(0, { mode: "disconnect", after_tokens: 3 });
    try {
      const stream = await oa(s).chat.completions.create({ model: "m", stream: true, messages: [{ role: "user", content: script("cut ".repeat(20), 30) }] });
      let text = "";
      const failed = await (async () => {
        for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
      })().catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(Error);
      expect(text.length).toBeGreaterThan(0);
    } finally {
      await fault(0, { mode: "none" });
    }
    expect(await lostCount(s)).toBe(1);
    expect((await api(`/v1/sessions/${s.id}/completions`)).body.completions).toHaveLength(0);
  }, 30_000);

  it("a stream cut before its first token is answered from another rank: no lost call, the record says where it came from, the trace is token-exact", async () => {
    const s = await openOn(0);
    const before = await retriedMetric();
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: script("one") }];
    const first = await oa(s).chat.completions.create({ model: "m", messages });
    messages.push(first.choices[0]!.message, { role: "user", content: script("two words") });
    await fault(0, { mode: "disconnect", after_tokens: 0 });
    let text = "";
    try {
      const stream = await oa(s).chat.completions.create({ model: "m", stream: true, messages });
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
    } finally {
      await fault(0, { mode: "none" });
    }
    expect(text).toBe("two words");
    expect(await lostCount(s)).toBe(0);
    const recs = await records(s);
    expect(recs.map((r) => r.seq)).toEqual([0, 1]);
    expect(recs[0]).toMatchObject({ engine: fleet.engines[0]!.ready });
    expect(recs[1]!.engine).not.toBe(fleet.engines[0]!.ready);
    expect(recs[1]).toMatchObject({ rerouted_from: { engine: 0, dp_rank: 0 } });
    await expectWholeTrajectory(s, recs);
    expect(await retriedMetric()).toBe(before + 1);
  }, 30_000);

  it("a call to a killed engine is answered from another rank: no lost call, the record says where it came from, the trace is token-exact", async () => {
    const s = await openOn(1);
    const before = await retriedMetric();
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: script("one") }];
    const first = await oa(s).chat.completions.create({ model: "m", messages });
    messages.push(first.choices[0]!.message, { role: "user", content: script("three") });
    await stopChild(fleet.engines[1]!.proc, 5_000);
    const res = await oa(s).chat.completions.create({ model: "m", messages });
    expect(res.choices[0]!.message.content).toBe("three");
    expect(await lostCount(s)).toBe(0);
    const recs = await records(s);
    expect(recs.map((r) => r.seq)).toEqual([0, 1]);
    expect(recs[0]).toMatchObject({ engine: fleet.engines[1]!.ready });
    expect(recs[1]!.engine).not.toBe(fleet.engines[1]!.ready);
    expect(recs[1]).toMatchObject({ rerouted_from: { engine: 1, dp_rank: 0 } });
    await expectWholeTrajectory(s, recs);
    expect(await retriedMetric()).toBe(before + 1);
    // The dead rank was probed at once and drained: the next session is not put on it.
    await poll(async () => (await api("/admin/engines")).body.engines[1].ranks[0].healthy as boolean, (h) => h === false, 15_000, 100);
  }, 30_000);

  it("a call to a rank that answers 503 (down) is answered from another rank, token-exact, with no lost call", async () => {
    // Engine 0 came back after the cut above (its probe answers again); engine 1 is dead.
    await poll(async () => (await api("/admin/engines")).body.engines[0].ranks[0].healthy as boolean, (h) => h === true, 15_000, 100);
    const s = await openOn(0);
    const before = await retriedMetric();
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: script("one") }];
    const first = await oa(s).chat.completions.create({ model: "m", messages });
    messages.push(first.choices[0]!.message, { role: "user", content: script("four") });
    await fault(0, { mode: "down" });
    try {
      const res = await oa(s).chat.completions.create({ model: "m", messages });
      expect(res.choices[0]!.message.content).toBe("four");
    } finally {
      await fault(0, { mode: "none" });
    }
    expect(await lostCount(s)).toBe(0);
    const recs = await records(s);
    expect(recs.map((r) => r.seq)).toEqual([0, 1]);
    expect(recs[1]).toMatchObject({ engine: fleet.engines[2]!.ready, rerouted_from: { engine: 0, dp_rank: 0 } });
    await expectWholeTrajectory(s, recs);
    expect(await retriedMetric()).toBe(before + 1);
  }, 30_000);
});
