/**
 * An engine that cuts a call short on its own (finish_reason "abort") while this gateway did not
 * pause it: the engine's own /pause called by another controller (RL frameworks pause engines
 * directly for a weight sync), an engine abort route, a shutting-down server. The tokens so far are
 * not the policy's whole answer: the agent must not take them as one (OpenAI "abort", Anthropic
 * "end_turn", Gemini "STOP", Responses "completed" all looked like a finished turn), the session
 * must count the call as lost (the rollout is not scored) and nothing is recorded as its answer.
 */
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import Fastify from "fastify";
import type { Session } from "@rollgate/protocol";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { simLogprob } from "@rollgate/engine-sim";
import { listenLocal, startHarness, startSimFleet, type Harness } from "./__fixtures__/harness.js";

let h: Harness;
let simUrl: string;

beforeAll(async () => {
  // A vLLM whose /pause aborts in-flight requests (no keep mode).
  h = await startHarness("engine-abort", { tpotMs: 10, vllmVersion: "0.15.1" });
  const addr = h.sim.server.address();
  simUrl = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
});
afterAll(() => h?.close());

const TEXT = `go\n#sim: ${JSON.stringify([{ think: "look around first", tool_calls: [{ name: "ls", arguments: { path: "." } }], tokens: 80 }])}`;
const engine = (path: string) => fetch(`${simUrl}${path}`, { method: "POST" });

/**
 * Resolves once an engine-sim runs a generation (its /sim/stats), and a little after, so the call
 * is under way: a fixed wait let a slow machine pause the engine before the call reached it.
 */
async function generating(url: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const stats = (await (await fetch(`${url}/sim/stats`)).json()) as { ranks: { running: number }[] };
    if (stats.ranks.some((r) => r.running > 0)) break;
    if (Date.now() > deadline) throw new Error("the engine never ran the call");
    await new Promise((r) => setTimeout(r, 10));
  }
  await new Promise((r) => setTimeout(r, 50));
}

/** Pauses the engine itself (abort mode) once the call is under way, then resumes it. */
async function engineAbortsMidCall() {
  await generating(simUrl);
  expect((await engine("/pause?mode=abort")).status).toBe(200);
  await new Promise((r) => setTimeout(r, 50));
  expect((await engine("/resume")).status).toBe(200);
}

const session = async (id: string) => (await (await fetch(`${h.url}/v1/sessions/${id}`)).json()) as Session;

type Run = (s: { id: string; token: string; urls: { openai: string; anthropic: string } }) => Promise<unknown>;
const tools = [{ type: "function" as const, function: { name: "ls", parameters: { type: "object", properties: { path: { type: "string" } } } } }];
const RUNS: Record<string, Run> = {
  "openai chat": (s) => new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).chat.completions.create({ model: "m", messages: [{ role: "user", content: TEXT }], tools }),
  "openai chat, streamed": (s) =>
    new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).chat.completions.stream({ model: "m", messages: [{ role: "user", content: TEXT }], tools }).finalChatCompletion(),
  "anthropic, streamed": (s) =>
    new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 }).messages
      .stream({ model: "c", max_tokens: 500, messages: [{ role: "user", content: TEXT }], tools: [{ name: "ls", input_schema: { type: "object" } }] })
      .finalMessage(),
  anthropic: (s) =>
    new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 }).messages.create({ model: "c", max_tokens: 500, messages: [{ role: "user", content: TEXT }], tools: [{ name: "ls", input_schema: { type: "object" } }] }),
  gemini: (s) => new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: `${h.url}/s/${s.id}` } }).models.generateContent({ model: "m", contents: [{ role: "user", parts: [{ text: TEXT }] }] }),
  responses: (s) => new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).responses.create({ model: "m", input: TEXT }),
};

describe("an engine that aborts a call this gateway did not pause", () => {
  for (const [name, run] of Object.entries(RUNS)) {
    it(`${name}: the agent gets an error, not a cut answer; the call is lost and not recorded`, async () => {
      const s = await h.openSession();
      const [got] = await Promise.all([run(s).then((answer) => ({ answer }), (error: unknown) => ({ error })), engineAbortsMidCall()]);
      expect("error" in got ? null : got.answer, "the agent was given the cut answer as a finished one").toBeNull();
      const after = await session(s.id);
      expect(after.counts.llm_calls).toBe(0);
      expect(after.lost_calls.count).toBe(1);
      expect(await h.records(s.id)).toEqual([]);
    });
  }
});

describe("the same on a family with no gateway parser (Llama 3.1: a pause could never continue it)", () => {
  let l: Harness;
  beforeAll(async () => {
    l = await startHarness("engine-abort-llama", { tpotMs: 10, vllmVersion: "0.15.1", family: "llama3.1" });
  });
  afterAll(() => l?.close());

  it("openai chat, streamed: an error event, a lost call, no record", async () => {
    const addr = l.sim.server.address();
    const url = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
    const s = await l.openSession();
    const text = `go\n#sim: ${JSON.stringify([{ text: "a long answer", tokens: 80 }])}`;
    const call = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).chat.completions
      .stream({ model: "m", messages: [{ role: "user", content: text }] })
      .finalChatCompletion()
      .then((answer) => ({ answer }), (error: unknown) => ({ error }));
    await generating(url);
    await fetch(`${url}/pause?mode=abort`, { method: "POST" });
    await fetch(`${url}/resume`, { method: "POST" });
    const got = await call;
    expect("error" in got ? null : got.answer).toBeNull();
    const after = (await (await fetch(`${l.url}/v1/sessions/${s.id}`)).json()) as Session;
    expect(after.lost_calls.count).toBe(1);
    expect(await l.records(s.id)).toEqual([]);
  });
});

describe("an engine that ends a call with finish_reason \"error\" (vLLM's FINISHED_ERROR: the request failed part way)", () => {
  it("the agent gets an error, the call is lost and not recorded", async () => {
    // A vLLM of a release that reports the failure as a finish reason (engine-sim never fails so).
    const failing = Fastify();
    failing.get("/v1/models", async () => ({ data: [{ id: "m" }] }));
    failing.post("/v1/chat/completions", async () => ({
      prompt_token_ids: [1, 2, 3],
      choices: [{ message: { content: "half an ans" }, finish_reason: "error", token_ids: [7, 8], logprobs: { content: [{ token: "half", logprob: -1 }, { token: " an", logprob: -1 }] } }],
      usage: { prompt_tokens: 3, completion_tokens: 2 },
    }));
    const url = await listenLocal(failing);
    const fleet = await startSimFleet("engine-error");
    const gw = await fleet.gateway({ engines: [{ kind: "vllm", url, dp_size: 1 }], env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
    try {
      const s = (await gw.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
      const res = await gw.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
        payload: { model: "m", messages: [{ role: "user", content: "hi" }] },
      });
      expect(res.statusCode).toBe(502);
      const after = (await gw.inject({ url: `/v1/sessions/${s.id}` })).json() as Session;
      expect(after.counts.llm_calls).toBe(0);
      expect(after.lost_calls).toMatchObject({ count: 1, first: { kind: "engine_rejected", message: expect.stringMatching(/finish_reason "error"/) } });
    } finally {
      await gw.close();
      await fleet.close();
      await failing.close();
    }
  });
});

describe("a drain-mode pause that outlives its timeout, on a vLLM from before pause modes (< 0.16: /pause takes wait_for_inflight_requests, and aborts by default)", () => {
  let l: Harness;
  beforeAll(async () => {
    l = await startHarness("engine-abort-drain", { tpotMs: 10, vllmVersion: "0.15.1", family: "llama3.1" });
  });
  afterAll(() => l?.close());

  it("the engine is asked to let the call finish: it ends whole on the old weights, recorded, nothing lost", async () => {
    const admin = (path: string, body: unknown = {}) =>
      fetch(`${l.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }).then(async (r) => (await r.json()) as Record<string, unknown>);
    await admin("/admin/weights", { version: "w1" });
    const s = await l.openSession();
    const text = `go\n#sim: ${JSON.stringify([{ text: "a long answer", tokens: 100 }])}`;
    const call = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).chat.completions
      .create({ model: "m", messages: [{ role: "user", content: text }] })
      .then((answer) => ({ answer }), (error: unknown) => ({ error }));
    const addr = l.sim.server.address();
    await generating(`http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`);
    const paused = await admin("/admin/inference/pause", { mode: "drain", timeout_s: 0.1 });
    expect(paused).toMatchObject({ mode: "drain", drained: false });
    await admin("/admin/weights", { version: "w2" });
    await admin("/admin/inference/resume");
    const got = await call;
    expect("error" in got ? String(got.error) : null).toBeNull();
    const records = await l.records(s.id);
    expect(records).toHaveLength(1);
    expect(records[0]).toMatchObject({ finish_reason: "stop", weight_version: "w1" });
    expect(records[0]!.output_ids.length).toBeGreaterThanOrEqual(100);
    expect(((await (await fetch(`${l.url}/v1/sessions/${s.id}`)).json()) as Session).lost_calls.count).toBe(0);
  });
});

describe("a drain-mode pause that outlives its timeout on an SGLang whose calls are not stamped (no parser the gateway can follow)", () => {
  let g: Harness;
  let url: string;
  beforeAll(async () => {
    // The default profile names no SGLang parser: an abort-mode pause is planned as a drain, and calls carry no per-token stamps.
    g = await startHarness("engine-abort-sglang", { kind: "sglang", tpotMs: 10 }, {}, undefined, "default");
    url = `http://127.0.0.1:${(g.sim.server.address() as { port: number }).port}`;
  });
  afterAll(() => g?.close());

  it("the call still running is cut, not frozen into the new weights: a lost call, never a record claiming the old version for tokens the new weights made", async () => {
    const post = (u: string, body: unknown = {}) => fetch(u, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    await post(`${g.url}/admin/weights`, { version: "a" });
    await post(`${url}/sim/weights`, { version: "a" });
    const s = await g.openSession();
    const text = `go\n#sim: ${JSON.stringify([{ text: "a long answer", tokens: 100 }])}`;
    const call = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).chat.completions
      .create({ model: "m", messages: [{ role: "user", content: text }] })
      .then((answer) => ({ answer }), (error: unknown) => ({ error }));
    await generating(url);
    await post(`${g.url}/admin/inference/pause`, { mode: "drain", timeout_s: 0.1 });
    await post(`${g.url}/admin/weights`, { version: "b" });
    await post(`${url}/sim/weights`, { version: "b" });
    await post(`${g.url}/admin/inference/resume`);
    const got = await call;
    const records = await g.records(s.id);
    const after = (await (await fetch(`${g.url}/v1/sessions/${s.id}`)).json()) as Session;
    // Frozen into the new weights, its record would have claimed "a" for every token (the engine
    // made the later ones under "b"). Cut instead: no gateway parser can continue it, so it fails
    // as a lost call and nothing is recorded for it.
    for (const rec of records) {
      const versions = rec.output_weight_versions ?? rec.output_ids.map(() => rec.weight_version);
      rec.output_ids.forEach((id, i) => expect(rec.output_logprobs[i], `token ${i} stamped ${versions[i]}`).toBe(simLogprob(versions[i]!, [...rec.prompt_ids, ...rec.output_ids.slice(0, i)], id)));
    }
    expect("error" in got).toBe(true);
    expect(records).toEqual([]);
    expect(after.lost_calls.count).toBe(1);
  });
});
