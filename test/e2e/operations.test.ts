/**
 * Operations on real processes and real Redis: two gateway replicas sharing sessions, inference
 * pause/resume with weight versions, and a rank that goes down being drained.
 */
import type { CompletionRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { getTokenizer } from "@rollgate/engine-sim";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const prefix = uniquePrefix("ops");
let engine: StartedChild;
let gwA: StartedChild;
let gwB: StartedChild;
const a = apiClient(() => gwA.ready);
const b = apiClient(() => gwB.ready);

async function gateway(extra: Record<string, string> = {}) {
  return startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0.3",
    ROLLGATE_HEALTH_FAILURES: "1",
    ...extra,
  });
}

beforeAll(async () => {
  // Slow enough generation (30 ms a token) that calls are still running when a pause arrives.
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "2", "--tpot-ms", "30"], {});
  gwA = await gateway();
  gwB = await gateway();
}, 60_000);

afterAll(async () => {
  await Promise.all([gwA, gwB].map((g) => g && stopChild(g.proc)));
  await stopChild(engine.proc);
  await dropPrefix(prefix);
});

const client = (base: string, s: { id: string; token: string }) => new OpenAI({ baseURL: `${base}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });
const script = (steps: unknown[]) => `go\n#sim: ${JSON.stringify(steps)}`;

describe("stateless replicas", () => {
  it("serve one session interchangeably: alternate calls through two replicas give one coherent trajectory", async () => {
    const s = (await a("/v1/sessions", { body: {} })).body as { id: string; token: string };
    const steps = [{ tool_calls: [{ name: "ls", arguments: {} }] }, { tool_calls: [{ name: "ls", arguments: { a: 1 } }] }, { text: "done" }];
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: script(steps) }];
    const tools: OpenAI.ChatCompletionTool[] = [{ type: "function", function: { name: "ls", parameters: { type: "object" } } }];
    for (let turn = 0; turn < 3; turn++) {
      const via = turn % 2 === 0 ? gwA.ready : gwB.ready;
      const res = await client(via, s).chat.completions.create({ model: "m", messages, tools });
      const msg = res.choices[0]!.message;
      messages.push(msg);
      for (const call of msg.tool_calls ?? []) messages.push({ role: "tool", tool_call_id: call.id, content: "file.txt" });
    }
    expect(messages.at(-1)).toMatchObject({ role: "assistant", content: "done" });
    // An agent is answered before its call's record is stored, and an open session's trajectory
    // waits only for the records its own replica is writing: the last call went through A.
    await poll(async () => (await b(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[], (r) => r.length === 3, 5_000, 20);
    const traj = (await b(`/v1/sessions/${s.id}/trajectory`)).body;
    expect(traj.traces).toHaveLength(1);
    expect(traj.traces[0].completion_ids).toHaveLength(3);
    const recs = (await a(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[];
    expect(recs.map((r) => r.seq)).toEqual([0, 1, 2]);
    expect(new Set(recs.map((r) => r.dp_rank)).size).toBe(1);
  });
});

describe("pause, resume and weight versions", () => {
  it("drain: calls in flight finish, new calls wait (not fail) through the pause, and carry the new weight version", async () => {
    await a("/admin/weights", { body: { version: "v1" } });
    const s = (await a("/v1/sessions", { body: {} })).body as { id: string; token: string };
    const long = script([{ text: "x", tokens: 40 }]);
    // One non-streamed and one streamed call in flight on different replicas.
    const inflight = [
      client(gwA.ready, s)
        .chat.completions.create({ model: "m", messages: [{ role: "user", content: long }] })
        .then((r) => r.choices[0]!.message.content ?? ""),
      (async () => {
        const stream = await client(gwB.ready, s).chat.completions.create({ model: "m", messages: [{ role: "user", content: long }], stream: true });
        let text = "";
        for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
        return text;
      })(),
    ];
    await new Promise((r) => setTimeout(r, 300));
    // The engines view counts both calls on the session's rank, whichever replica holds them.
    const rank = (await a(`/v1/sessions/${s.id}`)).body.assignment.dp_rank as number;
    const during = (await a("/admin/engines")).body.engines[0].ranks;
    expect(during[rank]).toMatchObject({ inflight: 2, sessions: expect.any(Number) });
    expect(during[1 - rank].inflight).toBe(0);
    const paused = (await b("/admin/inference/pause", { body: { mode: "drain", timeout_s: 20 } })).body;
    expect(paused).toMatchObject({ paused: true, mode: "drain", drained: true });
    expect(paused.inflight_at_pause).toBe(2);
    expect(paused.engines[0]).toMatchObject({ ok: true });
    const [first, streamed] = await Promise.all(inflight);
    expect(first).toMatch(/^x( ok)+$/);
    expect(streamed).toMatch(/^x( ok)+$/);

    // A call made while paused waits...
    let settled = false;
    const waiting = client(gwA.ready, s)
      .chat.completions.create({ model: "m", messages: [{ role: "user", content: script([{ text: "after" }]) }] })
      .finally(() => (settled = true));
    await new Promise((r) => setTimeout(r, 800));
    expect(settled).toBe(false);
    // ...the trainer updates the weights, and resumes.
    await b("/admin/weights", { body: { version: "v2" } });
    const resumed = (await a("/admin/inference/resume", { body: {} })).body;
    expect(resumed).toMatchObject({ paused: false, was_paused: true });
    expect((await waiting).choices[0]!.message.content).toBe("after");

    const recs = (await a(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[];
    expect(recs.map((r) => r.weight_version)).toEqual(["v1", "v1", "v2"]);
    // Replica A served two of the calls: its recent latency on the rank covers them.
    // In-flight counts are reported within a few ms of a call's end.
    const after = await poll(async () => (await a("/admin/engines")).body.engines[0].ranks[rank], (r) => r.inflight === 0, 2_000, 20);
    expect(after.inflight).toBe(0);
    expect(after.recent_calls.calls).toBeGreaterThanOrEqual(2);
    expect(after.recent_calls.p95_ms).toBeGreaterThanOrEqual(after.recent_calls.p50_ms);
  }, 60_000);

  it("abort: calls frozen by the pause go on on the new weights (vLLM keep); agents see one answer; every replica stamps each token", async () => {
    await a("/admin/weights", { body: { version: "v2" } });
    const s = (await a("/v1/sessions", { body: {} })).body as { id: string; token: string };
    const messages = (tag: string) => [{ role: "user" as const, content: script([{ text: tag, tokens: 60 }]) }];
    // One non-streamed call (replica A) and one stream (replica B) in flight; the pause comes via B.
    const plain = client(gwA.ready, s).chat.completions.create({ model: "m", messages: messages("y") });
    const streamed = (async () => {
      const stream = await client(gwB.ready, s).chat.completions.create({ model: "m", messages: messages("z"), stream: true, stream_options: { include_usage: true } });
      let text = "";
      const finishes: string[] = [];
      let usage: OpenAI.CompletionUsage | undefined;
      for await (const c of stream) {
        text += c.choices[0]?.delta.content ?? "";
        if (c.choices[0]?.finish_reason) finishes.push(c.choices[0].finish_reason);
        usage = c.usage ?? usage;
      }
      return { text, finishes, usage };
    })();
    await new Promise((r) => setTimeout(r, 600));
    const paused = (await b("/admin/inference/pause", { body: { mode: "abort", timeout_s: 5 } })).body;
    expect(paused).toMatchObject({ mode: "abort", drained: true, inflight_at_pause: 2, frozen: 2 });
    expect(paused.engines[0]).toMatchObject({ ok: true, plan: "keep", mode: "keep" });
    await b("/admin/weights", { body: { version: "v3" } });
    await b("/admin/inference/resume", { body: {} });

    const res = await plain;
    const st = await streamed;
    expect(res.choices[0]!.message.content).toMatch(/^y( ok)+$/);
    expect(res.choices[0]!.finish_reason).toBe("stop");
    expect(st.text).toMatch(/^z( ok)+$/);
    // The pause never reached the agent: one finish, and usage counts the whole answer.
    expect(st.finishes).toEqual(["stop"]);
    expect(st.usage?.completion_tokens).toBe(60);

    // An open session's readers wait only for their own replica's record writes (docs/architecture.md):
    // the stream's record is written by B just after its last event, so A may read before it lands.
    const recs = await poll(async () => (await a(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[], (r) => r.length >= 2, 2_000, 20);
    expect(recs).toHaveLength(2);
    const tok = getTokenizer();
    for (const r of recs) {
      // One record per call, 60 tokens: the first ones sampled under v2, the rest under v3; the engine went on, nothing was cut.
      expect(r).toMatchObject({ weight_version: "v3" });
      expect(r.continued_after_pause).toBeUndefined();
      expect(r.output_ids).toHaveLength(60);
      const versions = r.output_weight_versions!;
      const before = versions.indexOf("v3");
      expect(before).toBeGreaterThan(0);
      expect(versions.slice(0, before).every((v) => v === "v2")).toBe(true);
      expect(versions.slice(before).every((v) => v === "v3")).toBe(true);
      expect(r.prompt_ids.length).toBe(r.usage.prompt_tokens);
      // The tokens decode to exactly what the agent got.
      expect(tok.decode(r.output_ids, true)).toBe(r.message.content);
    }
    expect(new Set(recs.map((r) => r.message.content))).toEqual(new Set([res.choices[0]!.message.content, st.text]));
    // The trajectory stamps every token with its own version.
    const traj = (await a(`/v1/sessions/${s.id}/trajectory?builder=per_request`)).body;
    for (const t of traj.traces) {
      const trained = (t.weight_versions as (string | null)[]).filter((_, i) => t.loss_mask[i] === 1);
      expect(new Set(trained)).toEqual(new Set(["v2", "v3"]));
    }
    expect(traj.stats.weight_versions).toEqual(["v2", "v3"]);
    expect(traj.stats.traces_with_weight_change).toBe(2);
  }, 60_000);

  it("a replica started while paused is paused too", async () => {
    await a("/admin/inference/pause", { body: { mode: "drain", timeout_s: 1 } });
    const late = await gateway();
    const api = apiClient(() => late.ready);
    try {
      expect((await api("/admin/inference")).body.paused).toMatchObject({ mode: "drain" });
      await a("/admin/inference/resume", { body: {} });
      await poll(async () => (await api("/admin/inference")).body.paused, (p) => p === null, 5_000);
      expect((await api("/admin/inference")).body.paused).toBeNull();
    } finally {
      await stopChild(late.proc);
    }
  }, 30_000);

  it("rejects a bad pause body and an empty weight version", async () => {
    expect((await a("/admin/inference/pause", { body: { mode: "freeze" } })).status).toBe(400);
    const w = await a("/admin/weights", { body: { version: "" } });
    expect(w.status).toBe(400);
    expect(w.body.error.message).toContain("version");
  });
});

describe("engine rank health", () => {
  it("drains a rank that goes down: its session moves to a healthy rank and the record says so", async () => {
    const s = (await a("/v1/sessions", { body: {} })).body as { id: string; token: string };
    const rank = (await a(`/v1/sessions/${s.id}`)).body.assignment.dp_rank as number;
    const res0 = await client(gwA.ready, s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script([{ text: "one" }]) }] });
    expect(res0.choices[0]!.message.content).toBe("one");
    await fetch(`${engine.ready}/sim/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rank, mode: "down" }) });
    try {
      const engines = await poll(
        async () => (await a("/admin/engines")).body,
        (e) => e.engines[0].ranks[rank].healthy === false,
        10_000,
      );
      expect(engines.engines[0].ranks[rank].healthy).toBe(false);
      const res1 = await client(gwA.ready, s).chat.completions.create({ model: "m", messages: [{ role: "user", content: script([{ text: "two" }]) }] });
      expect(res1.choices[0]!.message.content).toBe("two");
      const recs = (await a(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[];
      expect(recs[1]).toMatchObject({ dp_rank: 1 - rank, rerouted_from: { engine: 0, dp_rank: rank } });
      expect((await a(`/v1/sessions/${s.id}`)).body.assignment.dp_rank).toBe(1 - rank);
      // New sessions avoid the down rank.
      const t = (await a("/v1/sessions", { body: {} })).body as { id: string };
      expect((await a(`/v1/sessions/${t.id}`)).body.assignment.dp_rank).toBe(1 - rank);
    } finally {
      await fetch(`${engine.ready}/sim/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rank, mode: "none" }) });
    }
    const back = await poll(async () => (await a("/admin/engines")).body, (e) => e.engines[0].ranks[rank].healthy === true, 10_000);
    expect(back.engines[0].ranks[rank].healthy).toBe(true);
  }, 60_000);
});
