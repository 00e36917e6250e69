import type { CanonicalChatRequest } from "@rollgate/protocol";
import type { EngineResult } from "@rollgate/transforms";
import { describe, expect, it } from "vitest";
import { addCut, continuationPrompt, continuationRequest, joinContinuation } from "./pause-continuation.js";

const lp = (token: string, logprob: number) => ({ token, logprob, bytes: [...Buffer.from(token)], top_logprobs: [] });

function result(ids: number[], finish: string, prompt = [1, 2, 3], cached = 0): EngineResult {
  return {
    prompt_ids: prompt,
    output_ids: ids,
    output_logprobs: ids.map((id) => -id / 100),
    logprobs: ids.map((id) => lp(`t${id}`, -id / 100)),
    message: { content: ids.map((id) => `t${id}`).join(""), reasoning: null, tool_calls: [] },
    finish_reason: finish,
    stop_reason: null,
    usage: { prompt_tokens: prompt.length, completion_tokens: ids.length, cached_tokens: cached },
  };
}

const request = (max_tokens?: number): CanonicalChatRequest =>
  ({ messages: [{ role: "user", content: "hi" }], sampling: max_tokens === undefined ? { temperature: 1 } : { temperature: 1, max_tokens }, stream: false }) as CanonicalChatRequest;

describe("continuation after an abort-mode pause", () => {
  it("keeps every cut's tokens with the version they were sampled under", () => {
    const first = addCut(null, result([10, 11], "abort", [1, 2, 3], 2), "v1");
    const second = addCut(first, result([12], "abort", [1, 2, 3, 10, 11]), "v2");
    expect(second).toMatchObject({ promptIds: [1, 2, 3], outputIds: [10, 11, 12], versions: ["v1", "v1", "v2"], cuts: 2, cachedTokens: 2 });
    expect(second.outputLogprobs).toEqual([-0.1, -0.11, -0.12]);
    expect(continuationPrompt(second)).toEqual([1, 2, 3, 10, 11, 12]);
  });

  it("a cut that generated nothing still counts, and the continuation starts from the prompt", () => {
    const cut = addCut(null, result([], "abort"), "v1");
    expect(cut).toMatchObject({ outputIds: [], versions: [], cuts: 1 });
    expect(continuationPrompt(cut)).toEqual([1, 2, 3]);
  });

  it("the continuation asks only for what is left of max_tokens; none left: no call", () => {
    const cut = addCut(null, result([10, 11, 12], "abort"), "v1");
    expect(continuationRequest(cut, request(10))!.sampling.max_tokens).toBe(7);
    expect(continuationRequest(cut, request(10))!.sampling.temperature).toBe(1);
    expect(continuationRequest(cut, request(3))).toBeNull();
    // No max_tokens: the engine's own default (context length minus the longer prompt) applies.
    expect(continuationRequest(cut, request())!.sampling.max_tokens).toBeUndefined();
  });

  it("joins the pieces into one answer: original prompt, all tokens, usage over the whole answer", () => {
    const cut = addCut(null, result([10, 11], "abort", [1, 2, 3], 2), "v1");
    const message = { content: "whole", reasoning: null, tool_calls: [] };
    const { result: whole, versions } = joinContinuation(cut, result([12, 13], "stop", [1, 2, 3, 10, 11], 5), "v2", { message, finish_reason: "stop" });
    expect(whole).toMatchObject({
      prompt_ids: [1, 2, 3],
      output_ids: [10, 11, 12, 13],
      output_logprobs: [-0.1, -0.11, -0.12, -0.13],
      message,
      finish_reason: "stop",
      usage: { prompt_tokens: 3, completion_tokens: 4, cached_tokens: 2 },
    });
    expect(whole.logprobs.map((l) => l.token)).toEqual(["t10", "t11", "t12", "t13"]);
    expect(versions).toEqual(["v1", "v1", "v2", "v2"]);
  });

  it("a budget spent at the cut ends the answer there (length)", () => {
    const cut = addCut(null, result([10, 11], "abort"), "v1");
    const { result: whole, versions } = joinContinuation(cut, null, "v2", { message: { content: "x", reasoning: null, tool_calls: [] }, finish_reason: "length" });
    expect(whole.output_ids).toEqual([10, 11]);
    expect(whole.finish_reason).toBe("length");
    expect(versions).toEqual(["v1", "v1"]);
  });
});
