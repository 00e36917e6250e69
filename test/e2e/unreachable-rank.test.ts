/**
 * An engine that dies mid-run, found by a call before any health round (ROLLGATE_HEALTH_INTERVAL_S
 * is long here, as 10 s is against a batch): the call's failure has its rank probed at once, the
 * probe confirms it and the rank is drained, so the other sessions on it move to the healthy
 * engine on their next call instead of losing calls (and their rollouts) until the next round.
 * Two real engine-sim processes (one killed), a real gateway and Redis, the OpenAI SDK as agent.
 */
import type { CompletionRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const prefix = uniquePrefix("unreachable-rank");
let engines: StartedChild[] = [];
let gw: StartedChild;
const api = apiClient(() => gw.ready);

beforeAll(async () => {
  engines = await Promise.all([0, 1].map(() => startApp("engine-sim", ["--port", "0", "--dp", "1", "--tpot-ms", "20"], {})));
  gw = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify(engines.map((e) => ({ kind: "vllm", url: e.ready, dp_size: 1, profile: "qwen3" }))),
    // No periodic round comes during the test: only the failed call can have the rank probed.
    ROLLGATE_HEALTH_INTERVAL_S: "600",
    ROLLGATE_HEALTH_FAILURES: "2",
  });
}, 60_000);

afterAll(async () => {
  await stopChild(gw.proc, 5_000);
  await Promise.all(engines.map((e) => stopChild(e.proc, 5_000)));
  await dropPrefix(prefix);
});

type Sess = { id: string; token: string; engine: number };
const open = async (): Promise<Sess> => {
  const s = (await api("/v1/sessions", { body: {} })).body as { id: string; token: string };
  return { ...s, engine: (await api(`/v1/sessions/${s.id}`)).body.assignment.engine as number };
};
const oa = (s: Sess) => new OpenAI({ baseURL: `${gw.ready}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });
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
        if (first) engines[0]!.proc.kill("SIGKILL");
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
      expect(recs.at(-1)).toMatchObject({ engine: engines[1]!.ready, rerouted_from: { engine: 0, dp_rank: 0 } });
      expect((await api(`/v1/sessions/${s.id}`)).body.lost_calls.count).toBe(0);
    }
    // The one call that was on the engine when it died is lost (its rollout is not scored).
    expect((await api(`/v1/sessions/${dying[0]!.id}`)).body.lost_calls.count).toBe(1);
    for (const s of healthy) expect((await oa(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script("three") }] })).choices[0]!.message.content).toBe("three");
  }, 60_000);
});
