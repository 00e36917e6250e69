import { z } from "zod";

/**
 * The canonical chat request: what every client protocol is translated into and what the engine
 * adapters speak. It is OpenAI chat-shaped because that is what vLLM and SGLang render through
 * their chat templates.
 */
export const ContentPart = z.union([
  z.object({ type: z.literal("text"), text: z.string() }),
  z.object({
    type: z.literal("image_url"),
    image_url: z.object({ url: z.string(), detail: z.string().optional() }),
  }),
]);
export type ContentPart = z.infer<typeof ContentPart>;

export const ToolCall = z.object({
  id: z.string(),
  type: z.literal("function"),
  function: z.object({ name: z.string(), arguments: z.string() }),
});
export type ToolCall = z.infer<typeof ToolCall>;

export const ChatMessage = z.discriminatedUnion("role", [
  z.object({ role: z.literal("system"), content: z.union([z.string(), z.array(ContentPart)]) }),
  z.object({
    role: z.literal("user"),
    content: z.union([z.string(), z.array(ContentPart)]),
    name: z.string().optional(),
  }),
  z.object({
    role: z.literal("assistant"),
    content: z.union([z.string(), z.array(ContentPart)]).nullable(),
    reasoning: z.string().nullable().optional(),
    tool_calls: z.array(ToolCall).optional(),
  }),
  z.object({
    role: z.literal("tool"),
    content: z.union([z.string(), z.array(ContentPart)]),
    tool_call_id: z.string(),
  }),
]);
export type ChatMessage = z.infer<typeof ChatMessage>;

export const ToolDefinition = z.object({
  type: z.literal("function"),
  function: z.object({
    name: z.string(),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional(),
    strict: z.boolean().nullable().optional(),
  }),
});
export type ToolDefinition = z.infer<typeof ToolDefinition>;

export const ToolChoice = z.union([
  z.enum(["none", "auto", "required"]),
  z.object({ type: z.literal("function"), function: z.object({ name: z.string() }) }),
]);
export type ToolChoice = z.infer<typeof ToolChoice>;

/** Sampling parameters a task or session may pin; enforced on every LLM call. */
export const SamplingParams = z
  .object({
    temperature: z.number().min(0).max(2).optional(),
    top_p: z.number().gt(0).max(1).optional(),
    top_k: z.number().int().optional(),
    min_p: z.number().min(0).max(1).optional(),
    max_tokens: z.number().int().positive().optional(),
    stop: z.array(z.string()).optional(),
    seed: z.number().int().optional(),
    presence_penalty: z.number().optional(),
    frequency_penalty: z.number().optional(),
    repetition_penalty: z.number().optional(),
  })
  .strict();
export type SamplingParams = z.infer<typeof SamplingParams>;
/** Every sampling parameter's name, in the schema's order (the one list; engine adapters copy these). */
export const SAMPLING_KEYS = SamplingParams.keyof().options;
export type SamplingKey = (typeof SAMPLING_KEYS)[number];

/** The parameters of `s` that are set, in SAMPLING_KEYS order, leaving out the `except` ones. */
export function definedSampling(s: SamplingParams, except: readonly SamplingKey[] = []): Partial<SamplingParams> {
  const out: Record<string, unknown> = {};
  for (const key of SAMPLING_KEYS) if (s[key] !== undefined && !except.includes(key)) out[key] = s[key];
  return out as Partial<SamplingParams>;
}

export const CanonicalChatRequest = z.object({
  messages: z.array(ChatMessage).min(1),
  tools: z.array(ToolDefinition).optional(),
  tool_choice: ToolChoice.optional(),
  sampling: SamplingParams,
  /** Whether the client wants thinking; undefined leaves the engine's template default. */
  enable_thinking: z.boolean().optional(),
  /** The client's own chat_template_kwargs, as sent (the engine's model profile says which keys pass). */
  chat_template_kwargs: z.record(z.string(), z.unknown()).optional(),
  /** The client's reasoning effort ("low", "high", …), as sent; forwarded where the model profile reads it. */
  reasoning_effort: z.string().optional(),
  stream: z.boolean(),
  /** Logprobs the *client* asked to see; the gateway always asks the engine for its own. */
  client_logprobs: z.object({ top_logprobs: z.number().int().min(0).max(20) }).nullable(),
});
export type CanonicalChatRequest = z.infer<typeof CanonicalChatRequest>;

export const FinishReason = z.enum(["stop", "length", "tool_calls", "abort", "error"]);
export type FinishReason = z.infer<typeof FinishReason>;

export const AssistantOutput = z.object({
  content: z.string().nullable(),
  reasoning: z.string().nullable(),
  tool_calls: z.array(ToolCall),
});
export type AssistantOutput = z.infer<typeof AssistantOutput>;

export const Usage = z.object({
  prompt_tokens: z.number().int().nonnegative(),
  completion_tokens: z.number().int().nonnegative(),
  cached_tokens: z.number().int().nonnegative(),
  /**
   * Output tokens spent reasoning (up to and including the model profile's reasoning end marker),
   * as the gateway counted them from the engine's token text when the answer was recorded; absent
   * when they could not be counted. A branch's replayed answer carries its source's count, since
   * its record keeps no token text to count from.
   */
  reasoning_tokens: z.number().int().nonnegative().optional(),
});
export type Usage = z.infer<typeof Usage>;

/** One generated token's logprob entry as the engine gave it, for clients that asked. */
export const TokenLogprob = z.object({
  token: z.string(),
  logprob: z.number(),
  bytes: z.array(z.number().int()).nullable(),
  top_logprobs: z.array(
    z.object({ token: z.string(), logprob: z.number(), bytes: z.array(z.number().int()).nullable() }),
  ),
});
export type TokenLogprob = z.infer<typeof TokenLogprob>;
