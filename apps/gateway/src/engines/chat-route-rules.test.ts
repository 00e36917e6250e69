import { describe, expect, it } from "vitest";
import { stopStringFinish } from "./answer-check.js";
import { chatFinishReason } from "./chat-route-rules.js";
import { cutFinishReason } from "./vllm/chat.js";

describe("the finish reason of an answer with tool calls", () => {
  it("parsed by the gateway (token-in routes): tool_calls when it ended by itself, its own reason when cut", () => {
    expect(chatFinishReason("stop", 1)).toBe("tool_calls");
    expect(chatFinishReason("length", 1)).toBe("length");
    expect(chatFinishReason("abort", 2)).toBe("abort");
    expect(chatFinishReason("stop", 0)).toBe("stop");
    expect(chatFinishReason("length", 0)).toBe("length");
  });

  it("an answer one of the agent's stop strings ended says stop, a call in it or not (an end token id is no stop string)", () => {
    expect(chatFinishReason("stop", 1, "word9")).toBe("stop");
    expect(chatFinishReason("stop", 1, 151645)).toBe("tool_calls");
    expect(stopStringFinish("tool_calls", "word9")).toBe("stop");
    expect(stopStringFinish("tool_calls", 151645)).toBe("tool_calls");
    expect(stopStringFinish("tool_calls", null)).toBe("tool_calls");
    expect(stopStringFinish("length", "word9")).toBe("length");
  });

  it("parsed by vLLM's chat route, which says tool_calls for a cut one too: length when it used every token it was allowed", () => {
    expect(cutFinishReason("tool_calls", 40, 40)).toBe("length");
    expect(cutFinishReason("tool_calls", 39, 40)).toBe("tool_calls");
    // No max_tokens sent: the limit is the context left, which is not counted here.
    expect(cutFinishReason("tool_calls", 40, undefined)).toBe("tool_calls");
    expect(cutFinishReason("stop", 40, 40)).toBe("stop");
    expect(cutFinishReason("length", 40, 40)).toBe("length");
  });
});
