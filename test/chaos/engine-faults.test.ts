/**
 * Chaos: an engine rank going down, slow, erroring, or dropping the connection mid-stream
 * (engine-sim fault injection), while agents on the OpenAI and Anthropic SDKs call through the
 * gateway. Health checks drain a down rank and its sessions fail over (the record says
 * `rerouted_from`; a call the down rank answered 503 is made again on the other); a slow rank only slows; errors and mid-stream disconnects reach the agent as
 * errors in its own protocol, and nothing half-done is recorded (the session's seq numbering shows
 * the failed call).
 */
import Anthropic from "@anthropic-ai/sdk";
import type { CompletionRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const prefix = uniquePrefix("chaos-engine");
let engine: StartedChild;
let gw: StartedChild;
const api = apiClient(() => gw.ready);

beforeAll(async () => {
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "2", "--tpot-ms", "5"], {});
  gw = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0.3",
    ROLLGATE_HEALTH_FAILURES: "2",
  });
}, 60_000);

afterAll(async () => {
  await stopChild(gw.proc, 5_000);
  await stopChild(engine.proc, 5_000);
  await dropPrefix(prefix);
});

const fault = (body: Record<string, unknown>) =>
  fetch(`${engine.ready}/sim/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
afterEach(async () => {
  await fault({ mode: "none" });
  await poll(async () => (await api("/admin/engines")).body.engines[0].ranks.every((r: { healthy: boolean }) => r.healthy), (ok) => ok, 10_000, 200);
});

type Sess = { id: string; token: string };
const open = async (): Promise<Sess & { rank: number }> => {
  const s = (await api("/v1/sessions", { body: {} })).body as Sess;
  return { ...s, rank: (await api(`/v1/sessions/${s.id}`)).body.assignment.dp_rank as number };
};
const oa = (s: Sess) => new OpenAI({ baseURL: `${gw.ready}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });
const an = (s: Sess) => new Anthropic({ baseURL: `${gw.ready}/s/${s.id}`, apiKey: s.token, maxRetries: 0 });
const script = (text: string, tokens = 0) => `go\n#sim: ${JSON.stringify([{ text, ...(tokens ? { tokens } : {}) }])}`;
const records = async (s: Sess) => (await api(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[];

describe("engine rank faults", () => {
  it("down: the rank is drained, its sessions' next calls fail over to the other rank, and the record notes it", async () => {
    const sessions = await Promise.all(Array.from({ length: 6 }, open));
    const rank = sessions[0]!.rank;
    const onRank = sessions.filter((s) => s.rank === rank);
    for (const s of onRank) expect((await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("one") }] })).choices[0]!.message.content).toBe("one");
    await fault({ rank, mode: "down" });
    // A call before the health checks drain it finds the rank answering 503 (it took nothing of the
    // call on): the call is made again on the other rank, and loses nothing. After the drain, the
    // session would be moved before its call: either way the record says where it came from.
    const early = await oa(onRank[0]!).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("early") }] });
    expect(early.choices[0]!.message.content).toBe("early");
    expect((await records(onRank[0]!)).at(-1)).toMatchObject({ dp_rank: 1 - rank, rerouted_from: { engine: 0, dp_rank: rank } });
    expect((await api(`/v1/sessions/${onRank[0]!.id}`)).body.lost_calls.count).toBe(0);
    await poll(async () => (await api("/admin/engines")).body.engines[0].ranks[rank].healthy, (h) => h === false, 10_000, 100);
    for (const s of onRank.slice(1)) {
      const res = await an(s).messages.create({ model: "m", max_tokens: 64, messages: [{ role: "user", content: script("two") }] });
      expect(res.content[0]).toMatchObject({ type: "text", text: "two" });
      const recs = await records(s);
      expect(recs.at(-1)).toMatchObject({ dp_rank: 1 - rank, rerouted_from: { engine: 0, dp_rank: rank } });
    }
  }, 60_000);

  it("slow: streamed calls on a slow rank only take longer; none fails", async () => {
    const sessions = await Promise.all(Array.from({ length: 4 }, open));
    const rank = sessions[0]!.rank;
    await fault({ rank, mode: "slow", delay_ms: 40 });
    const t0 = Date.now();
    const texts = await Promise.all(
      sessions.map(async (s) => {
        const stream = await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("slow", 10) }], stream: true });
        let text = "";
        for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
        return text;
      }),
    );
    for (const t of texts) expect(t).toMatch(/^slow/);
    expect(Date.now() - t0).toBeGreaterThan(300);
    for (const s of sessions) expect((await records(s)).length).toBe(1);
  }, 60_000);

  it("erroring: calls fail clearly in each protocol; nothing is recorded for them, and the seq numbering shows the gap", async () => {
    const s = await open();
    await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("before") }] });
    await fault({ rank: s.rank, mode: "error", error_rate: 1 });
    const e1 = await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("x") }] }).catch((e: unknown) => e);
    expect(e1).toBeInstanceOf(OpenAI.APIError);
    expect((e1 as InstanceType<typeof OpenAI.APIError>).status).toBeGreaterThanOrEqual(500);
    expect((e1 as InstanceType<typeof OpenAI.APIError>).error).toMatchObject({ type: expect.any(String), message: expect.any(String) });
    const e2 = await an(s).messages.create({ model: "m", max_tokens: 16, messages: [{ role: "user", content: script("x") }] }).catch((e: unknown) => e);
    expect(e2).toBeInstanceOf(Anthropic.APIError);
    expect((e2 as InstanceType<typeof Anthropic.APIError>).status).toBeGreaterThanOrEqual(500);
    await fault({ rank: s.rank, mode: "none" });
    await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("after") }] });
    const recs = await records(s);
    expect(recs.map((r) => r.message.content)).toEqual(["before", "after"]);
    // seq 1 and 2 went to the failed calls.
    expect(recs.map((r) => r.seq)).toEqual([0, 3]);
    const traj = await api(`/v1/sessions/${s.id}/trajectory`);
    expect(traj.status).toBe(200);
  }, 60_000);

  it("disconnect mid-stream: the streamed answer ends with an error event in the agent's protocol; no record", async () => {
    const s = await open();
    await fault({ rank: s.rank, mode: "disconnect", after_tokens: 3 });
    const openaiErr = await (async () => {
      const stream = await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("cut", 30) }], stream: true });
      for await (const chunk of stream) void chunk;
    })().catch((e: unknown) => e);
    expect(openaiErr).toBeInstanceOf(Error);
    expect(String((openaiErr as Error).message)).toBeTruthy();
    const anthropicErr = await (async () => {
      const stream = an(s).messages.stream({ model: "m", max_tokens: 64, messages: [{ role: "user", content: script("cut", 30) }] });
      await stream.finalMessage();
    })().catch((e: unknown) => e);
    expect(anthropicErr).toBeInstanceOf(Error);
    expect(await records(s)).toEqual([]);
  }, 60_000);
});
