import { z } from "zod";
import type { CanonicalChatRequest, ChatMessage, SamplingParams, TokenLogprob } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";
import { imageByUrlRefused, isInlineImage, partError, stringOrArrayOf } from "./content-parts.js";
import { NO_STRUCTURED_OUTPUT, forcesACall, isEmpty, isFalse, isOne, isTextFormat, isTextOnly, isTrue, isZero, never, noToolToCall, notPassed, namedToolNotOffered, refusedUnless } from "./unhonoured.js";

/**
 * OpenAI Chat Completions ⇄ canonical. The request schema accepts what the OpenAI SDK and agents
 * built on it send; fields that change neither the prompt nor the sampling (user, metadata, store,
 * service_tier, prediction, …) pass through the loose object and are ignored. `parallel_tool_calls`
 * is ignored too: the model decides, and vLLM's way of honouring `false` (dropping every call after
 * the first from the answer) would give the agent a turn whose tokens say otherwise.
 *
 * Fields that change the prompt or the sampling and that the canonical request cannot carry
 * (`logit_bias`, structured output, vLLM's `min_tokens`, `stop_token_ids`, guided decoding, …) are
 * refused unless neutral (unhonoured.ts); vLLM's `repetition_penalty`, `top_k` and `min_p`
 * extensions are honoured.
 */

/** Fields the gateway cannot honour: accepted only neutral, else a 400 naming them. */
const UNHONOURED = {
  logit_bias: refusedUnless(isEmpty, notPassed("logit_bias", "a logit bias")),
  response_format: refusedUnless(isTextFormat, `response_format: ${NO_STRUCTURED_OUTPUT}`),
  modalities: refusedUnless(isTextOnly, "modalities: only text output is supported"),
  // The legacy function-calling fields: the model would be offered no tools at all.
  functions: refusedUnless(isEmpty, "functions is not supported: declare them as tools ({type: \"function\", function})"),
  function_call: refusedUnless(never, "function_call is not supported: use tool_choice"),
  audio: refusedUnless(never, "audio output is not supported"),
  // vLLM's extensions of the chat request.
  min_tokens: refusedUnless(isZero, notPassed("min_tokens", "a minimum length")),
  ignore_eos: refusedUnless(isFalse, notPassed("ignore_eos", "ignore_eos")),
  stop_token_ids: refusedUnless(isEmpty, notPassed("stop_token_ids", "stop token ids")),
  bad_words: refusedUnless(isEmpty, notPassed("bad_words", "banned words")),
  allowed_token_ids: refusedUnless(never, notPassed("allowed_token_ids", "a token allow-list")),
  logits_processors: refusedUnless(isEmpty, notPassed("logits_processors", "logits processors")),
  guided_json: refusedUnless(never, `guided_json: ${NO_STRUCTURED_OUTPUT}`),
  guided_regex: refusedUnless(never, `guided_regex: ${NO_STRUCTURED_OUTPUT}`),
  guided_choice: refusedUnless(never, `guided_choice: ${NO_STRUCTURED_OUTPUT}`),
  guided_grammar: refusedUnless(never, `guided_grammar: ${NO_STRUCTURED_OUTPUT}`),
  structured_outputs: refusedUnless(never, `structured_outputs: ${NO_STRUCTURED_OUTPUT}`),
  best_of: refusedUnless(isOne, "only best_of=1 is supported; send separate requests"),
  use_beam_search: refusedUnless(isFalse, "beam search is not supported"),
  echo: refusedUnless(isFalse, "echo is not supported"),
  // The gateway renders the prompt itself, as the engine's chat template and its model profile say.
  chat_template: refusedUnless(never, "chat_template is not supported: the gateway renders the engine's own chat template"),
  add_generation_prompt: refusedUnless(isTrue, "add_generation_prompt: false is not supported: every call asks for a new assistant turn"),
  continue_final_message: refusedUnless(isFalse, "continue_final_message is not supported: every call asks for a new assistant turn"),
  truncate_prompt_tokens: refusedUnless(never, "truncate_prompt_tokens is not supported: the prompt is sent whole"),
};

const TextPart = z.object({ type: z.literal("text"), text: z.string() });
const ImagePart = z.object({
  type: z.literal("image_url"),
  image_url: z.object({ url: z.string().refine(isInlineImage, imageByUrlRefused("a data: URL")), detail: z.string().optional() }),
});
// Audio, files and other parts are refused by name: the engines take text (and images on a multimodal model).
const Part = z.discriminatedUnion("type", [TextPart, ImagePart], partError("text or image_url"));
const Content = stringOrArrayOf(Part, "content parts");
const TextOnlyContent = stringOrArrayOf(z.discriminatedUnion("type", [TextPart], partError("text")), "text parts");

const OpenAIToolCall = z.object({
  id: z.string(),
  type: z.literal("function").default("function"),
  function: z.object({ name: z.string(), arguments: z.string() }),
});

const OpenAIMessage = z.discriminatedUnion("role", [
  z.looseObject({ role: z.literal("system"), content: TextOnlyContent }),
  z.looseObject({ role: z.literal("developer"), content: TextOnlyContent }),
  z.looseObject({ role: z.literal("user"), content: Content, name: z.string().optional() }),
  z.looseObject({
    role: z.literal("assistant"),
    content: Content.nullable().optional(),
    reasoning: z.string().nullable().optional(),
    reasoning_content: z.string().nullable().optional(),
    tool_calls: z.array(OpenAIToolCall).nullable().optional(),
  }),
  z.looseObject({ role: z.literal("tool"), content: TextOnlyContent, tool_call_id: z.string() }),
]);

const OpenAITool = z.object({
  type: z.literal("function"),
  function: z.object({
    name: z.string().min(1),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional(),
    strict: z.boolean().nullable().optional(),
  }),
});

export const OpenAIChatRequest = z.looseObject({
  model: z.string().optional(),
  messages: z.array(OpenAIMessage).min(1, "messages must not be empty"),
  tools: z.array(OpenAITool).optional(),
  tool_choice: z
    .union([
      z.enum(["none", "auto", "required"]),
      z.object({ type: z.literal("function"), function: z.object({ name: z.string() }) }),
    ])
    .optional(),
  temperature: z.number().min(0).max(2).nullable().optional(),
  top_p: z.number().gt(0).max(1).nullable().optional(),
  top_k: z.number().int().nullable().optional(),
  min_p: z.number().min(0).max(1).nullable().optional(),
  max_tokens: z.number().int().positive().nullable().optional(),
  max_completion_tokens: z.number().int().positive().nullable().optional(),
  stop: z.union([z.string(), z.array(z.string())]).nullable().optional(),
  seed: z.number().int().nullable().optional(),
  presence_penalty: z.number().nullable().optional(),
  frequency_penalty: z.number().nullable().optional(),
  repetition_penalty: z.number().nullable().optional(),
  n: z.literal(1, { message: "only n=1 is supported; send n separate requests" }).nullable().optional(),
  stream: z.boolean().nullable().optional(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).nullable().optional(),
  logprobs: z.boolean().nullable().optional(),
  top_logprobs: z.number().int().min(0).max(20).nullable().optional(),
  reasoning_effort: z.string().nullable().optional(),
  chat_template_kwargs: z.looseObject({ enable_thinking: z.boolean().optional() }).nullable().optional(),
  ...UNHONOURED,
});
export type OpenAIChatRequest = z.infer<typeof OpenAIChatRequest>;

export interface OpenAIChatCall {
  canonical: CanonicalChatRequest;
  /** The model name the client sent: given back in responses. */
  clientModel: string;
  includeUsage: boolean;
}

function textOf(content: z.infer<typeof TextOnlyContent>): string {
  return typeof content === "string" ? content : content.map((p) => p.text).join("");
}

function toCanonicalMessage(m: z.infer<typeof OpenAIMessage>): ChatMessage {
  switch (m.role) {
    case "system":
    case "developer":
      return { role: "system", content: textOf(m.content) };
    case "user":
      return { role: "user", content: m.content, ...(m.name ? { name: m.name } : {}) };
    case "assistant": {
      const reasoning = m.reasoning ?? m.reasoning_content ?? null;
      return {
        role: "assistant",
        content: m.content ?? null,
        ...(reasoning !== null ? { reasoning } : {}),
        ...(m.tool_calls && m.tool_calls.length > 0 ? { tool_calls: m.tool_calls } : {}),
      };
    }
    case "tool":
      return { role: "tool", content: textOf(m.content), tool_call_id: m.tool_call_id };
  }
}

/** Parses an OpenAI chat body into the canonical request; throws a ZodError naming bad fields. */
export function fromOpenAIChat(body: unknown): OpenAIChatCall {
  return fromValidOpenAIChat(OpenAIChatRequest.parse(body));
}

/**
 * The canonical request of a body already parsed by OpenAIChatRequest (the gateway's route
 * validates it on the way in: a second parse per call was a measurable share of its CPU). Throws a
 * ZodError for what the schema alone cannot say.
 */
export function fromValidOpenAIChat(req: OpenAIChatRequest): OpenAIChatCall {
  if (req.top_logprobs && !req.logprobs) {
    throw new z.ZodError([
      { code: "custom", path: ["top_logprobs"], message: "top_logprobs requires logprobs: true", input: req.top_logprobs },
    ]);
  }
  const hasTools = (req.tools?.length ?? 0) > 0;
  if (!hasTools && forcesACall(req.tool_choice ?? undefined)) throw noToolToCall(["tool_choice"], req.tool_choice);
  const unoffered = namedToolNotOffered(req.tool_choice ?? undefined, req.tools ?? [], ["tool_choice", "function", "name"]);
  if (unoffered) throw unoffered;
  const sampling: SamplingParams = {};
  if (req.temperature != null) sampling.temperature = req.temperature;
  if (req.top_p != null) sampling.top_p = req.top_p;
  if (req.top_k != null) sampling.top_k = req.top_k;
  if (req.min_p != null) sampling.min_p = req.min_p;
  const maxTokens = req.max_completion_tokens ?? req.max_tokens;
  if (maxTokens != null) sampling.max_tokens = maxTokens;
  if (req.stop != null) sampling.stop = typeof req.stop === "string" ? [req.stop] : req.stop;
  if (req.seed != null) sampling.seed = req.seed;
  if (req.presence_penalty != null) sampling.presence_penalty = req.presence_penalty;
  if (req.frequency_penalty != null) sampling.frequency_penalty = req.frequency_penalty;
  if (req.repetition_penalty != null) sampling.repetition_penalty = req.repetition_penalty;

  let enableThinking = req.chat_template_kwargs?.enable_thinking;
  if (enableThinking === undefined && req.reasoning_effort != null) enableThinking = req.reasoning_effort !== "none";

  const canonical: CanonicalChatRequest = {
    messages: req.messages.map(toCanonicalMessage),
    sampling,
    stream: req.stream === true,
    client_logprobs: req.logprobs ? { top_logprobs: req.top_logprobs ?? 0 } : null,
    ...(req.tools && req.tools.length > 0 ? { tools: req.tools } : {}),
    // Without tools a choice of auto or none says nothing (and vLLM refuses tool_choice without tools).
    ...(req.tool_choice && hasTools ? { tool_choice: req.tool_choice } : {}),
    ...(enableThinking !== undefined ? { enable_thinking: enableThinking } : {}),
    ...(req.chat_template_kwargs ? { chat_template_kwargs: req.chat_template_kwargs } : {}),
    ...(req.reasoning_effort != null ? { reasoning_effort: req.reasoning_effort } : {}),
  };
  return { canonical, clientModel: req.model ?? "", includeUsage: req.stream_options?.include_usage === true };
}

export interface OpenAIResponseContext {
  id: string;
  created: number;
  model: string;
  /** Whether and how many alternatives the client asked to see. */
  clientLogprobs: CanonicalChatRequest["client_logprobs"];
}

function clientLogprobs(logprobs: TokenLogprob[], wanted: OpenAIResponseContext["clientLogprobs"]) {
  if (!wanted) return null;
  return {
    content: logprobs.map((l) => ({ ...l, top_logprobs: l.top_logprobs.slice(0, wanted.top_logprobs) })),
  };
}

/** The non-streaming OpenAI chat response for an engine result (token-id extensions removed). */
export function toOpenAIChatResponse(result: EngineResult, ctx: OpenAIResponseContext) {
  const m = result.message;
  return {
    id: ctx.id,
    object: "chat.completion" as const,
    created: ctx.created,
    model: ctx.model,
    choices: [
      {
        index: 0,
        message: {
          role: "assistant" as const,
          content: m.content,
          ...(m.reasoning !== null ? { reasoning: m.reasoning, reasoning_content: m.reasoning } : {}),
          ...(m.tool_calls.length > 0 ? { tool_calls: m.tool_calls } : {}),
        },
        logprobs: clientLogprobs(result.logprobs, ctx.clientLogprobs),
        finish_reason: result.finish_reason,
      },
    ],
    usage: {
      prompt_tokens: result.usage.prompt_tokens,
      completion_tokens: result.usage.completion_tokens,
      total_tokens: result.usage.prompt_tokens + result.usage.completion_tokens,
      prompt_tokens_details: { cached_tokens: result.usage.cached_tokens },
    },
  };
}

function chunk(ctx: OpenAIResponseContext, choices: unknown[], extra: Record<string, unknown> = {}) {
  return { id: ctx.id, object: "chat.completion.chunk" as const, created: ctx.created, model: ctx.model, choices, ...extra };
}

/**
 * The client chunk for one engine event, or null when the client would not see it (token-only
 * deltas a parser swallowed or a piece of a character, unless the client asked for logprobs; usage
 * the client did not ask for).
 */
export function toOpenAIChatChunk(event: EngineStreamEvent, ctx: OpenAIResponseContext & { includeUsage: boolean }) {
  switch (event.type) {
    case "start":
      return chunk(ctx, [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }]);
    case "delta": {
      const delta: Record<string, unknown> = {};
      if (event.content !== undefined && event.content !== "") delta.content = event.content;
      if (event.reasoning !== undefined && event.reasoning !== "") {
        delta.reasoning = event.reasoning;
        delta.reasoning_content = event.reasoning;
      }
      if (event.tool_calls && event.tool_calls.length > 0) delta.tool_calls = event.tool_calls;
      // A token that shows nothing (a piece of a character, the end-of-turn token, markup a parser
      // holds) still has its logprob: a client that asked for logprobs gets one per generated token,
      // streamed as not, so they stay aligned with the tokens.
      if (Object.keys(delta).length === 0 && (!ctx.clientLogprobs || event.logprobs.length === 0)) return null;
      return chunk(ctx, [
        { index: 0, delta, logprobs: clientLogprobs(event.logprobs, ctx.clientLogprobs), finish_reason: null },
      ]);
    }
    case "finish":
      return chunk(ctx, [{ index: 0, delta: {}, logprobs: null, finish_reason: event.finish_reason }]);
    case "usage":
      if (!ctx.includeUsage) return null;
      return chunk(ctx, [], {
        usage: {
          prompt_tokens: event.usage.prompt_tokens,
          completion_tokens: event.usage.completion_tokens,
          total_tokens: event.usage.prompt_tokens + event.usage.completion_tokens,
          prompt_tokens_details: { cached_tokens: event.usage.cached_tokens },
        },
      });
  }
}

/** OpenAI's error object, which the OpenAI SDKs surface as APIError with status and message. */
export function openAIError(message: string, type: string, code: string | null = null, param: string | null = null) {
  return { error: { message, type, param, code } };
}
