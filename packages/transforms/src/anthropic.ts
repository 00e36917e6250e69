import { z } from "zod";
import type { CanonicalChatRequest, ChatMessage, ContentPart, SamplingParams, ToolCall, ToolChoice, ToolDefinition } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";
import { openReasoning, signReasoning, verifyReasoning } from "./reasoning-seal.js";
import { imageByUrlRefused } from "./content-parts.js";
import { NO_STRUCTURED_OUTPUT, forcesACall, namedToolNotOffered, never, noToolToCall, refusedUnless } from "./unhonoured.js";

/**
 * Anthropic Messages ⇄ canonical chat, both directions, streaming included.
 *
 * Decisions where the Anthropic API has no exact canonical counterpart:
 * - `role: "system"` inside `messages` (Claude Code's mid-conversation system beta) stays a
 *   canonical system message *in place*. Qwen3's template renders a non-first system message as
 *   its own `<|im_start|>system` turn, and keeping it where the agent put it keeps the history
 *   append-only, so every earlier prompt stays a token prefix of the later ones (merging it into
 *   the top system prompt would rewrite the start of the prompt whenever it moved or changed).
 * - Text blocks are joined with "\n" (what vLLM does with arrays of text parts); a message with an
 *   image keeps the canonical array of parts. A base64 image becomes an `image_url` part (a `data:`
 *   URL); an image by url is refused with a 400 (content-parts.ts: the engine would fetch it, and
 *   the rollout would not hold it). Documents with a `text` or `content` source become text; PDF,
 *   url and file documents are refused with a 400: the engines take text, and a placeholder
 *   would silently change what the policy is trained on.
 * - `thinking` blocks are the assistant's reasoning only when their `signature` is one we issued
 *   for this session (`signReasoning` keyed by the session's token hash); a `redacted_thinking`
 *   block counts when its `data` is reasoning we sealed (`sealReasoning`). Anything else
 *   (another provider's thinking, a forged or edited block, no key) is dropped, not refused:
 *   agents replay whatever they hold, and dropping it only means the template renders that turn
 *   without reasoning. `droppedThinking` counts them so the route can log it.
 * - `thinking.type` `enabled` / `adaptive` → `enable_thinking: true`, `disabled` → false (any other type is a 400);
 *   `budget_tokens` and `display` are ignored (thinking is always shown; no engine caps thinking
 *   alone, and refusing the budget would refuse Claude Code, which always sends one). Without `thinking`,
 *   `output_config.effort` asks for thinking (`true`); without either the engine's template
 *   default holds. The effort is also kept as the canonical `reasoning_effort` (the engine's model
 *   profile decides whether it reaches the engine).
 * - Tools with an `input_schema` are offered to the engine (cache_control, defer_loading,
 *   eager_input_streaming are ignored); Anthropic's typed server tools without a schema
 *   (`web_search_20250305`, …) are accepted and not offered.
 * - `tool_result.is_error` has no canonical field: the result text is kept as is (agents already
 *   write the error into it); an empty error result becomes "Error".
 * - Structured output (`output_config.format`, the beta `output_format`) is refused with a 400: the
 *   gateway does not constrain decoding (unhonoured.ts). `tool_choice.disable_parallel_tool_use` is
 *   ignored, as the OpenAI routes ignore `parallel_tool_calls`.
 * - A trailing assistant message (prefill) is passed as a complete assistant turn; the canonical
 *   request has no "continue this message".
 * - `usage.input_tokens` follows Anthropic's meaning: prompt tokens *not* read from the cache
 *   (input_tokens + cache_read_input_tokens = the prompt), so Claude Code's context accounting
 *   is right.
 */

// ---------------------------------------------------------------------------------------------
// Request

const TextBlock = z.looseObject({ type: z.literal("text"), text: z.string() });
const ImageBlock = z.looseObject({
  type: z.literal("image"),
  source: z.discriminatedUnion("type", [
    z.looseObject({ type: z.literal("base64"), media_type: z.string(), data: z.string() }),
    z.looseObject({ type: z.literal("url"), url: z.string() }),
  ]),
});
const DocumentBlock = z.looseObject({
  type: z.literal("document"),
  source: z.looseObject({ type: z.string() }),
  title: z.string().nullable().optional(),
});
const ToolResultContentBlock = z.discriminatedUnion("type", [TextBlock, ImageBlock, DocumentBlock]);
const ToolResultBlock = z.looseObject({
  type: z.literal("tool_result"),
  tool_use_id: z.string(),
  content: z.union([z.string(), z.array(ToolResultContentBlock)]).optional(),
  is_error: z.boolean().nullable().optional(),
});
const ToolUseBlock = z.looseObject({
  type: z.literal("tool_use"),
  id: z.string(),
  name: z.string(),
  input: z.record(z.string(), z.unknown()),
});
const ThinkingBlock = z.looseObject({ type: z.literal("thinking"), thinking: z.string(), signature: z.string().optional() });
const RedactedThinkingBlock = z.looseObject({ type: z.literal("redacted_thinking"), data: z.string() });

const UserBlock = z.discriminatedUnion("type", [TextBlock, ImageBlock, DocumentBlock, ToolResultBlock]);
const AssistantBlock = z.discriminatedUnion("type", [TextBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock]);

const AnthropicMessage = z.discriminatedUnion("role", [
  z.looseObject({ role: z.literal("user"), content: z.union([z.string(), z.array(UserBlock)]) }),
  z.looseObject({ role: z.literal("assistant"), content: z.union([z.string(), z.array(AssistantBlock)]) }),
  z.looseObject({ role: z.literal("system"), content: z.union([z.string(), z.array(TextBlock)]) }),
]);
type AnthropicMessage = z.infer<typeof AnthropicMessage>;

const AnthropicTool = z.looseObject({
  type: z.string().nullable().optional(),
  name: z.string().min(1),
  description: z.string().optional(),
  input_schema: z.record(z.string(), z.unknown()).optional(),
});

const AnthropicToolChoice = z.discriminatedUnion("type", [
  z.looseObject({ type: z.literal("auto") }),
  z.looseObject({ type: z.literal("any") }),
  z.looseObject({ type: z.literal("none") }),
  z.looseObject({ type: z.literal("tool"), name: z.string() }),
]);

export const AnthropicRequest = z.looseObject({
  model: z.string().optional(),
  messages: z.array(AnthropicMessage).min(1, "messages must not be empty"),
  system: z.union([z.string(), z.array(TextBlock)]).optional(),
  tools: z.array(AnthropicTool).optional(),
  tool_choice: AnthropicToolChoice.optional(),
  max_tokens: z.number().int().positive().optional(),
  temperature: z.number().min(0).max(2).nullable().optional(),
  top_p: z.number().gt(0).max(1).nullable().optional(),
  top_k: z.number().int().nullable().optional(),
  stop_sequences: z.array(z.string()).nullable().optional(),
  stream: z.boolean().nullable().optional(),
  thinking: z.looseObject({ type: z.enum(["enabled", "adaptive", "disabled"]), budget_tokens: z.number().int().optional() }).nullable().optional(),
  output_config: z
    .looseObject({ effort: z.string().nullable().optional(), format: refusedUnless(never, `output_config.format: ${NO_STRUCTURED_OUTPUT}`) })
    .nullable()
    .optional(),
  output_format: refusedUnless(never, `output_format: ${NO_STRUCTURED_OUTPUT}`),
  metadata: z.looseObject({}).nullable().optional(),
  context_management: z.unknown().optional(),
});
export type AnthropicRequest = z.infer<typeof AnthropicRequest>;

export interface AnthropicCall {
  canonical: CanonicalChatRequest;
  /** The model name the client sent: given back in responses. */
  clientModel: string;
  /** Thinking blocks dropped because they were not ours (see the module comment). */
  droppedThinking: number;
}

export interface FromAnthropicOptions {
  /** The session's key for thinking signatures (its token hash); without it no thinking block is trusted. */
  reasoningKey?: string;
}

function invalid(path: (string | number)[], message: string): z.ZodError {
  return new z.ZodError([{ code: "custom", path, message, input: undefined }]);
}

type Block = z.infer<typeof UserBlock>;

/** Canonical parts of text / image / document blocks (tool results excluded). */
function partsOf(blocks: Block[], path: (string | number)[]): ContentPart[] {
  const parts: ContentPart[] = [];
  blocks.forEach((b, i) => {
    switch (b.type) {
      case "text":
        parts.push({ type: "text", text: b.text });
        break;
      case "image":
        if (b.source.type !== "base64") throw invalid([...path, i, "source"], imageByUrlRefused("a base64 source"));
        parts.push({ type: "image_url", image_url: { url: `data:${b.source.media_type};base64,${b.source.data}` } });
        break;
      case "document":
        parts.push({ type: "text", text: documentText(b, [...path, i]) });
        break;
      case "tool_result":
        throw invalid([...path, i], "tool_result blocks must be in a user message's content");
    }
  });
  return parts;
}

function documentText(b: z.infer<typeof DocumentBlock>, path: (string | number)[]): string {
  const src = b.source as { type: string; data?: unknown; content?: unknown };
  let text: string | null = null;
  if (src.type === "text" && typeof src.data === "string") text = src.data;
  else if (src.type === "content") {
    if (typeof src.content === "string") text = src.content;
    else if (Array.isArray(src.content)) {
      const texts = src.content.map((c: unknown) =>
        typeof c === "object" && c !== null && (c as { type?: unknown }).type === "text" ? (c as { text?: unknown }).text : undefined,
      );
      if (texts.every((t): t is string => typeof t === "string")) text = texts.join("\n");
    }
  }
  if (text === null) {
    throw invalid([...path, "source"], `document source type "${src.type}" is not supported: only text documents (source text or content) reach the engine`);
  }
  return b.title ? `${b.title}\n\n${text}` : text;
}

/** Parts as canonical content: a string when all text (joined with "\n", as vLLM joins parts). */
function contentOf(parts: ContentPart[]): string | ContentPart[] {
  if (parts.every((p) => p.type === "text")) return parts.map((p) => (p as { text: string }).text).join("\n");
  return parts;
}

function textOf(content: string | z.infer<typeof TextBlock>[]): string {
  return typeof content === "string" ? content : content.map((b) => b.text).join("\n");
}

function userMessages(m: Extract<AnthropicMessage, { role: "user" }>, path: (string | number)[]): ChatMessage[] {
  if (typeof m.content === "string") return [{ role: "user", content: m.content }];
  // Runs of tool_result blocks become tool messages, runs of other blocks a user message, in order.
  const out: ChatMessage[] = [];
  let run: Block[] = [];
  const flush = () => {
    if (run.length > 0) out.push({ role: "user", content: contentOf(partsOf(run, [...path, "content"])) });
    run = [];
  };
  m.content.forEach((b, i) => {
    if (b.type !== "tool_result") {
      run.push(b);
      return;
    }
    flush();
    let content: string | ContentPart[];
    if (b.content === undefined) content = "";
    else if (typeof b.content === "string") content = b.content;
    else content = contentOf(partsOf(b.content, [...path, "content", i, "content"]));
    if (b.is_error && content === "") content = "Error";
    out.push({ role: "tool", content, tool_call_id: b.tool_use_id });
  });
  flush();
  if (out.length === 0) out.push({ role: "user", content: "" });
  return out;
}

/**
 * Tool-use input → the canonical arguments string. JSON.stringify keeps the key order; the engine
 * parses it and re-dumps it Python-style (`json.dumps`) when it renders the history, which gives
 * back the bytes it generated — except where JSON.parse lost information: a float written `1.0`
 * comes back as `1`, so such a turn is no longer a token prefix of the next prompt.
 */
function argumentsOf(input: Record<string, unknown>): string {
  return JSON.stringify(input);
}

function assistantMessage(
  m: Extract<AnthropicMessage, { role: "assistant" }>,
  key: string | undefined,
  dropped: { count: number },
): ChatMessage {
  if (typeof m.content === "string") return { role: "assistant", content: m.content };
  let text = "";
  let texts = 0;
  let blockBetween = false;
  const reasoning: string[] = [];
  const toolCalls: ToolCall[] = [];
  for (const b of m.content) {
    if (b.type === "tool_use") blockBetween = true;
    switch (b.type) {
      case "text":
        // Adjacent text blocks join with "\n" (vLLM's join of text parts); text blocks with a call
        // between them are pieces of one answer a stream split around the call, joined as written.
        text += texts > 0 && !blockBetween ? `\n${b.text}` : b.text;
        texts++;
        blockBetween = false;
        break;
      case "thinking":
        if (key !== undefined && b.signature !== undefined && verifyReasoning(key, b.thinking, b.signature)) reasoning.push(b.thinking);
        else dropped.count++;
        break;
      case "redacted_thinking": {
        const opened = key !== undefined ? openReasoning(key, b.data) : null;
        if (opened !== null) reasoning.push(opened);
        else dropped.count++;
        break;
      }
      case "tool_use":
        toolCalls.push({ id: b.id, type: "function", function: { name: b.name, arguments: argumentsOf(b.input) } });
        break;
    }
  }
  // No text → "" (not null, not "\n\n"): Qwen3's template writes a "\n" before the first tool
  // call only when content is non-empty, and the engine generated none.
  return {
    role: "assistant",
    content: text,
    ...(reasoning.length > 0 ? { reasoning: reasoning.join("\n") } : {}),
    ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
  };
}

function toolChoiceOf(c: z.infer<typeof AnthropicToolChoice>): ToolChoice {
  switch (c.type) {
    case "auto":
      return "auto";
    case "any":
      return "required";
    case "none":
      return "none";
    case "tool":
      return { type: "function", function: { name: c.name } };
  }
}

/** Parses an Anthropic Messages body into the canonical request; throws a ZodError naming bad fields. */
export function fromAnthropic(body: unknown, opts: FromAnthropicOptions = {}): AnthropicCall {
  return fromValidAnthropic(AnthropicRequest.parse(body), opts);
}

/**
 * The canonical request of a body already parsed by AnthropicRequest (the gateway's route
 * validates it on the way in; parsing it twice per call was a measurable share of its CPU).
 */
export function fromValidAnthropic(req: AnthropicRequest, opts: FromAnthropicOptions = {}): AnthropicCall {
  const dropped = { count: 0 };
  const messages: ChatMessage[] = [];
  if (req.system !== undefined) {
    const system = textOf(req.system);
    // An empty system prompt is no system prompt (the template would render an empty turn).
    if (system !== "") messages.push({ role: "system", content: system });
  }
  req.messages.forEach((m, i) => {
    const path = ["messages", i];
    if (m.role === "system") messages.push({ role: "system", content: textOf(m.content) });
    else if (m.role === "user") messages.push(...userMessages(m, path));
    else messages.push(assistantMessage(m, opts.reasoningKey, dropped));
  });

  const tools: ToolDefinition[] = [];
  for (const t of req.tools ?? []) {
    if (!t.input_schema) continue; // a typed server tool (web_search_…): accepted, not offered
    tools.push({
      type: "function",
      function: { name: t.name, ...(t.description !== undefined ? { description: t.description } : {}), parameters: t.input_schema },
    });
  }

  if (req.tool_choice && tools.length === 0 && forcesACall(toolChoiceOf(req.tool_choice))) throw noToolToCall(["tool_choice"], req.tool_choice);
  const unoffered = req.tool_choice ? namedToolNotOffered(toolChoiceOf(req.tool_choice), tools, ["tool_choice", "name"]) : null;
  if (unoffered) throw unoffered;
  const sampling: SamplingParams = {};
  if (req.temperature != null) sampling.temperature = req.temperature;
  if (req.top_p != null) sampling.top_p = req.top_p;
  if (req.top_k != null) sampling.top_k = req.top_k;
  if (req.max_tokens != null) sampling.max_tokens = req.max_tokens;
  if (req.stop_sequences != null && req.stop_sequences.length > 0) sampling.stop = req.stop_sequences;

  let enableThinking: boolean | undefined;
  if (req.thinking != null) enableThinking = req.thinking.type !== "disabled";
  else if (req.output_config?.effort != null) enableThinking = true;

  const canonical: CanonicalChatRequest = {
    messages,
    sampling,
    stream: req.stream === true,
    client_logprobs: null,
    ...(tools.length > 0 ? { tools } : {}),
    ...(req.tool_choice && tools.length > 0 ? { tool_choice: toolChoiceOf(req.tool_choice) } : {}),
    ...(enableThinking !== undefined ? { enable_thinking: enableThinking } : {}),
    ...(req.output_config?.effort != null ? { reasoning_effort: req.output_config.effort } : {}),
  };
  if (canonical.messages.length === 0) throw invalid(["messages"], "messages must not be empty");
  return { canonical, clientModel: req.model ?? "", droppedThinking: dropped.count };
}

// ---------------------------------------------------------------------------------------------
// Response

export interface AnthropicResponseContext {
  /** `msg_…` id of this message. */
  id: string;
  model: string;
  /** The session's key for thinking signatures (its token hash). */
  reasoningKey: string;
}

export type AnthropicStopReason = "end_turn" | "max_tokens" | "tool_use" | "stop_sequence";

/** Anthropic's stop reason for the engine's finish reason (vLLM's `stop_reason` is the matched stop string). */
export function anthropicStopReason(
  finishReason: string,
  stopReason: string | number | null,
  hasToolCalls: boolean,
): { stop_reason: AnthropicStopReason; stop_sequence: string | null } {
  if (finishReason === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  // One of the agent's stop sequences ended the answer, inside a tool call too (the call is cut).
  if (finishReason === "stop" && typeof stopReason === "string") return { stop_reason: "stop_sequence", stop_sequence: stopReason };
  if (hasToolCalls || finishReason === "tool_calls") return { stop_reason: "tool_use", stop_sequence: null };
  return { stop_reason: "end_turn", stop_sequence: null };
}

export function anthropicUsage(u: EngineResult["usage"]) {
  return {
    input_tokens: Math.max(0, u.prompt_tokens - u.cached_tokens),
    output_tokens: u.completion_tokens,
    cache_read_input_tokens: u.cached_tokens,
    cache_creation_input_tokens: 0,
  };
}

function toolInput(args: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(args === "" ? "{}" : args);
    // The hermes parser only yields object arguments; anything else cannot be a tool_use input.
    return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

function toolUseId(id: string, ctx: AnthropicResponseContext, index: number): string {
  return id !== "" ? id : `toolu_${ctx.id.replace(/^msg_/, "")}_${index}`;
}

/** Whether a text block is shown: whitespace beside tool calls (Qwen3's "\n\n" after </think>) is not. */
function showsText(content: string, hasToolCalls: boolean): boolean {
  return content !== "" && (!hasToolCalls || content.trim() !== "");
}

/** The non-streaming Anthropic message for an engine result: [thinking, text, tool_use…]. */
export function toAnthropicResponse(result: EngineResult, ctx: AnthropicResponseContext) {
  const m = result.message;
  const hasToolCalls = m.tool_calls.length > 0;
  const content: Record<string, unknown>[] = [];
  if (m.reasoning) content.push({ type: "thinking", thinking: m.reasoning, signature: signReasoning(ctx.reasoningKey, m.reasoning) });
  if (m.content !== null && showsText(m.content, hasToolCalls)) content.push({ type: "text", text: m.content });
  m.tool_calls.forEach((c, i) =>
    content.push({ type: "tool_use", id: toolUseId(c.id, ctx, i), name: c.function.name, input: toolInput(c.function.arguments) }),
  );
  return {
    id: ctx.id,
    type: "message" as const,
    role: "assistant" as const,
    model: ctx.model,
    content,
    ...anthropicStopReason(result.finish_reason, result.stop_reason, hasToolCalls),
    usage: anthropicUsage(result.usage),
  };
}

// ---------------------------------------------------------------------------------------------
// Errors

export type AnthropicErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "not_found_error"
  | "request_too_large"
  | "rate_limit_error"
  | "api_error"
  | "overloaded_error";

export function anthropicErrorType(status: number): AnthropicErrorType {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 413) return "request_too_large";
  if (status === 429) return "rate_limit_error";
  if (status === 503 || status === 529) return "overloaded_error";
  if (status >= 500) return "api_error";
  return "invalid_request_error";
}

/** Anthropic's error body, which `@anthropic-ai/sdk` surfaces as the APIError subclass of its status. */
export function anthropicError(type: AnthropicErrorType, message: string) {
  return { type: "error" as const, error: { type, message } };
}

/** One SSE frame as Anthropic writes it: `event: <type>` then the JSON data. */
export function anthropicSseFrame(event: string, data: unknown): string {
  return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

// ---------------------------------------------------------------------------------------------
// Streaming

type OpenBlock =
  | { kind: "thinking"; index: number }
  | { kind: "text"; index: number }
  | { kind: "tool_use"; index: number; engineIndex: number };

/**
 * Re-encodes the engine's stream events as Anthropic's SSE event sequence: `message_start`,
 * `ping`, then per block `content_block_start` / `content_block_delta`… / `content_block_stop`
 * (a thinking block gets its `signature_delta` just before it stops), and from `end()`
 * `message_delta` (stop reason, usage) and `message_stop`. Each call returns the frames to write
 * (possibly "").
 *
 * The content blocks are the same as `toAnthropicResponse` gives for the accumulated result:
 * whitespace-only text is held back until something visible follows it, and dropped when a tool
 * call comes instead.
 */
export class AnthropicStreamEncoder {
  private started = false;
  private nextIndex = 0;
  private open: OpenBlock | null = null;
  private reasoning = "";
  private pendingText = "";
  private readonly toolBlocks = new Map<number, number>();
  /** Per tool block: its arguments are a JSON object, are not, or are only whitespace so far (held). */
  private readonly toolArgs = new Map<number, { kind: "object" } | { kind: "other" } | { kind: "pending"; held: string }>();
  private sawToolCall = false;
  private finish: { finish_reason: string; stop_reason: string | number | null } | null = null;
  private usage: EngineResult["usage"] | null = null;
  private promptTokens = 0;
  private outputTokens = 0;
  private ended = false;

  constructor(private readonly ctx: AnthropicResponseContext) {}

  push(event: EngineStreamEvent): string {
    let out = "";
    switch (event.type) {
      case "start":
        this.promptTokens = event.prompt_ids.length;
        out += this.start();
        break;
      case "delta":
        out += this.start();
        this.outputTokens += event.token_ids.length;
        if (event.reasoning) out += this.reasoningDelta(event.reasoning);
        if (event.content) out += this.textDelta(event.content);
        for (const t of event.tool_calls ?? []) out += this.toolDelta(t);
        break;
      case "finish":
        out += this.start();
        this.finish = { finish_reason: event.finish_reason, stop_reason: event.stop_reason };
        break;
      case "usage":
        this.usage = event.usage;
        break;
    }
    return out;
  }

  /** The closing frames: any open block stops, then `message_delta` and `message_stop`. */
  end(): string {
    if (this.ended) return "";
    this.ended = true;
    let out = this.start();
    if (this.pendingText !== "" && !this.sawToolCall) out += this.openText();
    out += this.closeOpen();
    const finish = this.finish ?? { finish_reason: "stop", stop_reason: null };
    const usage = anthropicUsage(
      this.usage ?? { prompt_tokens: this.promptTokens, completion_tokens: this.outputTokens, cached_tokens: 0 },
    );
    out += anthropicSseFrame("message_delta", {
      type: "message_delta",
      delta: anthropicStopReason(finish.finish_reason, finish.stop_reason, this.sawToolCall),
      usage,
    });
    out += anthropicSseFrame("message_stop", { type: "message_stop" });
    return out;
  }

  /** An in-stream failure: Anthropic's `error` event (the stream ends after it). */
  error(status: number, message: string): string {
    this.ended = true;
    return anthropicSseFrame("error", anthropicError(anthropicErrorType(status), message));
  }

  private start(): string {
    if (this.started) return "";
    this.started = true;
    const message = {
      id: this.ctx.id,
      type: "message",
      role: "assistant",
      model: this.ctx.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      // Cache reads are only known at the end; message_delta carries the final counts.
      usage: { input_tokens: this.promptTokens, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 },
    };
    return anthropicSseFrame("message_start", { type: "message_start", message }) + anthropicSseFrame("ping", { type: "ping" });
  }

  private blockStart(block: OpenBlock, contentBlock: Record<string, unknown>): string {
    this.open = block;
    return anthropicSseFrame("content_block_start", { type: "content_block_start", index: block.index, content_block: contentBlock });
  }

  private delta(delta: Record<string, unknown>): string {
    return anthropicSseFrame("content_block_delta", { type: "content_block_delta", index: this.open!.index, delta });
  }

  private closeOpen(): string {
    const block = this.open;
    if (!block) return "";
    let out = "";
    if (block.kind === "thinking") {
      out += this.delta({ type: "signature_delta", signature: signReasoning(this.ctx.reasoningKey, this.reasoning) });
    }
    this.open = null;
    return out + anthropicSseFrame("content_block_stop", { type: "content_block_stop", index: block.index });
  }

  private reasoningDelta(text: string): string {
    let out = "";
    if (this.open?.kind !== "thinking") {
      out += this.closeOpen();
      this.reasoning = "";
      out += this.blockStart({ kind: "thinking", index: this.nextIndex++ }, { type: "thinking", thinking: "", signature: "" });
    }
    this.reasoning += text;
    return out + this.delta({ type: "thinking_delta", thinking: text });
  }

  private openText(): string {
    let out = "";
    if (this.open?.kind !== "text") {
      out += this.closeOpen();
      out += this.blockStart({ kind: "text", index: this.nextIndex++ }, { type: "text", text: "" });
    }
    out += this.delta({ type: "text_delta", text: this.pendingText });
    this.pendingText = "";
    return out;
  }

  private textDelta(text: string): string {
    this.pendingText += text;
    // Whitespace alone is held: beside a tool call it is not shown (see showsText).
    if (this.open?.kind !== "text" && this.pendingText.trim() === "") return "";
    return this.openText();
  }

  private toolDelta(t: NonNullable<Extract<EngineStreamEvent, { type: "delta" }>["tool_calls"]>[number]): string {
    let out = "";
    this.sawToolCall = true;
    // Held whitespace before (or between) tool calls is not shown; visible text was sent already.
    this.pendingText = "";
    let blockIndex = this.toolBlocks.get(t.index);
    if (blockIndex === undefined) {
      out += this.closeOpen();
      blockIndex = this.nextIndex++;
      this.toolBlocks.set(t.index, blockIndex);
      out += this.blockStart(
        { kind: "tool_use", index: blockIndex, engineIndex: t.index },
        { type: "tool_use", id: toolUseId(t.id ?? "", this.ctx, t.index), name: t.function?.name ?? "", input: {} },
      );
    } else if (this.open?.index !== blockIndex) {
      // A fragment for an earlier call after another block opened: Anthropic blocks do not interleave.
      return out;
    }
    const args = t.function?.arguments;
    if (args) out += this.argsDelta(blockIndex, args);
    return out;
  }

  /**
   * A call's arguments as `input_json_delta`s, only when they are a JSON object: a tool_use input is
   * one, and arguments the model wrote as a string, a number or an array are `{}` (toolInput), streamed
   * or not. Leading whitespace is held until the first character tells which.
   */
  private argsDelta(blockIndex: number, args: string): string {
    const state = this.toolArgs.get(blockIndex) ?? { kind: "pending", held: "" };
    if (state.kind === "other") return "";
    if (state.kind === "object") return this.delta({ type: "input_json_delta", partial_json: args });
    const seen = state.held + args;
    const start = seen.trimStart();
    if (start === "") {
      this.toolArgs.set(blockIndex, { kind: "pending", held: seen });
      return "";
    }
    if (!start.startsWith("{")) {
      this.toolArgs.set(blockIndex, { kind: "other" });
      return "";
    }
    this.toolArgs.set(blockIndex, { kind: "object" });
    return this.delta({ type: "input_json_delta", partial_json: seen });
  }
}

export type AnthropicResponse = ReturnType<typeof toAnthropicResponse>;
