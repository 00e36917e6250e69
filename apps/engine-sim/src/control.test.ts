import { setTimeout as sleep } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { request } from "undici";
import { buildEngineSim } from "./app.js";
import { simLogprob } from "./logprobs.js";
import { IM_END_ID, getTokenizer } from "./index.js";

// Engine behaviour shared by both kinds: prefix cache per rank (cache_salt), pause/resume modes
// (vLLM /pause?mode=abort|wait|keep, PR #28037 + the mode= API of vllm/entrypoints/serve/rlhf;
// SGLang /pause_generation {mode: abort|in_place|retract}), weight versions, batch-limit queueing,
// and fault injection through the sim-only /sim/faults route.

const tok = getTokenizer();
const LONG = '#sim: [{"text":"go","tokens":20}]';

async function post(app: FastifyInstance, url: string, payload: object = {}, headers: Record<string, string> = {}) {
  return app.inject({ method: "POST", url, payload: JSON.stringify(payload), headers: { "content-type": "application/json", ...headers } });
}
const get = (app: FastifyInstance, url: string) => app.inject({ method: "GET", url });
const stats = async (app: FastifyInstance) => (await get(app, "/sim/stats")).json();

/** Resolves when `pred` holds (polling), so tests wait for engine state rather than fixed sleeps. */
async function until(pred: () => Promise<boolean> | boolean, ms = 3000): Promise<void> {
  const t0 = Date.now();
  while (!(await pred())) {
    if (Date.now() - t0 > ms) throw new Error("timed out waiting");
    await sleep(5);
  }
}

describe("prefix cache per rank (vLLM usage.prompt_tokens_details.cached_tokens, SGLang meta_info.cached_tokens)", () => {
  const prompt = `${"cache me ".repeat(40)}\n#sim: [{"text":"ok"}]`;

  it("vLLM completions: a repeat on the same rank hits (whole 16-token blocks); another rank or another cache_salt misses", async () => {
    const sim = buildEngineSim({ dpSize: 2 });
    const n = tok.encode(prompt).length;
    const on = (rank: string, extra: object = {}) => post(sim, "/v1/completions", { prompt, ...extra }, { "x-data-parallel-rank": rank });
    expect((await on("0")).json().usage.prompt_tokens_details.cached_tokens).toBe(0);
    expect((await on("0")).json().usage.prompt_tokens_details.cached_tokens).toBe(Math.floor((n - 1) / 16) * 16);
    expect((await on("1")).json().usage.prompt_tokens_details.cached_tokens).toBe(0);
    expect((await on("0", { cache_salt: "tenant-a" })).json().usage.prompt_tokens_details.cached_tokens).toBe(0);
    expect((await on("0", { cache_salt: "tenant-a" })).json().usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
    // vLLM's /reset_prefix_cache empties every rank.
    expect((await post(sim, "/reset_prefix_cache")).statusCode).toBe(200);
    expect((await on("0")).json().usage.prompt_tokens_details.cached_tokens).toBe(0);
    await sim.close();
  });

  it("SGLang /generate: same rank hit, other rank miss; /flush_cache clears", async () => {
    const sim = buildEngineSim({ kind: "sglang", dpSize: 2 });
    const gen = (rank: number) => post(sim, "/generate", { text: prompt, routed_dp_rank: rank });
    expect((await gen(1)).json().meta_info.cached_tokens).toBe(0);
    expect((await gen(1)).json().meta_info.cached_tokens).toBeGreaterThan(0);
    expect((await gen(0)).json().meta_info.cached_tokens).toBe(0);
    const flushed = await post(sim, "/flush_cache");
    expect(flushed.statusCode).toBe(200);
    expect(flushed.body).toMatch(/^Cache flushed\./);
    expect((await gen(1)).json().meta_info.cached_tokens).toBe(0);
    await sim.close();
  });
});

describe("vLLM pause / resume (/pause?mode=…, /resume, /is_paused)", () => {
  it("abort: in-flight requests end with finish_reason 'abort' and their partial tokens; new requests wait for /resume", async () => {
    const sim = buildEngineSim({ tpotMs: 10 });
    const inflight = post(sim, "/v1/chat/completions", { messages: [{ role: "user", content: LONG }], return_token_ids: true });
    await until(async () => (await stats(sim)).ranks[0].running === 1);
    await sleep(40);
    expect((await post(sim, "/pause?mode=abort")).json()).toEqual({ status: "paused" });
    const j = (await inflight).json();
    expect(j.choices[0]).toMatchObject({ finish_reason: "abort", stop_reason: null });
    const n = j.choices[0].token_ids.length;
    expect(n).toBeGreaterThan(0);
    expect(n).toBeLessThan(20);
    expect(j.usage.completion_tokens).toBe(n);
    expect(tok.decode(j.choices[0].token_ids)).toBe(j.choices[0].message.content);

    expect((await get(sim, "/is_paused")).json()).toEqual({ is_paused: true });
    let done = false;
    const held = post(sim, "/v1/completions", { prompt: '#sim: [{"text":"later"}]' }).then((r) => {
      done = true;
      return r;
    });
    await sleep(60);
    expect(done).toBe(false);
    expect((await post(sim, "/resume")).json()).toEqual({ status: "resumed" });
    expect((await held).json().choices[0]).toMatchObject({ text: "later", finish_reason: "stop" });
    expect((await get(sim, "/is_paused")).json()).toEqual({ is_paused: false });
    expect((await post(sim, "/pause?mode=nope")).statusCode).toBe(400);
    await sim.close();
  });

  it("abort while streaming: a last chunk with finish_reason 'abort', then [DONE]", async () => {
    const sim = buildEngineSim({ tpotMs: 10 });
    const inflight = post(sim, "/v1/completions", { prompt: LONG, stream: true, max_tokens: 30 });
    await until(async () => (await stats(sim)).ranks[0].running === 1);
    await sleep(30);
    await post(sim, "/pause?mode=abort");
    const body = (await inflight).body;
    const chunks = body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    expect(body.endsWith("data: [DONE]\n\n")).toBe(true);
    expect(chunks.at(-1).choices[0]).toMatchObject({ text: "", finish_reason: "abort", stop_reason: null });
    expect(chunks.length - 1).toBeLessThan(20);
    await post(sim, "/resume");
    await sim.close();
  });

  it("wait: the pause returns once in-flight requests have finished (normally); requests arriving meanwhile wait", async () => {
    const sim = buildEngineSim({ tpotMs: 5 });
    const inflight = post(sim, "/v1/completions", { prompt: LONG, max_tokens: 30, return_token_ids: true });
    await until(async () => (await stats(sim)).ranks[0].running === 1);
    let paused = false;
    const pause = post(sim, "/pause?mode=wait").then((r) => {
      paused = true;
      return r;
    });
    await sleep(5);
    let laterDone = false;
    const later = post(sim, "/v1/completions", { prompt: '#sim: [{"text":"later"}]' }).then((r) => {
      laterDone = true;
      return r;
    });
    const j = (await inflight).json();
    expect(j.choices[0].finish_reason).toBe("stop");
    expect(j.choices[0].token_ids).toHaveLength(20);
    expect((await pause).json()).toEqual({ status: "paused" });
    expect(paused).toBe(true);
    await sleep(30);
    expect(laterDone).toBe(false);
    await post(sim, "/resume");
    expect((await later).json().choices[0].text).toBe("later");
    await sim.close();
  });

  it("keep: in-flight requests freeze and continue after /resume; the later tokens' logprobs follow the weight version set meanwhile", async () => {
    const sim = buildEngineSim({ tpotMs: 8 });
    const inflight = post(sim, "/v1/completions", { prompt: LONG, max_tokens: 30, logprobs: 0, return_token_ids: true });
    await until(async () => (await stats(sim)).ranks[0].running === 1);
    await sleep(40);
    await post(sim, "/pause?mode=keep");
    // Bump through vLLM's /update_weight_version while frozen; /weight_info reports it.
    expect((await post(sim, "/update_weight_version", { new_version: "v2" })).json()).toEqual({ success: true, new_version: "v2" });
    expect((await get(sim, "/weight_info")).json()).toEqual({ weight_version: "v2" });
    await sleep(40);
    expect((await stats(sim)).ranks[0].running).toBe(1);
    await post(sim, "/resume");
    const c = (await inflight).json().choices[0];
    expect(c.finish_reason).toBe("stop");
    const prompt = c.prompt_token_ids as number[];
    const ids = c.token_ids as number[];
    expect(ids).toHaveLength(20);
    const version = c.logprobs.token_logprobs.map((lp: number, i: number) => {
      const ctx = [...prompt, ...ids.slice(0, i)];
      return lp === simLogprob("0", ctx, ids[i]!) ? "0" : lp === simLogprob("v2", ctx, ids[i]!) ? "v2" : "?";
    });
    const k = version.indexOf("v2");
    expect(k).toBeGreaterThan(0);
    expect(version).toEqual([...Array(k).fill("0"), ...Array(20 - k).fill("v2")]);
    await sim.close();
  });

  it("the sim-only POST /sim/weights bumps the version; logprobs change accordingly", async () => {
    const sim = buildEngineSim();
    const ids = tok.encode('#sim: [{"text":"Hi"}]');
    const lp = async () => (await post(sim, "/v1/completions", { prompt: ids, logprobs: 0 })).json().choices[0].logprobs.token_logprobs[0];
    expect(await lp()).toBe(simLogprob("0", ids, tok.encode("Hi")[0]!));
    expect((await post(sim, "/sim/weights")).json()).toEqual({ weight_version: "1" });
    expect(await lp()).toBe(simLogprob("1", ids, tok.encode("Hi")[0]!));
    expect((await post(sim, "/sim/weights", { version: "step-9" })).json()).toEqual({ weight_version: "step-9" });
    expect((await get(sim, "/weight_info")).json()).toEqual({ weight_version: "step-9" });
    await sim.close();
  });
});

describe("SGLang pause (/pause_generation {mode}, /continue_generation)", () => {
  it("abort: finish_reason {type:'abort'} with the partial output_ids", async () => {
    const sim = buildEngineSim({ kind: "sglang", tpotMs: 10 });
    const inflight = post(sim, "/generate", { text: LONG });
    await until(async () => (await stats(sim)).ranks[0].running === 1);
    await sleep(30);
    expect((await post(sim, "/pause_generation", { mode: "abort" })).json()).toEqual({ message: "Generation paused successfully.", status: "ok" });
    const j = (await inflight).json();
    expect(j.meta_info.finish_reason.type).toBe("abort");
    expect(j.output_ids.length).toBeGreaterThan(0);
    expect(j.output_ids.length).toBeLessThan(20);
    expect(j.meta_info.completion_tokens).toBe(j.output_ids.length);
    expect((await post(sim, "/continue_generation")).json()).toEqual({ message: "Generation continued successfully.", status: "ok" });
    await sim.close();
  });

  it("in_place: frozen requests keep running state (flush_cache 400) and continue under the new weight version", async () => {
    const sim = buildEngineSim({ kind: "sglang", tpotMs: 8 });
    const ids = tok.encode(LONG);
    const inflight = post(sim, "/generate", { input_ids: ids, return_logprob: true });
    await until(async () => (await stats(sim)).ranks[0].running === 1);
    await sleep(40);
    await post(sim, "/pause_generation", { mode: "in_place" });
    const flush = await post(sim, "/flush_cache");
    expect(flush.statusCode).toBe(400);
    await post(sim, "/update_weight_version", { new_version: "w2" });
    await post(sim, "/continue_generation");
    const j = (await inflight).json();
    expect(j.meta_info.finish_reason).toEqual({ type: "stop", matched: IM_END_ID });
    expect(j.meta_info.weight_version).toBe("w2");
    const out: number[] = j.output_ids;
    const versions = j.meta_info.output_token_logprobs.map((t: [number, number], i: number) => (t[0] === simLogprob("w2", [...ids, ...out.slice(0, i)], out[i]!) ? "w2" : "default"));
    expect(versions[0]).toBe("default");
    expect(versions.at(-1)).toBe("w2");
    await sim.close();
  });

  it("retract: frozen requests move to waiting and report total_retractions", async () => {
    const sim = buildEngineSim({ kind: "sglang", tpotMs: 8 });
    const inflight = post(sim, "/generate", { text: LONG });
    await until(async () => (await stats(sim)).ranks[0].running === 1);
    await post(sim, "/pause_generation", { mode: "retract" });
    await until(async () => (await stats(sim)).ranks[0].waiting === 1);
    expect((await stats(sim)).ranks[0].running).toBe(0);
    await post(sim, "/continue_generation");
    const j = (await inflight).json();
    expect(j.meta_info.total_retractions).toBe(1);
    expect(j.output_ids).toHaveLength(20);
    await sim.close();
  });
});

describe("batch limit (--max-running): requests beyond it wait; rank choice min(waiting*4 + running)", () => {
  it("one rank, limit 1: two of three concurrent requests wait, then all complete", async () => {
    const sim = buildEngineSim({ maxRunning: 1, tpotMs: 5 });
    const reqs = [0, 1, 2].map(() => post(sim, "/v1/completions", { prompt: '#sim: [{"text":"x","tokens":8}]' }));
    await until(async () => (await stats(sim)).ranks[0].waiting === 2);
    expect((await stats(sim)).ranks[0].running).toBe(1);
    const res = await Promise.all(reqs);
    expect(res.map((r) => r.json().choices[0].finish_reason)).toEqual(["stop", "stop", "stop"]);
    const s = await stats(sim);
    expect(s.ranks[0]).toMatchObject({ running: 0, waiting: 0, served: 3 });
    await sim.close();
  });

  it("two ranks: load balancing spreads concurrent requests", async () => {
    const sim = buildEngineSim({ dpSize: 2, maxRunning: 1, tpotMs: 5 });
    const reqs = [0, 1, 2, 3].map(() => post(sim, "/v1/completions", { prompt: '#sim: [{"text":"x","tokens":6}]' }));
    await until(async () => (await stats(sim)).ranks.every((r: { waiting: number }) => r.waiting === 1));
    const res = await Promise.all(reqs);
    expect(res.map((r) => r.headers["x-sim-dp-rank"]).sort()).toEqual(["0", "0", "1", "1"]);
    await sim.close();
  });
});

describe("fault injection (sim-only POST /sim/faults, GET /sim/faults)", () => {
  it("down: /health 503, pinned requests 503, unpinned ones go to a live rank; all down → 503; none restores", async () => {
    const sim = buildEngineSim({ dpSize: 2 });
    const set = (await post(sim, "/sim/faults", { rank: 1, mode: "down" })).json();
    expect(set.faults).toEqual([
      { rank: 0, mode: "none", error_rate: 0, delay_ms: 0, after_tokens: 0 },
      { rank: 1, mode: "down", error_rate: 0, delay_ms: 0, after_tokens: 0 },
    ]);
    expect((await get(sim, "/sim/faults")).json()).toEqual(set);
    expect((await get(sim, "/health")).statusCode).toBe(503);
    const pinned = await post(sim, "/v1/completions", { prompt: "hi" }, { "x-data-parallel-rank": "1" });
    expect(pinned.statusCode).toBe(503);
    expect(pinned.json().error).toMatchObject({ type: "ServiceUnavailableError", code: 503 });
    const free = await post(sim, "/v1/completions", { prompt: "hi" });
    expect(free.headers["x-sim-dp-rank"]).toBe("0");
    await post(sim, "/sim/faults", { mode: "down" });
    expect((await post(sim, "/v1/chat/completions", { messages: [{ role: "user", content: "hi" }] })).statusCode).toBe(503);
    await post(sim, "/sim/faults", { mode: "none" });
    expect((await get(sim, "/health")).statusCode).toBe(200);
    expect((await post(sim, "/sim/faults", { rank: 5, mode: "down" })).statusCode).toBe(400);
    await sim.close();
  });

  it("error: 500 in the server's envelope at the given rate (deterministic draw)", async () => {
    const sim = buildEngineSim();
    await post(sim, "/sim/faults", { mode: "error" });
    const r = await post(sim, "/v1/completions", { prompt: "hi" });
    expect(r.statusCode).toBe(500);
    expect(r.json().error).toMatchObject({ type: "InternalServerError", code: 500 });
    await post(sim, "/sim/faults", { mode: "error", error_rate: 0.5 });
    const codes = [];
    for (let i = 0; i < 20; i++) codes.push((await post(sim, "/v1/completions", { prompt: "hi", max_tokens: 1 })).statusCode);
    expect(codes).toContain(200);
    expect(codes).toContain(500);
    const sg = buildEngineSim({ kind: "sglang", faults: [{ mode: "error" }] });
    const e = await post(sg, "/generate", { text: "hi" });
    expect(e.statusCode).toBe(500);
    expect(Object.keys(e.json().error)).toEqual(["message"]);
    await sim.close();
    await sg.close();
  });

  it("slow: delay_ms more before every token", async () => {
    const sim = buildEngineSim({ faults: [{ rank: 0, mode: "slow", delay_ms: 40 }] });
    const t0 = Date.now();
    await post(sim, "/v1/completions", { prompt: '#sim: [{"text":"Hi there"}]' });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(3 * 40 - 5);
    await sim.close();
  });

  it("disconnect: the stream is cut (socket destroyed) after N tokens, no [DONE]", async () => {
    const sim = buildEngineSim({ kind: "sglang" });
    await sim.listen({ port: 0, host: "127.0.0.1" });
    const addr = sim.server.address() as { port: number };
    await post(sim, "/sim/faults", { mode: "disconnect", after_tokens: 2 });
    const res = await request(`http://127.0.0.1:${addr.port}/generate`, { method: "POST", body: JSON.stringify({ text: LONG, stream: true }), headers: { "content-type": "application/json" } });
    expect(res.statusCode).toBe(200);
    let text = "";
    let failed = false;
    try {
      for await (const chunk of res.body) text += chunk.toString();
    } catch {
      failed = true;
    }
    expect(failed).toBe(true);
    expect(text.split("\n\n").filter(Boolean)).toHaveLength(2);
    expect(text).not.toContain("[DONE]");
    await sim.close();
  });

  it("finish: the generation ends after N tokens with the given finish reason, on every route (SGLang: {type})", async () => {
    const vllm = buildEngineSim();
    expect((await post(vllm, "/sim/faults", { mode: "finish", finish_reason: "repetition", after_tokens: 3 })).json().faults[0]).toMatchObject({ mode: "finish", after_tokens: 3, finish_reason: "repetition" });
    const chat = (await post(vllm, "/v1/chat/completions", { messages: [{ role: "user", content: LONG }], return_token_ids: true })).json();
    expect(chat.choices[0]).toMatchObject({ finish_reason: "repetition" });
    expect(chat.choices[0].token_ids).toHaveLength(3);
    const streamed = (await post(vllm, "/v1/completions", { prompt: LONG, stream: true, max_tokens: 30 })).body;
    expect(streamed).toMatch(/"finish_reason":"repetition"/);
    await post(vllm, "/sim/faults", { mode: "none" });
    expect((await post(vllm, "/v1/completions", { prompt: LONG, max_tokens: 30 })).json().choices[0].finish_reason).toBe("stop");
    await vllm.close();
    const sglang = buildEngineSim({ kind: "sglang" });
    await post(sglang, "/sim/faults", { mode: "finish", after_tokens: 2 });
    const gen = (await post(sglang, "/generate", { text: LONG })).json();
    expect(gen.meta_info).toMatchObject({ finish_reason: { type: "error" }, completion_tokens: 2 });
    await sglang.close();
  });
});
