import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim } from "./app.js";
import { getTokenizer } from "./index.js";

// Token-in on the chat route, as the real servers take it:
//  - vLLM main since PR #48145 (merged 2026-07-29): kv_transfer_params.prompt_token_ids;
//  - vLLM open PR #55771: a first-class prompt_token_ids field;
//  - SGLang: input_ids on /v1/chat/completions; PR #34488's sglext.input_ids / sglext.output_ids.
// In every case the messages still drive tools and the parsers; the ids are the prompt. A release
// without the field ignores it (unknown fields are ignored), which is how a gateway's probe tells.

const tok = getTokenizer();
const TOOLS = [{ type: "function", function: { name: "get_weather", description: "Get the weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const MESSAGES = [
  { role: "system", content: '#sim: [{"think":"Check it.","tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]},{"text":"Sunny."}]' },
  { role: "user", content: "Weather in Paris?" },
];

async function post(app: FastifyInstance, url: string, payload: object, headers: Record<string, string> = {}) {
  return app.inject({ method: "POST", url, payload: JSON.stringify(payload), headers: { "content-type": "application/json", ...headers } });
}

async function renderedIds(app: FastifyInstance): Promise<number[]> {
  const r = await post(app, "/tokenize", { messages: MESSAGES, tools: TOOLS });
  expect(r.statusCode).toBe(200);
  return r.json().tokens as number[];
}

/** What a client sees of an answer: the parsed message without the random tool-call ids. */
function parsed(j: { choices: { message: Record<string, unknown>; finish_reason: string; token_ids?: number[] }[] }) {
  const m = j.choices[0]!.message;
  const calls = (m.tool_calls as { function: unknown }[] | null | undefined)?.map((c) => c.function) ?? null;
  return { content: m.content, reasoning: m.reasoning ?? m.reasoning_content, calls, finish: j.choices[0]!.finish_reason, ids: j.choices[0]!.token_ids };
}

const apps: FastifyInstance[] = [];
function sim(options: Parameters<typeof buildEngineSim>[0]) {
  const app = buildEngineSim(options);
  apps.push(app);
  return app;
}
afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
});

describe("vLLM chat route with a pre-tokenised prompt", () => {
  let current: FastifyInstance;
  let next: FastifyInstance;
  let old: FastifyInstance;
  beforeAll(() => {
    current = sim({ vllmVersion: "0.28.0" });
    next = sim({ vllmVersion: "0.29.0" });
    old = sim({ vllmVersion: "0.27.1" });
  });

  it("/version reports the simulated release", async () => {
    expect((await old.inject({ method: "GET", url: "/version" })).json()).toEqual({ version: "0.27.1" });
    expect((await current.inject({ method: "GET", url: "/version" })).json()).toEqual({ version: "0.28.0" });
  });

  it("kv_transfer_params.prompt_token_ids (≥ 0.28.0) gives the same parsed answer as the rendered call, and is the prompt", async () => {
    const ids = await renderedIds(current);
    const rendered = (await post(current, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true })).json();
    const tokenIn = (await post(current, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true, kv_transfer_params: { prompt_token_ids: ids } })).json();
    expect(tokenIn.prompt_token_ids).toEqual(ids);
    expect(rendered.prompt_token_ids).toEqual(ids);
    expect(parsed(tokenIn)).toEqual(parsed(rendered));
    expect(parsed(tokenIn).calls).toEqual([{ name: "get_weather", arguments: '{"city": "Paris"}' }]);
    expect(parsed(tokenIn).reasoning).toBe("\nCheck it.\n");

    // The ids really are the prompt: a different prompt (an extra system line) is used as given.
    const other = tok.encode("<|im_start|>system\nBe brief.<|im_end|>\n").concat(ids);
    const j = (await post(current, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true, kv_transfer_params: { prompt_token_ids: other } })).json();
    expect(j.prompt_token_ids).toEqual(other);
    expect(j.usage.prompt_tokens).toBe(other.length);
  });

  it("streamed, the token-in answer carries the same deltas' content as the rendered one", async () => {
    const ids = await renderedIds(current);
    const collect = async (extra: object) => {
      const body = (await post(current, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, stream: true, return_token_ids: true, ...extra })).body;
      const chunks = body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
      const args = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []).map((t: { function: { arguments?: string } }) => t.function.arguments ?? "").join("");
      return { prompt: chunks[0].prompt_token_ids, ids: chunks.flatMap((c) => c.choices[0]?.token_ids ?? []), args, finish: chunks.at(-1).choices[0].finish_reason };
    };
    const a = await collect({});
    const b = await collect({ kv_transfer_params: { prompt_token_ids: ids } });
    expect(b).toEqual(a);
    expect(b.args).toBe('{"city": "Paris"}');
  });

  it("prompt_token_ids (PR #55771) is honoured from 0.29.0 and ignored by 0.28.0", async () => {
    const ids = await renderedIds(next);
    const other = tok.encode("<|im_start|>system\nBe brief.<|im_end|>\n").concat(ids);
    const j29 = (await post(next, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true, prompt_token_ids: other })).json();
    expect(j29.prompt_token_ids).toEqual(other);
    expect(parsed(j29).calls).toEqual([{ name: "get_weather", arguments: '{"city": "Paris"}' }]);
    const j28 = (await post(current, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true, prompt_token_ids: other })).json();
    expect(j28.prompt_token_ids).toEqual(ids);
  });

  it("an older release (0.27.1) ignores kv_transfer_params.prompt_token_ids and renders the messages", async () => {
    const ids = await renderedIds(old);
    const other = tok.encode("<|im_start|>system\nBe brief.<|im_end|>\n").concat(ids);
    const r = await post(old, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true, kv_transfer_params: { prompt_token_ids: other } });
    expect(r.statusCode).toBe(200);
    expect(r.json().prompt_token_ids).toEqual(ids);
    // Not even validated: an old server never looks at it.
    expect((await post(old, "/v1/chat/completions", { messages: MESSAGES, kv_transfer_params: { prompt_token_ids: "junk" } })).statusCode).toBe(200);
  });

  it("bad token-in prompts are a 400 in vLLM's envelope", async () => {
    const oov = await post(current, "/v1/chat/completions", { messages: MESSAGES, kv_transfer_params: { prompt_token_ids: [1, 2, 999_999] } });
    expect(oov.statusCode).toBe(400);
    expect(oov.json().error.message).toBe("Token id 999999 is out of vocabulary");
    const junk = await post(current, "/v1/chat/completions", { messages: MESSAGES, kv_transfer_params: { prompt_token_ids: ["a"] } });
    expect(junk.statusCode).toBe(400);
    expect(junk.json().error.message).toMatch(/prompt_token_ids must be a list of token ids/);
    expect((await post(current, "/v1/chat/completions", { messages: MESSAGES, kv_transfer_params: { prompt_token_ids: [] } })).statusCode).toBe(400);
  });
});

describe("SGLang chat route: input_ids and sglext ids (PR #34488)", () => {
  let app: FastifyInstance;
  beforeAll(() => {
    app = sim({ kind: "sglang" });
  });

  it("input_ids gives the same parsed answer as the rendered call; sglext carries the prompt and output ids", async () => {
    const ids = await renderedIds(app);
    const rendered = (await post(app, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_input_ids: true, return_output_ids: true })).json();
    const tokenIn = (await post(app, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, input_ids: ids, return_input_ids: true, return_output_ids: true })).json();
    expect(parsed(tokenIn)).toEqual(parsed(rendered));
    expect(parsed(tokenIn).calls).toEqual([{ name: "get_weather", arguments: '{"city": "Paris"}' }]);
    expect(tokenIn.sglext.input_ids).toEqual(ids);
    expect(rendered.sglext).toEqual(tokenIn.sglext);
    const out: number[] = tokenIn.sglext.output_ids[0];
    expect(tok.decode(out)).toBe('<think>\nCheck it.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>');
  });

  it("streaming: the ids come once, in a choices-less chunk before [DONE]; the header form works too", async () => {
    const ids = await renderedIds(app);
    const r = await post(app, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, input_ids: ids, stream: true }, { "x-sglext-return-input-ids": "true", "x-sglext-return-output-ids": "true" });
    const chunks = r.body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    expect(r.body.endsWith("data: [DONE]\n\n")).toBe(true);
    const last = chunks.at(-1);
    expect(last.choices).toEqual([]);
    expect(last.sglext.input_ids).toEqual(ids);
    expect(tok.decode(last.sglext.output_ids[0])).toMatch(/<\/tool_call><\|im_end\|>$/);
    expect(chunks.slice(0, -1).every((c) => c.sglext === undefined)).toBe(true);
  });

  it("without the flags there is no sglext", async () => {
    const j = (await post(app, "/v1/chat/completions", { messages: MESSAGES })).json();
    expect(j.sglext).toBeUndefined();
  });
});

describe("vLLM /pause?mode= is gated on the release that added it (0.16.0)", () => {
  it("0.15.x ignores mode=keep: the pause aborts in-flight requests", async () => {
    const app = sim({ vllmVersion: "0.15.1", tpotMs: 10 });
    const inflight = post(app, "/v1/completions", { prompt: "#sim: [{\"tokens\":40}]", max_tokens: 40, return_token_ids: true });
    await sleep(60);
    expect((await post(app, "/pause?mode=keep", {})).json()).toEqual({ status: "paused" });
    const j = (await inflight).json();
    expect(j.choices[0].finish_reason).toBe("abort");
    await post(app, "/resume", {});
  });

  it("0.16.0 honours mode=keep: the request freezes and finishes after /resume", async () => {
    const app = sim({ vllmVersion: "0.16.0", tpotMs: 10 });
    const inflight = post(app, "/v1/completions", { prompt: "#sim: [{\"tokens\":40}]", max_tokens: 40, return_token_ids: true });
    await sleep(60);
    await post(app, "/pause?mode=keep", {});
    await sleep(40);
    await post(app, "/resume", {});
    const j = (await inflight).json();
    expect(j.choices[0].finish_reason).toBe("stop");
    expect(j.choices[0].token_ids).toHaveLength(40);
  });
});
