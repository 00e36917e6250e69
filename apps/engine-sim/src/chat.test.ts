import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim } from "./app.js";
import { simLogprob } from "./logprobs.js";
import { parsePyJson } from "@rollgate/pyjson";
import { IM_END_ID, getTokenizer, renderChat } from "./index.js";

// Wire format under test: vLLM OpenAI server, v0.10.2+ token extensions (PR #22587: return_token_ids,
// top-level prompt_token_ids, choices[].token_ids), `reasoning` field (v0.11+, PR #27752),
// hermes tool parser, qwen3 reasoning parser.

const tok = getTokenizer();
const SCRIPT = '#sim: [{"think":"I should check the weather.","tool_calls":[{"name":"get_weather","arguments":{"city":"Paris","unit":1.0}}]},{"text":"It is sunny."}]';
const TOOLS_JSON = '[{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"number","minimum":1.0}},"required":["city"]}}}]';
const MESSAGES = [
  { role: "system", content: `You are a weather bot.\n${SCRIPT}` },
  { role: "user", content: "Weather in Paris?" },
];
const EMITTED = '<think>\nI should check the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": 1.0}}\n</tool_call><|im_end|>';

/** A request body as raw JSON text (so `1.0` reaches the server as written). */
function rawBody(extra: Record<string, unknown> = {}, messages: unknown[] = MESSAGES): string {
  const rest = JSON.stringify({ model: "Qwen/Qwen3-8B", messages, ...extra });
  return `{"tools": ${TOOLS_JSON}, ${rest.slice(1)}`;
}

async function post(app: FastifyInstance, url: string, payload: string | object, headers: Record<string, string> = {}) {
  return app.inject({ method: "POST", url, payload: typeof payload === "string" ? payload : JSON.stringify(payload), headers: { "content-type": "application/json", ...headers } });
}

function sseEvents(body: string): string[] {
  expect(body.endsWith("data: [DONE]\n\n")).toBe(true);
  return body.split("\n\n").filter((s) => s.length > 0).map((s) => {
    expect(s.startsWith("data: ")).toBe(true);
    return s.slice(6);
  });
}

let app: FastifyInstance;
beforeAll(() => {
  app = buildEngineSim({ dpSize: 2 });
});
afterAll(async () => {
  await app.close();
});

describe("POST /v1/chat/completions, non-streaming (vLLM ≥0.10.2 field placement)", () => {
  it("#sim think + tool call: reasoning, content '\\n\\n', hermes tool_calls, token ids, logprobs", async () => {
    const res = await post(app, "/v1/chat/completions", rawBody({ return_token_ids: true, logprobs: true, top_logprobs: 3 }), { "x-data-parallel-rank": "0" });
    expect(res.statusCode).toBe(200);
    expect(res.headers["x-sim-dp-rank"]).toBe("0");
    const j = res.json();
    expect(j.id).toMatch(/^chatcmpl-/);
    expect(j.object).toBe("chat.completion");
    expect(j.model).toBe("Qwen/Qwen3-8B");
    const c = j.choices[0];
    // qwen3 reasoning parser keeps the raw text between the tags; what follows </think> is content.
    expect(c.message.reasoning).toBe("\nI should check the weather.\n");
    expect(c.message.content).toBe("\n\n");
    expect(c.message.tool_calls).toHaveLength(1);
    expect(c.message.tool_calls[0].id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
    expect(c.message.tool_calls[0].type).toBe("function");
    // hermes: json.dumps(arguments, ensure_ascii=False) — Python separators, 1.0 kept.
    expect(c.message.tool_calls[0].function).toEqual({ name: "get_weather", arguments: '{"city": "Paris", "unit": 1.0}' });
    expect(c.finish_reason).toBe("tool_calls");
    expect(c.stop_reason).toBeNull();

    // Generated ids are the real tokenisation of the emitted text, <|im_end|> included.
    const ids: number[] = c.token_ids;
    expect(ids.at(-1)).toBe(IM_END_ID);
    expect(tok.decode(ids)).toBe(EMITTED);
    expect(ids).toEqual(tok.encode(EMITTED));

    // The prompt is exactly the rendered template.
    const prompt: number[] = j.prompt_token_ids;
    const rendered = renderChat({ messages: MESSAGES, tools: (parsePyJson(TOOLS_JSON) as unknown[]).map((t) => t as never) });
    expect(tok.decode(prompt)).toBe(rendered);
    expect(rendered).toContain('"minimum": 1.0');

    // One logprob per generated token, predicted by the exported function; top_logprobs start with the sampled token.
    const lps = c.logprobs.content;
    expect(lps).toHaveLength(ids.length);
    lps.forEach((e: { token: string; logprob: number; bytes: number[]; top_logprobs: { token: string }[] }, i: number) => {
      expect(e.logprob).toBe(simLogprob("0", [...prompt, ...ids.slice(0, i)], ids[i]!));
      expect(e.logprob).toBeLessThanOrEqual(0);
      expect(e.logprob).toBeGreaterThan(-10);
      expect(e.top_logprobs).toHaveLength(3);
      expect(e.top_logprobs[0]!.token).toBe(e.token);
      expect(e.bytes).toEqual(Array.from(new TextEncoder().encode(e.token)));
    });
    expect(lps[0].token).toBe("<think>");
    expect(lps.at(-1).token).toBe("<|im_end|>");
    expect(j.usage).toEqual({ prompt_tokens: prompt.length, total_tokens: prompt.length + ids.length, completion_tokens: ids.length, prompt_tokens_details: { cached_tokens: expect.any(Number) } });
  });

  it("the next answer plays STEP[1] (counting assistant messages after the script); past the end it answers 'done'", async () => {
    const turn2 = [
      ...MESSAGES,
      { role: "assistant", content: "\n\n", reasoning: "\nI should check the weather.\n", tool_calls: [{ id: "x", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris", "unit": 1.0}' } }] },
      { role: "tool", tool_call_id: "x", content: "sunny" },
    ];
    const j = (await post(app, "/v1/chat/completions", rawBody({ return_token_ids: true }, turn2))).json();
    expect(j.choices[0].message).toMatchObject({ content: "It is sunny.", reasoning: null });
    expect(j.choices[0].message.tool_calls).toBeUndefined();
    expect(j.choices[0].finish_reason).toBe("stop");
    expect(tok.decode(j.choices[0].token_ids)).toBe("It is sunny.<|im_end|>");
    // No return_token_ids → no token_ids / prompt_token_ids.
    const turn3 = [...turn2, { role: "assistant", content: "It is sunny." }, { role: "user", content: "thanks" }];
    const k = (await post(app, "/v1/chat/completions", rawBody({}, turn3))).json();
    expect(k.choices[0].message.content).toBe("done");
    expect(k.choices[0].token_ids).toBeUndefined();
    expect(k.prompt_token_ids).toBeUndefined();
    expect(k.choices[0].logprobs).toBeNull();
  });

  it("max_tokens truncates the ids → finish_reason 'length', no <|im_end|>", async () => {
    const j = (await post(app, "/v1/chat/completions", rawBody({ return_token_ids: true, max_tokens: 3 }))).json();
    expect(j.choices[0].finish_reason).toBe("length");
    expect(j.choices[0].token_ids).toHaveLength(3);
    expect(j.choices[0].token_ids).not.toContain(IM_END_ID);
    expect(j.usage.completion_tokens).toBe(3);
    // max_completion_tokens wins over max_tokens
    const k = (await post(app, "/v1/chat/completions", rawBody({ return_token_ids: true, max_tokens: 3, max_completion_tokens: 5 }))).json();
    expect(k.choices[0].token_ids).toHaveLength(5);
  });

  it("stop strings truncate the text; stop_reason is the matched string; token_ids keep the matching token", async () => {
    const msgs = [{ role: "user", content: '#sim: [{"text":"Hello world. Bye now"}]' }];
    const j = (await post(app, "/v1/chat/completions", { messages: msgs, stop: ["world"], return_token_ids: true })).json();
    expect(j.choices[0].message.content).toBe("Hello ");
    expect(j.choices[0]).toMatchObject({ finish_reason: "stop", stop_reason: "world" });
    expect(tok.decode(j.choices[0].token_ids)).toBe("Hello world");
  });

  it("skip_special_tokens=false: text still ends before the EOS (vLLM drops the stop token's text), token_ids keep it", async () => {
    const msgs = [{ role: "user", content: '#sim: [{"text":"Hi"}]' }];
    const j = (await post(app, "/v1/chat/completions", { messages: msgs, skip_special_tokens: false, return_token_ids: true })).json();
    expect(j.choices[0].message.content).toBe("Hi");
    expect(j.choices[0].token_ids.at(-1)).toBe(IM_END_ID);
  });

  it("without tools in the request, vLLM does not run the tool parser (markup stays in content)", async () => {
    const j = (await post(app, "/v1/chat/completions", { messages: MESSAGES })).json();
    expect(j.choices[0].finish_reason).toBe("stop");
    expect(j.choices[0].message.content).toContain("<tool_call>");
  });

  it("unscripted: seeded random text of SIM_RANDOM_TOKENS tokens + <|im_end|>, deterministic", async () => {
    const body = { messages: [{ role: "user", content: "tell me something" }], return_token_ids: true };
    const a = (await post(app, "/v1/chat/completions", body)).json();
    const other = buildEngineSim({ randomTokens: 24 });
    const b = (await post(other, "/v1/chat/completions", body)).json();
    await other.close();
    expect(a.choices[0].token_ids).toHaveLength(25);
    expect(a.choices[0].token_ids).toEqual(b.choices[0].token_ids);
    expect(tok.decode(a.choices[0].token_ids, true)).toBe(a.choices[0].message.content);
  });

  it("#sim tokens pads to exactly that many generated tokens", async () => {
    const msgs = [{ role: "user", content: '#sim: [{"text":"Hi","tokens":40}]' }];
    const j = (await post(app, "/v1/chat/completions", { messages: msgs, return_token_ids: true })).json();
    expect(j.choices[0].token_ids).toHaveLength(40);
    expect(j.choices[0].token_ids.at(-1)).toBe(IM_END_ID);
    expect(j.choices[0].message.content.startsWith("Hi ok ok")).toBe(true);
  });
});

describe("POST /v1/chat/completions, streaming (vLLM SSE order)", () => {
  it("role chunk with prompt_token_ids, empty-delta chunks for swallowed tokens (return_token_ids), finish, usage, [DONE]", async () => {
    const full = (await post(app, "/v1/chat/completions", rawBody({ return_token_ids: true }))).json();
    const res = await post(app, "/v1/chat/completions", rawBody({ stream: true, stream_options: { include_usage: true }, return_token_ids: true, logprobs: true }));
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toMatch(/^text\/event-stream/);
    const events = sseEvents(res.body);
    expect(events.at(-1)).toBe("[DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    const [role, ...rest] = chunks;
    expect(role.object).toBe("chat.completion.chunk");
    expect(role.choices).toEqual([{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }]);
    expect(role.prompt_token_ids).toEqual(full.prompt_token_ids);
    const usage = rest.pop();
    expect(usage.choices).toEqual([]);
    expect(usage.usage.completion_tokens).toBe(full.choices[0].token_ids.length);
    const finish = rest.at(-1);
    expect(finish.choices[0]).toMatchObject({ finish_reason: "tool_calls", stop_reason: null, token_ids: [IM_END_ID] });
    // one token per chunk; the ids add up to the non-streaming answer
    expect(rest.flatMap((c) => c.choices[0].token_ids)).toEqual(full.choices[0].token_ids);
    rest.forEach((c) => expect(c.choices[0].logprobs.content).toHaveLength(1));
    expect(rest.some((c) => Object.keys(c.choices[0].delta).length === 0)).toBe(true);
    expect(rest[0].choices[0].delta).toEqual({}); // <think> is swallowed by the reasoning parser
    const reasoning = rest.map((c) => c.choices[0].delta.reasoning ?? "").join("");
    const content = rest.map((c) => c.choices[0].delta.content ?? "").join("");
    expect(reasoning).toBe(full.choices[0].message.reasoning);
    expect(content).toBe("\n\n");
    const toolDeltas = rest.flatMap((c) => c.choices[0].delta.tool_calls ?? []);
    expect(toolDeltas[0]).toMatchObject({ type: "function", index: 0, function: { name: "get_weather" } });
    expect(toolDeltas[0].id).toMatch(/^chatcmpl-tool-/);
    expect(toolDeltas.map((d: { function: { arguments?: string } }) => d.function.arguments ?? "").join("")).toBe('{"city": "Paris", "unit": 1.0}');
  });

  it("a call's arguments stream as the model writes them, so a malformed or cut call streams the arguments it has (as vLLM's hermes parser does), not none", async () => {
    const call = (text: string, extra: Record<string, unknown> = {}) =>
      post(app, "/v1/chat/completions", rawBody({ stream: true, ...extra }, [{ role: "user", content: `#sim: ${JSON.stringify([{ text }])}` }]));
    const streamedCall = (body: string) => {
      const deltas = sseEvents(body)
        .slice(0, -1)
        .map((e) => JSON.parse(e) as { choices: { delta: { content?: string; tool_calls?: { index: number; function: { name?: string; arguments?: string } }[] } }[] })
        .flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
      return { name: deltas.map((d) => d.function.name ?? "").join(""), arguments: deltas.map((d) => d.function.arguments ?? "").join(""), pieces: deltas.filter((d) => d.function.arguments).length };
    };
    // The call object misses its closing brace: no call when not streamed (vLLM's content fallback),
    // but streamed the name and the whole arguments value went out already.
    const malformed = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": 2}\n</tool_call>';
    const whole = (await post(app, "/v1/chat/completions", rawBody({}, [{ role: "user", content: `#sim: ${JSON.stringify([{ text: malformed }])}` }]))).json();
    expect(whole.choices[0].message.tool_calls ?? []).toEqual([]);
    expect(whole.choices[0].message.content).toBe(malformed);
    const m = streamedCall((await call(malformed)).body);
    expect(m).toMatchObject({ name: "get_weather", arguments: '{"city": "Paris", "unit": 2}' });
    // Cut by max_tokens inside the arguments: the arguments written up to the cut.
    const cut = streamedCall((await call('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris is a city of light", "unit": 2}}\n</tool_call>', { max_tokens: 20 })).body);
    expect(cut.name).toBe("get_weather");
    expect(cut.arguments).toMatch(/^\{"city": "Paris is/);
    expect('{"city": "Paris is a city of light", "unit": 2}'.startsWith(cut.arguments)).toBe(true);
    // A whole call streams its arguments in pieces that join to the non-streamed arguments.
    const ok = streamedCall((await call('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": {"scale": [1, 2]}}}\n</tool_call>')).body);
    expect(ok.arguments).toBe('{"city": "Paris", "unit": {"scale": [1, 2]}}');
    expect(ok.pieces).toBeGreaterThan(1);
  });

  it("without return_token_ids the swallowed tokens' chunks (and their logprobs) are dropped", async () => {
    const res = await post(app, "/v1/chat/completions", rawBody({ stream: true, logprobs: true }));
    const chunks = sseEvents(res.body).slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks[0].prompt_token_ids).toBeUndefined();
    const body = chunks.slice(1);
    expect(body.every((c) => c.choices[0].token_ids === undefined)).toBe(true);
    expect(body.filter((c) => Object.keys(c.choices[0].delta).length === 0)).toHaveLength(0);
    expect(body.at(-1).choices[0].finish_reason).toBe("tool_calls");
    expect(body.some((c) => c.usage)).toBe(false);
  });

  it("byte for byte on a tiny script", async () => {
    const res = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: '#sim: [{"text":"Hi there"}]' }], stream: true, stream_options: { include_usage: true } }, { "x-data-parallel-rank": "1" });
    const id = /"id":"(chatcmpl-[^"]+)"/.exec(res.body)![1];
    const created = /"created":(\d+)/.exec(res.body)![1];
    const head = `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":"Qwen/Qwen3-8B"`;
    const cached = /"cached_tokens":(\d+)/.exec(res.body)![1];
    expect(res.body).toBe(
      `data: ${head},"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n` +
        `data: ${head},"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}\n\n` +
        `data: ${head},"choices":[{"index":0,"delta":{"content":" there"},"logprobs":null,"finish_reason":null}]}\n\n` +
        `data: ${head},"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}\n\n` +
        `data: ${head},"choices":[],"usage":{"prompt_tokens":18,"total_tokens":21,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":${cached}}}}\n\n` +
        "data: [DONE]\n\n",
    );
  });
});

describe("validation errors (vLLM envelope {error:{message,type,param,code}})", () => {
  const simple = { messages: [{ role: "user", content: "hi" }] };
  it.each([
    ["continue_final_message + add_generation_prompt", { ...simple, continue_final_message: true, add_generation_prompt: true }, /continue_final_message/],
    ["top_logprobs without logprobs", { ...simple, top_logprobs: 2 }, /`logprobs` must be set to true/],
    ["prompt_logprobs with stream", { ...simple, prompt_logprobs: 1, stream: true }, /not available when `stream=True`/],
    ["invalid body", { messages: "nope" }, /messages/],
    ["max_tokens beyond the context", { ...simple, max_tokens: 10_000_000 }, /maximum context length/],
  ])("%s → 400", async (_name, body, msg) => {
    const res = await post(app, "/v1/chat/completions", body);
    expect(res.statusCode).toBe(400);
    const j = res.json();
    expect(j.error).toMatchObject({ type: "BadRequestError", param: null, code: 400 });
    expect(j.error.message).toMatch(msg);
  });

  it("X-data-parallel-rank out of range → 400; non-integer → ignored (vLLM _get_data_parallel_rank)", async () => {
    const bad = await post(app, "/v1/chat/completions", simple, { "x-data-parallel-rank": "2" });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.message).toBe("data_parallel_rank 2 is out of range [0, 2).");
    expect((await post(app, "/v1/chat/completions", simple, { "x-data-parallel-rank": "abc" })).statusCode).toBe(200);
  });

  it("malformed JSON → 400; unknown fields are ignored; unknown model → 404", async () => {
    const bad = await post(app, "/v1/chat/completions", "{nope");
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.code).toBe(400);
    expect((await post(app, "/v1/chat/completions", { ...simple, frobnicate: 1 })).statusCode).toBe(200);
    const nf = await post(app, "/v1/chat/completions", { ...simple, model: "other" });
    expect(nf.statusCode).toBe(404);
    expect(nf.json().error).toMatchObject({ type: "NotFoundError", code: 404 });
  });
});

describe("DP ranks and prefix cache", () => {
  it("the header selects the rank; a repeated prompt hits the cache on that rank only (blocks of 16)", async () => {
    const sim = buildEngineSim({ dpSize: 2 });
    const body = { messages: [{ role: "user", content: "cache me ".repeat(40) }] };
    const r1 = await post(sim, "/v1/chat/completions", body, { "x-data-parallel-rank": "1" });
    expect(r1.headers["x-sim-dp-rank"]).toBe("1");
    expect(r1.json().usage.prompt_tokens_details.cached_tokens).toBe(0);
    const r2 = (await post(sim, "/v1/chat/completions", body, { "x-data-parallel-rank": "1" })).json();
    const prompt = r2.usage.prompt_tokens;
    expect(r2.usage.prompt_tokens_details.cached_tokens).toBe(Math.floor((prompt - 1) / 16) * 16);
    const r3 = (await post(sim, "/v1/chat/completions", body, { "x-data-parallel-rank": "0" })).json();
    expect(r3.usage.prompt_tokens_details.cached_tokens).toBe(0);
    const stats = (await sim.inject({ method: "GET", url: "/sim/stats" })).json();
    expect(stats.ranks.map((r: { served: number }) => r.served)).toEqual([1, 2]);
    await sim.close();
  });
});

describe("other vLLM routes", () => {
  it("/tokenize (chat and completion forms), /detokenize", async () => {
    const chat = (await post(app, "/tokenize", { messages: [{ role: "user", content: "hi" }], return_token_strs: true })).json();
    expect(tok.decode(chat.tokens)).toBe("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    expect(chat).toMatchObject({ count: chat.tokens.length, max_model_len: 40960 });
    expect(chat.token_strs[0]).toBe("<|im_start|>");
    const plain = (await post(app, "/tokenize", { prompt: "hello world" })).json();
    expect(plain).toEqual({ count: 2, max_model_len: 40960, tokens: tok.encode("hello world"), token_strs: null });
    expect((await post(app, "/detokenize", { tokens: plain.tokens })).json()).toEqual({ prompt: "hello world" });
  });

  it("/v1/models, /health, /version", async () => {
    const models = (await app.inject({ method: "GET", url: "/v1/models" })).json();
    expect(models.object).toBe("list");
    expect(models.data[0]).toMatchObject({ id: "Qwen/Qwen3-8B", object: "model", owned_by: "vllm", root: "Qwen/Qwen3-8B", parent: null, max_model_len: 40960 });
    const health = await app.inject({ method: "GET", url: "/health" });
    expect(health.statusCode).toBe(200);
    expect(health.body).toBe("");
    expect((await app.inject({ method: "GET", url: "/version" })).json().version).toMatch(/^\d+\.\d+\.\d+/);
  });

  it("--reasoning-field reasoning_content renames the field; latency: TTFT is honoured", async () => {
    const sim = buildEngineSim({ reasoningField: "reasoning_content", ttftMs: 150 });
    const t0 = Date.now();
    const j = (await post(sim, "/v1/chat/completions", { messages: [{ role: "user", content: '#sim: [{"think":"hmm","text":"ok"}]' }] })).json();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(140);
    expect(j.choices[0].message.reasoning_content).toBe("\nhmm\n");
    expect(j.choices[0].message.reasoning).toBeUndefined();
    expect(j.choices[0].message.content).toBe("\n\nok");
    await sim.close();
  });
});

describe("detokenisation", () => {
  it("incremental byte-level decoding equals the tokenizer's decode (multi-byte tokens held back until complete)", async () => {
    const text = "日本語のテキスト 😀🎉 naïve café — Ωmega\n\tend";
    const ids = tok.encode(text);
    const { text: inc, ends } = tok.incrementalDecode(ids, true);
    expect(inc).toBe(tok.decode(ids, true));
    expect(ends.at(-1)).toBe(inc.length);
    const res = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: `#sim: [{"text":${JSON.stringify(text)}}]` }], stream: true, logprobs: true });
    const chunks = sseEvents(res.body).slice(1, -1).map((e) => JSON.parse(e));
    expect(chunks.map((c) => c.choices[0].delta.content ?? "").join("")).toBe(text);
  });
});
