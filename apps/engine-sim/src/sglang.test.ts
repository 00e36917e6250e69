import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim } from "./app.js";
import { simLogprob } from "./logprobs.js";
import { IM_END_ID, getTokenizer } from "./index.js";

// Wire format under test: SGLang v0.5.x (tokenizer_manager.py / http_server.py): /generate with
// meta_info (total_retractions, weight_version, cached_tokens, e2e_latency on the final event),
// cumulative streaming by default and deltas with --incremental-streaming-output; the OpenAI routes
// of serving_chat.py (reasoning_content, matched_stop, metadata.weight_version). engines.md §2.

const tok = getTokenizer();
const HI = '#sim: [{"text":"Hi there"}]';
const OUT = [...tok.encode("Hi there"), IM_END_ID];

async function post(app: FastifyInstance, url: string, payload: object, headers: Record<string, string> = {}) {
  return app.inject({ method: "POST", url, payload: JSON.stringify(payload), headers: { "content-type": "application/json", ...headers } });
}

let app: FastifyInstance;
beforeAll(() => {
  app = buildEngineSim({ kind: "sglang", dpSize: 2 });
});
afterAll(async () => {
  await app.close();
});

describe("SGLang POST /generate (non-streaming)", () => {
  it("text in: {text, output_ids, meta_info} with SGLang's key order and finish_reason objects", async () => {
    const res = await post(app, "/generate", { text: HI, rid: "r1", routed_dp_rank: 1 });
    expect(res.statusCode).toBe(200);
    const j = res.json();
    expect(Object.keys(j)).toEqual(["text", "output_ids", "meta_info"]);
    expect(j.text).toBe("Hi there");
    expect(j.output_ids).toEqual(OUT);
    expect(Object.keys(j.meta_info)).toEqual(["id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions", "completion_tokens", "cached_tokens", "dp_rank", "e2e_latency"]);
    expect(j.meta_info).toMatchObject({ id: "r1", finish_reason: { type: "stop", matched: IM_END_ID }, prompt_tokens: tok.encode(HI).length, weight_version: "default", total_retractions: 0, completion_tokens: 3, cached_tokens: 0, dp_rank: 1 });
    expect(typeof j.meta_info.e2e_latency).toBe("number");
  });

  it("input_ids in; length and stop-string / stop-token finish reasons; no_stop_trim; batch 2-D → list", async () => {
    const ids = tok.encode(HI);
    const len = (await post(app, "/generate", { input_ids: ids, sampling_params: { max_new_tokens: 2 } })).json();
    expect(len.meta_info.finish_reason).toEqual({ type: "length", length: 2 });
    expect(len.output_ids).toEqual(OUT.slice(0, 2));
    const stopStr = (await post(app, "/generate", { input_ids: ids, sampling_params: { stop: [" there"] } })).json();
    expect(stopStr.meta_info.finish_reason).toEqual({ type: "stop", matched: " there" });
    expect(stopStr.text).toBe("Hi");
    const kept = (await post(app, "/generate", { input_ids: ids, sampling_params: { stop: " there", no_stop_trim: true } })).json();
    expect(kept.text).toBe("Hi there");
    const stopId = (await post(app, "/generate", { input_ids: ids, sampling_params: { stop_token_ids: [OUT[1]] } })).json();
    expect(stopId.meta_info.finish_reason).toEqual({ type: "stop", matched: OUT[1] });
    const eos = (await post(app, "/generate", { input_ids: ids, sampling_params: { ignore_eos: true, max_new_tokens: 6 } })).json();
    expect(eos.output_ids).toHaveLength(6);
    expect(eos.output_ids[2]).toBe(IM_END_ID);
    expect(eos.meta_info.finish_reason).toEqual({ type: "length", length: 6 });
    const batch = (await post(app, "/generate", { input_ids: [ids, ids] })).json();
    expect(Array.isArray(batch)).toBe(true);
    expect(batch.map((b: { text: string }) => b.text)).toEqual(["Hi there", "Hi there"]);
    const bad = await post(app, "/generate", { text: "a", input_ids: [1] });
    expect(bad.statusCode).toBe(400);
    expect(bad.json()).toEqual({ error: { message: "Either text or input_ids should be provided." } });
  });

  it("return_logprob: [logprob, id, text|null] triples; logprob_start_len 0 gives the prompt (first null); top_logprobs_num", async () => {
    const ids = tok.encode(HI);
    const j = (await post(app, "/generate", { input_ids: ids, return_logprob: true, logprob_start_len: 0, top_logprobs_num: 2, return_text_in_logprobs: true })).json();
    const m = j.meta_info;
    expect(Object.keys(m)).toEqual(["id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions", "input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs", "completion_tokens", "cached_tokens", "dp_rank", "e2e_latency"]);
    expect(m.input_token_logprobs).toHaveLength(ids.length);
    expect(m.input_token_logprobs[0]).toEqual([null, ids[0], tok.decode([ids[0]!])]);
    expect(m.input_token_logprobs.map((t: unknown[]) => t[1])).toEqual(ids);
    expect(m.input_token_logprobs[1][0]).toBe(simLogprob("default", ids.slice(0, 1), ids[1]!));
    expect(m.output_token_logprobs).toEqual(OUT.map((id, i) => [simLogprob("default", [...ids, ...OUT.slice(0, i)], id), id, tok.decode([id])]));
    expect(m.output_top_logprobs).toHaveLength(3);
    expect(m.output_top_logprobs[0]).toHaveLength(2);
    expect(m.input_top_logprobs[0]).toBeNull();
    const plain = (await post(app, "/generate", { input_ids: ids, return_logprob: true })).json();
    expect(plain.meta_info.input_token_logprobs).toEqual([]);
    expect(plain.meta_info.output_token_logprobs[0][2]).toBeNull();
    expect(plain.meta_info.output_top_logprobs).toBeUndefined();
  });

  it("routed_dp_rank and the older data_parallel_rank pin the rank; out of range falls back to load balancing (PR #19762)", async () => {
    const sim = buildEngineSim({ kind: "sglang", dpSize: 2 });
    expect((await post(sim, "/generate", { text: HI, routed_dp_rank: 1 })).json().meta_info.dp_rank).toBe(1);
    expect((await post(sim, "/generate", { text: HI, data_parallel_rank: 1 })).json().meta_info.dp_rank).toBe(1);
    const far = await post(sim, "/generate", { text: HI, routed_dp_rank: 7 });
    expect(far.statusCode).toBe(200);
    expect(far.json().meta_info.dp_rank).toBe(0);
    await sim.close();
  });
});

describe("SGLang POST /generate (streaming)", () => {
  const head = (n: number) => `"prompt_tokens":${tok.encode(HI).length},"weight_version":"default","total_retractions":0,"completion_tokens":${n},"cached_tokens":0`;

  it("cumulative by default: each event carries the text and output_ids so far; e2e_latency only on the last; byte for byte", async () => {
    const sim = buildEngineSim({ kind: "sglang" });
    const res = await post(sim, "/generate", { text: HI, rid: "s1", stream: true });
    const lat = /"e2e_latency":([0-9.e-]+)/.exec(res.body)![1];
    const [a, b] = OUT;
    expect(res.body).toBe(
      `data: {"text":"Hi","output_ids":[${a}],"meta_info":{"id":"s1","finish_reason":null,${head(1)}}}\n\n` +
        `data: {"text":"Hi there","output_ids":[${a},${b}],"meta_info":{"id":"s1","finish_reason":null,${head(2)}}}\n\n` +
        `data: {"text":"Hi there","output_ids":[${a},${b},${IM_END_ID}],"meta_info":{"id":"s1","finish_reason":{"type":"stop","matched":${IM_END_ID}},${head(3)},"e2e_latency":${lat}}}\n\n` +
        "data: [DONE]\n\n",
    );
    // Cumulative logprob lists.
    const lp = await post(sim, "/generate", { text: HI, stream: true, return_logprob: true });
    const events = lp.body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    expect(events.map((e) => e.meta_info.output_token_logprobs.length)).toEqual([1, 2, 3]);
    await sim.close();
  });

  it("--incremental-streaming-output: deltas of text, output_ids and logprobs; byte for byte", async () => {
    const sim = buildEngineSim({ kind: "sglang", incrementalStreamingOutput: true });
    const res = await post(sim, "/generate", { text: HI, rid: "s2", stream: true });
    const lat = /"e2e_latency":([0-9.e-]+)/.exec(res.body)![1];
    const [a, b] = OUT;
    expect(res.body).toBe(
      `data: {"text":"Hi","output_ids":[${a}],"meta_info":{"id":"s2","finish_reason":null,${head(1)}}}\n\n` +
        `data: {"text":" there","output_ids":[${b}],"meta_info":{"id":"s2","finish_reason":null,${head(2)}}}\n\n` +
        `data: {"text":"","output_ids":[${IM_END_ID}],"meta_info":{"id":"s2","finish_reason":{"type":"stop","matched":${IM_END_ID}},${head(3)},"e2e_latency":${lat}}}\n\n` +
        "data: [DONE]\n\n",
    );
    const lp = await post(sim, "/generate", { text: HI, stream: true, return_logprob: true });
    const events = lp.body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    expect(events.map((e) => e.meta_info.output_token_logprobs.map((t: unknown[]) => t[1]))).toEqual([[a], [b], [IM_END_ID]]);
    await sim.close();
  });
});

describe("SGLang OpenAI routes (v0.5.x serving_chat / serving_completions)", () => {
  it("chat: reasoning_content, tool_calls null, matched_stop, metadata.weight_version, rid as id; token ids only on request", async () => {
    const msgs = [{ role: "user", content: '#sim: [{"think":"hmm","text":"ok"}]' }];
    const j = (await post(app, "/v1/chat/completions", { model: "Qwen/Qwen3-8B", messages: msgs, logprobs: true, rid: "c1" })).json();
    expect(j.id).toBe("c1");
    expect(Object.keys(j)).toEqual(["id", "object", "created", "model", "choices", "usage", "metadata"]);
    expect(j.choices[0].message).toEqual({ role: "assistant", content: "\n\nok", reasoning_content: "\nhmm\n", tool_calls: null });
    expect(j.choices[0]).toMatchObject({ finish_reason: "stop", matched_stop: IM_END_ID });
    expect(Object.keys(j.choices[0].logprobs.content[0])).toEqual(["token", "bytes", "logprob", "top_logprobs"]);
    expect(j.choices[0].token_ids).toBeUndefined();
    expect(j.metadata).toEqual({ weight_version: "default" });
    const ids = (await post(app, "/v1/chat/completions", { messages: msgs, return_token_ids: true, return_prompt_token_ids: true })).json();
    expect(ids.choices[0].token_ids.at(-1)).toBe(IM_END_ID);
    expect(tok.decode(ids.choices[0].prompt_token_ids)).toContain("#sim:");
    const bad = await post(app, "/v1/chat/completions", { messages: msgs, stream: true, return_token_ids: true });
    expect(bad.statusCode).toBe(400);
    expect(bad.json()).toMatchObject({ object: "error", type: "BadRequestError", code: 400 });
  });

  it("chat streaming: role chunk, DeltaMessage with nulls, separate finish chunk with matched_stop, [DONE]", async () => {
    const res = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: HI }], stream: true });
    const chunks = res.body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    expect(res.body.endsWith("data: [DONE]\n\n")).toBe(true);
    expect(chunks[0].choices[0].delta).toEqual({ role: "assistant", content: "", reasoning_content: null, tool_calls: null });
    expect(chunks.slice(1, -1).map((c) => c.choices[0].delta.content).join("")).toBe("Hi there");
    expect(chunks.at(-1).choices[0]).toMatchObject({ delta: { role: null, content: null, reasoning_content: null, tool_calls: null }, finish_reason: "stop", matched_stop: IM_END_ID });
    expect(chunks.every((c) => c.usage === null)).toBe(true);
  });

  it("chat streaming with PR #34488's ids: every token's logprob comes with its step (a step whose text a parser swallowed has a chunk of its own), the ids once before [DONE]", async () => {
    const msgs = [{ role: "user", content: '#sim: [{"think":"hmm","text":"ok"}]' }];
    const res = await post(app, "/v1/chat/completions", { messages: msgs, stream: true, logprobs: true, return_input_ids: true, return_output_ids: true });
    const chunks = res.body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    const lps = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
    const ext = chunks.at(-1).sglext;
    expect(chunks.at(-1).choices).toEqual([]);
    expect(ext.output_ids).toHaveLength(1);
    expect(lps).toHaveLength(ext.output_ids[0].length);
    expect(lps.map((l: { token: string }) => l.token).join("")).toBe(tok.decode(ext.output_ids[0], false));
    expect(tok.decode(ext.input_ids)).toContain("#sim:");
    const swallowed = chunks.filter((c) => c.choices[0]?.logprobs && !c.choices[0].delta.content && !c.choices[0].delta.reasoning_content);
    expect(swallowed.length).toBeGreaterThan(0);
  });

  it("completions: {index, text, logprobs, finish_reason, matched_stop}; X-Data-Parallel-Rank honoured, out of range → LB", async () => {
    const j = (await post(app, "/v1/completions", { prompt: HI }, { "x-data-parallel-rank": "1" }));
    expect(j.headers["x-sim-dp-rank"]).toBe("1");
    expect(j.json().choices[0]).toEqual({ index: 0, text: "Hi there", logprobs: null, finish_reason: "stop", matched_stop: IM_END_ID });
    expect((await post(app, "/v1/completions", { prompt: HI }, { "x-data-parallel-rank": "9" })).statusCode).toBe(200);
  });
});

describe("SGLang small routes", () => {
  it("/tokenize, /detokenize, /v1/models (owned_by sglang), /model_info, /server_info, /health, /health_generate", async () => {
    expect((await post(app, "/tokenize", { prompt: "hello world" })).json()).toEqual({ tokens: tok.encode("hello world"), count: 2, max_model_len: 40960 });
    expect((await post(app, "/detokenize", { tokens: [...tok.encode("hi"), IM_END_ID] })).json()).toEqual({ text: "hi" });
    expect((await app.inject({ method: "GET", url: "/v1/models" })).json().data[0]).toMatchObject({ id: "Qwen/Qwen3-8B", owned_by: "sglang" });
    expect((await app.inject({ method: "GET", url: "/model_info" })).json()).toMatchObject({ model_path: "Qwen/Qwen3-8B", is_generation: true, weight_version: "default" });
    expect((await app.inject({ method: "GET", url: "/server_info" })).json()).toMatchObject({ dp_size: 2 });
    expect((await app.inject({ method: "GET", url: "/health" })).statusCode).toBe(200);
    expect((await app.inject({ method: "GET", url: "/health_generate" })).statusCode).toBe(200);
  });

  it("/update_weights_from_disk bumps the weight version (meta_info.weight_version, /model_info) and changes the logprobs", async () => {
    const sim = buildEngineSim({ kind: "sglang" });
    const ids = tok.encode(HI);
    const before = (await post(sim, "/generate", { input_ids: ids, return_logprob: true })).json();
    const up = (await post(sim, "/update_weights_from_disk", { model_path: "/ckpt/step-1", weight_version: "step-1" })).json();
    expect(up).toEqual({ success: true, message: "Succeeded to update model weights. Weight version updated to step-1.", num_paused_requests: 0 });
    const after = (await post(sim, "/generate", { input_ids: ids, return_logprob: true })).json();
    expect(after.meta_info.weight_version).toBe("step-1");
    expect(after.meta_info.output_token_logprobs[0][0]).toBe(simLogprob("step-1", ids, OUT[0]!));
    expect(after.meta_info.output_token_logprobs[0][0]).not.toBe(before.meta_info.output_token_logprobs[0][0]);
    await post(sim, "/update_weights_from_disk", { model_path: "/ckpt/step-2" });
    expect((await sim.inject({ method: "GET", url: "/model_info" })).json().weight_version).toBe("step-1+1");
    await sim.close();
  });
});
