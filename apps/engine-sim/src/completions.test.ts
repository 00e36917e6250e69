import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim } from "./app.js";
import { simLogprob } from "./logprobs.js";
import { IM_END_ID, getTokenizer } from "./index.js";

// Wire format under test: vLLM /v1/completions, v0.12-era serving_completion.py (token extensions of
// v0.10.2, PR #22587: per-choice prompt_token_ids / token_ids; legacy logprobs; stream chunks dumped
// with exclude_unset=False, hence "usage":null).

const tok = getTokenizer();
const HI = '#sim: [{"text":"Hi there"}]';

async function post(app: FastifyInstance, url: string, payload: object, headers: Record<string, string> = {}) {
  return app.inject({ method: "POST", url, payload: JSON.stringify(payload), headers: { "content-type": "application/json", ...headers } });
}

let app: FastifyInstance;
beforeAll(() => {
  app = buildEngineSim({ dpSize: 2 });
});
afterAll(async () => {
  await app.close();
});

describe("POST /v1/completions, non-streaming (vLLM ≥0.10.2)", () => {
  it("text prompt: choice fields in vLLM order, token ids only with return_token_ids, max_tokens default 16", async () => {
    const j = (await post(app, "/v1/completions", { prompt: HI, return_token_ids: true })).json();
    expect(j.id).toMatch(/^cmpl-/);
    expect(Object.keys(j)).toEqual(["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage", "kv_transfer_params"]);
    expect(j.object).toBe("text_completion");
    const c = j.choices[0];
    expect(Object.keys(c)).toEqual(["index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_logprobs", "prompt_token_ids"]);
    expect(c).toMatchObject({ index: 0, text: "Hi there", logprobs: null, finish_reason: "stop", stop_reason: null, prompt_logprobs: null });
    expect(c.token_ids).toEqual([...tok.encode("Hi there"), IM_END_ID]);
    expect(c.prompt_token_ids).toEqual(tok.encode(HI));
    expect(j.usage).toEqual({ prompt_tokens: c.prompt_token_ids.length, total_tokens: c.prompt_token_ids.length + 3, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 0 } });
    const plain = (await post(app, "/v1/completions", { prompt: "tell me" })).json();
    expect(plain.choices[0].token_ids).toBeNull();
    expect(plain.choices[0].prompt_token_ids).toBeNull();
    // Unscripted answers are 24 words; max_tokens defaults to 16.
    expect(plain.usage.completion_tokens).toBe(16);
    expect(plain.choices[0].finish_reason).toBe("length");
  });

  it("prompt as token ids, list of texts, list of token-id lists → one choice per prompt", async () => {
    const ids = tok.encode(HI);
    const a = (await post(app, "/v1/completions", { prompt: ids, return_token_ids: true })).json();
    expect(a.choices[0].text).toBe("Hi there");
    expect(a.choices[0].prompt_token_ids).toEqual(ids);
    const b = (await post(app, "/v1/completions", { prompt: [HI, "#sim: [{\"text\":\"Bye\"}]"] })).json();
    expect(b.choices.map((c: { index: number; text: string }) => [c.index, c.text])).toEqual([
      [0, "Hi there"],
      [1, "Bye"],
    ]);
    const c = (await post(app, "/v1/completions", { prompt: [ids, tok.encode("#sim: [{\"text\":\"Yo\"}]")], return_token_ids: true })).json();
    expect(c.choices.map((x: { text: string }) => x.text)).toEqual(["Hi there", "Yo"]);
    expect(c.usage.prompt_tokens).toBe(ids.length + tok.encode("#sim: [{\"text\":\"Yo\"}]").length);
    expect(c.usage.completion_tokens).toBe(3 + 2);
    const bad = await post(app, "/v1/completions", { prompt: [999_999] });
    expect(bad.statusCode).toBe(400);
  });

  it("a rendered chat prompt plays the same #sim step as the chat route", async () => {
    const rendered = `<|im_start|>user\n#sim: [{"text":"one"},{"text":"two"}]<|im_end|>\n<|im_start|>assistant\none<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n`;
    const j = (await post(app, "/v1/completions", { prompt: rendered })).json();
    expect(j.choices[0].text).toBe("two");
  });

  it("a prompt that ends inside an assistant turn (an answer cut short) is continued, not restarted", async () => {
    const head = `<|im_start|>user\n#sim: [{"text":"alpha beta gamma delta"}]<|im_end|>\n<|im_start|>assistant\n`;
    const whole = tok.encode("alpha beta gamma delta");
    const cut = 2;
    const prompt = [...tok.encode(head), ...whole.slice(0, cut)];
    const c = (await post(app, "/v1/completions", { prompt, return_token_ids: true, max_tokens: 50 })).json().choices[0];
    expect(c.token_ids).toEqual([...whole.slice(cut), IM_END_ID]);
    expect(tok.decode([...whole.slice(0, cut), ...c.token_ids], true)).toBe("alpha beta gamma delta");
    // A closed turn is not continued: the next step plays.
    const closed = (await post(app, "/v1/completions", { prompt: `${head}alpha<|im_end|>\n<|im_start|>assistant\n` })).json();
    expect(closed.choices[0].text).toBe("done");
  });

  it("legacy logprobs {text_offset, token_logprobs, tokens, top_logprobs}: k+1 entries, values from simLogprob", async () => {
    const ids = tok.encode(HI);
    const j = (await post(app, "/v1/completions", { prompt: HI, logprobs: 2, return_token_ids: true })).json();
    const lp = j.choices[0].logprobs;
    expect(Object.keys(lp)).toEqual(["text_offset", "token_logprobs", "tokens", "top_logprobs"]);
    const out: number[] = j.choices[0].token_ids;
    expect(lp.tokens).toEqual(["Hi", " there", "<|im_end|>"]);
    expect(lp.text_offset).toEqual([0, 2, 8]);
    lp.token_logprobs.forEach((v: number, i: number) => expect(v).toBe(simLogprob("0", [...ids, ...out.slice(0, i)], out[i]!)));
    lp.top_logprobs.forEach((d: Record<string, number>, i: number) => {
      expect(Object.keys(d)).toHaveLength(3);
      expect(d[lp.tokens[i]]).toBe(lp.token_logprobs[i]);
    });
    const big = await post(app, "/v1/completions", { prompt: HI, logprobs: 21 });
    expect(big.statusCode).toBe(400);
    expect(big.json().error.message).toMatch(/greater than max allowed: 20/);
  });

  it("echo: prompt text first; logprobs start with the prompt (first entry null); max_tokens 0 returns only the prompt", async () => {
    const ids = tok.encode(HI);
    const j = (await post(app, "/v1/completions", { prompt: HI, echo: true, logprobs: 0 })).json();
    expect(j.choices[0].text).toBe(`${HI}Hi there`);
    const lp = j.choices[0].logprobs;
    expect(lp.tokens).toHaveLength(ids.length + 3);
    expect(lp.token_logprobs[0]).toBeNull();
    expect(lp.top_logprobs[0]).toBeNull();
    expect(lp.token_logprobs[1]).toBe(simLogprob("0", ids.slice(0, 1), ids[1]!));
    const only = (await post(app, "/v1/completions", { prompt: HI, echo: true, max_tokens: 0 })).json();
    expect(only.choices[0].text).toBe(HI);
    expect(only.usage.completion_tokens).toBe(0);
    expect((await post(app, "/v1/completions", { prompt: HI, max_tokens: 0 })).statusCode).toBe(400);
  });

  it("stop / stop_token_ids / include_stop_str_in_output as in the chat route", async () => {
    const j = (await post(app, "/v1/completions", { prompt: HI, stop: [" there"] })).json();
    expect(j.choices[0]).toMatchObject({ text: "Hi", finish_reason: "stop", stop_reason: " there" });
    const id = tok.encode(" there")[0]!;
    const k = (await post(app, "/v1/completions", { prompt: HI, stop_token_ids: [id], return_token_ids: true })).json();
    expect(k.choices[0]).toMatchObject({ text: "Hi", finish_reason: "stop", stop_reason: id });
    expect(k.choices[0].token_ids.at(-1)).toBe(id);
  });

  it("prompt_logprobs: entry 0 null, string-keyed dicts; 400 with stream=true", async () => {
    const j = (await post(app, "/v1/completions", { prompt: HI, prompt_logprobs: 1 })).json();
    const pl = j.choices[0].prompt_logprobs;
    expect(pl[0]).toBeNull();
    expect(pl).toHaveLength(tok.encode(HI).length);
    const bad = await post(app, "/v1/completions", { prompt: HI, prompt_logprobs: 1, stream: true });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error).toMatchObject({ message: "`prompt_logprobs` are not available when `stream=True`.", type: "BadRequestError", code: 400 });
    expect((await post(app, "/v1/completions", { prompt: HI, stream_options: { include_usage: true } })).statusCode).toBe(400);
  });
});

describe("POST /v1/completions, streaming (vLLM SSE)", () => {
  it("byte for byte on a tiny script: one chunk per token, finish on the last, usage chunk, [DONE]", async () => {
    const res = await post(app, "/v1/completions", { prompt: HI, stream: true, stream_options: { include_usage: true } }, { "x-data-parallel-rank": "1" });
    expect(res.headers["content-type"]).toMatch(/^text\/event-stream/);
    const id = /"id":"(cmpl-[^"]+)"/.exec(res.body)![1];
    const created = /"created":(\d+)/.exec(res.body)![1];
    const head = `{"id":"${id}","object":"text_completion","created":${created},"model":"Qwen/Qwen3-8B"`;
    const n = tok.encode(HI).length;
    const choice = (text: string, fin: string | null) => `{"index":0,"text":"${text}","logprobs":null,"finish_reason":${fin ? `"${fin}"` : null},"stop_reason":null,"prompt_token_ids":null,"token_ids":null}`;
    expect(res.body).toBe(
      `data: ${head},"choices":[${choice("Hi", null)}],"usage":null}\n\n` +
        `data: ${head},"choices":[${choice(" there", null)}],"usage":null}\n\n` +
        `data: ${head},"choices":[${choice("", "stop")}],"usage":null}\n\n` +
        `data: ${head},"choices":[],"usage":{"prompt_tokens":${n},"total_tokens":${n + 3},"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}\n\n` +
        "data: [DONE]\n\n",
    );
  });

  it("return_token_ids: prompt_token_ids on each choice's first chunk, token_ids on every chunk; echo folds the prompt into the first", async () => {
    const res = await post(app, "/v1/completions", { prompt: HI, stream: true, return_token_ids: true, logprobs: 1 });
    const chunks = res.body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    expect(chunks[0].choices[0].prompt_token_ids).toEqual(tok.encode(HI));
    expect(chunks.slice(1).every((c) => c.choices[0].prompt_token_ids === null)).toBe(true);
    expect(chunks.flatMap((c) => c.choices[0].token_ids)).toEqual([...tok.encode("Hi there"), IM_END_ID]);
    expect(chunks.map((c) => c.choices[0].logprobs.text_offset[0])).toEqual([0, 2, 8]);
    const echo = await post(app, "/v1/completions", { prompt: HI, stream: true, echo: true });
    const e = echo.body.split("\n\n").filter((s) => s && s !== "data: [DONE]").map((s) => JSON.parse(s.slice(6)));
    expect(e.map((c) => c.choices[0].text).join("")).toBe(`${HI}Hi there`);
    expect(e[0].choices[0].text).toBe(`${HI}Hi`);
  });
});
