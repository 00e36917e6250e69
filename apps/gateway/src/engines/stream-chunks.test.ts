/**
 * vLLM and SGLang stream chunks are checked field by field (no zod parse per token): the check must accept
 * exactly what the schema accepts, and a bad chunk still gets an error naming what is wrong.
 */
import { describe, expect, it } from "vitest";
import { EngineError } from "./errors.js";
import { readSglangChunk } from "./sglang/chat.js";
import { readVllmChunk } from "./vllm/chat.js";

const lp = { token: "hi", logprob: -0.5, bytes: [104, 105], top_logprobs: [{ token: "hi", logprob: -0.5, bytes: null }] };
const good = [
  { id: "c", object: "chat.completion.chunk", prompt_token_ids: [1, 2, 3], choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }] },
  { choices: [{ index: 0, delta: { content: "hi" }, logprobs: { content: [lp] }, finish_reason: null, token_ids: [7] }] },
  { choices: [{ delta: { reasoning: "x", reasoning_content: null, tool_calls: [{ id: "call_1", type: "function", index: 0, function: { name: "ls", arguments: null } }] }, token_ids: [8] }] },
  { choices: [{ delta: {}, logprobs: { content: null }, finish_reason: "stop", stop_reason: 151645, token_ids: [] }] },
  { choices: [{ delta: {}, finish_reason: "stop", stop_reason: "</s>" }] },
  { choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, prompt_tokens_details: { cached_tokens: null } } },
  { choices: [], usage: null },
];
const bad: [unknown, RegExp][] = [
  [{ choices: [{ delta: { content: 5 } }] }, /content/],
  [{ choices: [{ token_ids: [1.5] }] }, /token_ids/],
  [{ choices: [{ logprobs: { content: [{ token: "a" }] } }] }, /logprob/],
  [{ choices: [{ delta: { tool_calls: [{ function: { name: 1 } }] } }] }, /name/],
  [{ choices: [{ stop_reason: true }] }, /stop_reason/],
  [{ choices: [], usage: { prompt_tokens: 1 } }, /completion_tokens/],
  [{ prompt_token_ids: "x", choices: [] }, /prompt_token_ids/],
  [{ nochoices: true }, /choices/],
];

describe("vLLM stream chunk check", () => {
  it("accepts the chunks vLLM sends, as they are", () => {
    for (const c of good) expect(readVllmChunk(c)).toBe(c);
  });
  it("refuses a malformed chunk with an EngineError naming the field", () => {
    for (const [c, field] of bad) {
      let err: unknown;
      try {
        readVllmChunk(c);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(EngineError);
      expect(err).toMatchObject({ status: 502, kind: "bad_response", message: expect.stringMatching(/malformed chunk/) });
      expect((err as Error).message).toMatch(field);
    }
  });
});

const sglangGood = [
  { id: "c", object: "chat.completion.chunk", choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }] },
  { choices: [{ index: 0, delta: { content: "hi", reasoning_content: null }, logprobs: { content: [lp] }, finish_reason: null, matched_stop: null }] },
  { choices: [{ delta: { tool_calls: [{ id: null, index: 0, function: { name: "ls", arguments: null } }, { index: 1, function: null }] } }] },
  { choices: [{ delta: null, finish_reason: "stop", matched_stop: 151645 }] },
  { choices: null, usage: { prompt_tokens: 3, completion_tokens: 2, prompt_tokens_details: null } },
  { choices: [], sglext: { input_ids: [1, 2, 3], output_ids: [[7, 8]], extra: true } },
  {},
];
const sglangBad: [unknown, RegExp][] = [
  [{ choices: [{ delta: { content: 5 } }] }, /content/],
  [{ choices: [{ logprobs: { content: [{ token: "a" }] } }] }, /logprob/],
  [{ choices: [{ logprobs: {} }] }, /content/],
  [{ choices: [{ delta: { tool_calls: [{ index: 0.5, function: null }] } }] }, /index/],
  [{ choices: [{ matched_stop: true }] }, /matched_stop/],
  [{ choices: "x" }, /choices/],
  [{ usage: { prompt_tokens: 1 } }, /completion_tokens/],
  [{ sglext: { output_ids: [1, 2] } }, /output_ids/],
  [{ sglext: { input_ids: ["a"] } }, /input_ids/],
];

describe("SGLang stream chunk check", () => {
  it("accepts the chunks SGLang sends, as they are", () => {
    for (const c of sglangGood) expect(readSglangChunk(c)).toBe(c);
  });
  it("refuses a malformed chunk with an EngineError naming the field", () => {
    for (const [c, field] of sglangBad) {
      let err: unknown;
      try {
        readSglangChunk(c);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(EngineError);
      expect(err).toMatchObject({ status: 502, kind: "bad_response", message: expect.stringMatching(/malformed chunk/) });
      expect((err as Error).message).toMatch(field);
    }
  });
});
