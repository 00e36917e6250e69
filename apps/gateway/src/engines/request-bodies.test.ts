/**
 * Golden engine request bodies per model profile: the thinking switch goes under the kwarg the
 * family's template reads, the client's other chat_template_kwargs pass through, and the reasoning
 * effort reaches the engine only for families that read it.
 */
import { PRESETS } from "@rollgate/models";
import type { CanonicalChatRequest } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { buildSglangChatBody } from "./sglang/chat.js";
import { buildVllmChatBody } from "./vllm/chat.js";

const req = (extra: Partial<CanonicalChatRequest> = {}): CanonicalChatRequest => ({
  messages: [{ role: "user", content: "hi" }],
  sampling: { max_tokens: 64 },
  stream: false,
  client_logprobs: null,
  ...extra,
});

describe("vLLM chat body", () => {
  it("qwen3: enable_thinking; the client's own kwargs kept", () => {
    const body = buildVllmChatBody("m", req({ enable_thinking: false, chat_template_kwargs: { enable_thinking: false, foo: 1 }, reasoning_effort: "none" }), PRESETS.qwen3!);
    expect(body).toEqual({
      model: "m",
      messages: [{ role: "user", content: "hi" }],
      stream: false,
      logprobs: true,
      top_logprobs: 0,
      return_token_ids: true,
      chat_template_kwargs: { enable_thinking: false, foo: 1 },
      max_tokens: 64,
    });
  });

  it("deepseek-v3.1: the same switch as `thinking`", () => {
    expect(buildVllmChatBody("m", req({ enable_thinking: true, reasoning_effort: "high" }), PRESETS["deepseek-v3.1"]!)).toMatchObject({ chat_template_kwargs: { thinking: true } });
  });

  it("deepseek-v3.1: thinking off when the request declares tools (V3.1 calls tools only without thinking; Claude Code asks for both)", () => {
    const tools = [{ type: "function" as const, function: { name: "Bash", parameters: { type: "object", properties: { command: { type: "string" } } } } }];
    expect(buildVllmChatBody("m", req({ enable_thinking: true, tools }), PRESETS["deepseek-v3.1"]!)).toMatchObject({ chat_template_kwargs: { thinking: false } });
  });

  it("gpt-oss: no thinking kwarg; reasoning_effort forwarded at the top level", () => {
    const body = buildVllmChatBody("m", req({ enable_thinking: true, reasoning_effort: "low" }), PRESETS["gpt-oss"]!);
    expect(body.reasoning_effort).toBe("low");
    expect(body).not.toHaveProperty("chat_template_kwargs");
  });

  it("llama3: nothing to switch, nothing sent", () => {
    const body = buildVllmChatBody("m", req({ enable_thinking: true, reasoning_effort: "high" }), PRESETS.llama3!);
    expect(body).not.toHaveProperty("chat_template_kwargs");
    expect(body).not.toHaveProperty("reasoning_effort");
  });
});

describe("SGLang chat body", () => {
  it("uses the same template fields", () => {
    expect(buildSglangChatBody("m", req({ enable_thinking: true }), 1, PRESETS["deepseek-v3.1"]!)).toMatchObject({ chat_template_kwargs: { thinking: true }, routed_dp_rank: 1 });
    expect(buildSglangChatBody("m", req({ reasoning_effort: "medium" }), 0, PRESETS["gpt-oss"]!)).toMatchObject({ reasoning_effort: "medium" });
  });
});
