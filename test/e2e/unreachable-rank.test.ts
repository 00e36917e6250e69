/**
 * An engine that dies mid-run, found by a call before any health round (ROLLGATE_HEALTH_INTERVAL_S
 * is long here, as 10 s is against a batch): the call's failure has its rank probed at once, the
 * probe confirms it and the rank is drained, so the other sessions on it move to the healthy
 * engine on their next call instead of losing calls (and their rollouts) until the next round.
 * Two real engine-sim processes (one killed), a real gateway and Redis, the OpenAI SDK as agent.
 */
import type { CompletionRecord } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EngineFleet } from "../support/engine-fleet.js";
import { poll } from "../support/poll.js";

const fleet = new EngineFleet("unreachable-rank", 2, 20);
const { api } = fleet;
const open = fleet.open;
const oa = fleet.openai;

beforeAll(fleet.start, 60_000);
afterAll(fleet.stop);

const script = (text: string, tokens = 0) => `go\n#sim: ${JSON.stringify([{ text, ...(tokens ? { tokens } : {}) }])}`;

describe("a call that finds its engine unreachable", () => {
  it("has its rank probed and drained at once: the rank's other sessions move to the healthy engine on their next call, losing no call", async () => {
    const sessions = await Promise.all(Array.from({ length: 4 }, open));
    const dying = sessions.filter((s) => s.engine === 0);
    const healthy = sessions.filter((s) => s.engine === 1);
    expect(dying.length).toBeGreaterThanOrEqual(2);
    expect(healthy.length).toBeGreaterThanOrEqual(1);
    for (const s of sessions) expect((await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("one") }] })).choices[0]!.message.content).toBe("one");

    // Engine 0 is killed while it streams an answer.
    const stream = await oa(dying[0]!).chat.completions.create({ model: "m", stream: true, messages: [{ role: "user", content: script("long ".repeat(100), 400) }] });
    const failed = (async () => {
      let first = true;
      for await (const _chunk of stream) {
        if (first) fleet.engines[0]!.proc.kill("SIGKILL");
        first = false;
      }
    })().catch((e: unknown) => e);
    expect(await failed).toBeInstanceOf(Error);

    // The failed call had its rank probed: drained long before any round.
    const drained = await poll(async () => (await api("/admin/engines")).body.engines[0].ranks[0].healthy as boolean, (h) => h === false, 15_000, 100);
    expect(drained).toBe(false);

    // The rank's other sessions go on, on the healthy engine; the record says where they came from.
    for (const s of dying.slice(1)) {
      const res = await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("two") }] });
      expect(res.choices[0]!.message.content).toBe("two");
      const recs = (await api(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[];
      expect(recs.at(-1)).toMatchObject({ engine: fleet.engines[1]!.ready, rerouted_from: { engine: 0, dp_rank: 0 } });
      expect((await api(`/v1/sessions/${s.id}`)).body.lost_calls.count).toBe(0);
    }
    // The one call that was on the engine when it died is lost (its rollout is not scored).
    expect((await api(`/v1/sessions/${dying[0]!.id}`)).body.lost_calls.count).toBe(1);
    for (const s of healthy) expect((await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("three") }] })).choices[0]!.message.content).toBe("three");
  }, 60_000);
});
