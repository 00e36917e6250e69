import { z } from "zod";
import type {
  CanonicalChatRequest,
  ChatMessage,
  ContentPart,
  SamplingParams,
  TokenLogprob,
  ToolCall,
  ToolChoice,
  ToolDefinition,
} from "@rollgate/protocol";
import { StreamAccumulator } from "./accumulate.js";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";
import { openReasoning, sealReasoning } from "./reasoning-seal.js";
import { reasoningTokensOf } from "./reasoning-tokens.js";
import { imageByUrlRefused, isInlineImage, partError, stringOrArrayOf } from "./content-parts.js";
import { NO_STRUCTURED_OUTPUT, NO_TOOL_TO_CALL, forcesACall, isTextFormat, namedToolNotOffered, refusedUnless } from "./unhonoured.js";

/**
 * OpenAI Responses API ⇄ canonical chat. What Codex CLI (Responses only), opencode and pi send.
 *
 * Rules where OpenAI's API has no counterpart in a self-hosted engine (each one a decision):
 * - **No server-side state.** `store` is accepted and ignored: nothing is ever stored, so
 *   `previous_response_id` and `conversation` are refused with a 400 asking the client to resend
 *   the whole conversation in `input` (Codex, opencode and pi all do, with `store: false`).
 * - **Namespaces.** A `namespace` tool N with nested function f is offered to the engine as the
 *   plain function `N__f` (see `namespacedToolName`); a call the model makes to `N__f` goes back
 *   to the client as `{name: "f", namespace: "N"}`, and a replayed `function_call` carrying
 *   `namespace` maps to `N__f` again, so the engine re-renders what it generated.
 * - **Hosted tools** (`web_search`, `file_search`, `code_interpreter`, `image_generation`, `mcp`,
 *   `custom`, …) are accepted and not offered to the engine: it cannot run them. A `tool_choice`
 *   naming one becomes the engine's default, unless no function tool is offered at all: then it,
 *   like `required`, is a 400 (the model could only answer in text where the agent forced a call).
 * - **allowed_tools.** A `tool_choice` of type `allowed_tools` offers only the functions it lists
 *   (as the Gemini route offers only ANY's allowed names), with its mode (auto / required).
 * - **Thinking.** `reasoning.effort` "none" or "minimal" → `enable_thinking: false`; any other
 *   of OpenAI's efforts → true (one OpenAI does not list is a 400); no effort → the chat template's default. The effort itself is kept as the
 *   canonical `reasoning_effort` (forwarded where the model profile says the model reads it).
 * - **Reasoning items.** The engine's reasoning (Qwen3 `<think>`) is given to the client as one
 *   `summary_text` part of a `reasoning` item (streamed as `response.reasoning_summary_*`, which
 *   Codex shows by default), and always with `encrypted_content`: the reasoning sealed with the
 *   session's key (`sealReasoning`), whether or not `include` asked for it, because clients that
 *   do not store responses replay only what they were given. On replay the sealed text is the
 *   only source of truth: a reasoning item we cannot open is ignored, its summary never trusted.
 * - **One model turn = one assistant message.** Consecutive reasoning / assistant message /
 *   function_call items fold into one canonical assistant message (content = the text, or ""),
 *   so the engine re-renders exactly what it generated. A new turn starts at a reasoning item
 *   after text or calls; a message after calls belongs to their turn (a streamed answer gives text
 *   written after a call as a message item after it), a tool output or user message ends the turn.
 * - **Template whitespace.** Qwen3's `\n\n` after `</think>` is not shown: text after reasoning
 *   loses its leading newlines (the chat template's `content.lstrip('\n')` restores the same tokens
 *   on replay), and whitespace-only text beside tool calls is no message item (the echoed-history
 *   normaliser drops it on replay anyway).
 * - `max_output_tokens` → `max_tokens`; a length stop is `status: "incomplete"` with
 *   `incomplete_details.reason: "max_output_tokens"` (`response.incomplete` when streaming).
 * - **Logprobs.** `include: ["message.output_text.logprobs"]` (with `top_logprobs` 0–20) asks the
 *   engine for them; without that include `logprobs` stays `[]` (`top_logprobs` alone asks nothing).
 *   An `output_text` carries the logprobs of its own tokens only, one per token, the engine's values:
 *   not the reasoning's, its end marker's, the template's newlines after it (not shown), the tool
 *   calls' or the stop token's. A token that shows no text on its own (a piece of a character) is
 *   given with the text delta that shows its character; one that never shows text of the message
 *   (the stop token, markup before a call) is in no `output_text`. Not streamed, the text is found
 *   among the tokens' texts (`textTokens`: a split character's pieces read U+FFFD, as vLLM spells
 *   them). Without token text the text's tokens cannot be told: `logprobs` is `[]` (a branch's replayed
 *   answer has its tokens spelled by the gateway when logprobs are asked).
 * - `text.format` json_schema / json_object (structured output) is refused with a 400: the gateway
 *   does not constrain decoding, and an answer that ignored the schema would be trained as if it had
 *   followed it (unhonoured.ts). `{type: "text"}` is accepted.
 * - The sampling extensions vLLM's Responses route reads (`top_k`, `min_p`, `repetition_penalty`,
 *   `seed`, `stop`, `presence_penalty`, `frequency_penalty`) are honoured like the chat route's.
 * - `truncation`, `prompt_cache_key`, `metadata`, `text.verbosity`, … are accepted and ignored.
 */

// ---------------------------------------------------------------------------------------------
// Request

/** The canonical (engine-side) name of function `name` inside namespace tool `namespace`. */
export function namespacedToolName(namespace: string, name: string): string {
  return `${namespace}__${name}`;
}

const TextPart = z.looseObject({ type: z.literal("input_text"), text: z.string() });
const OutputTextPart = z.looseObject({ type: z.literal("output_text"), text: z.string() });
const RefusalPart = z.looseObject({ type: z.literal("refusal"), refusal: z.string() });
const ImagePart = z.looseObject({
  type: z.literal("input_image"),
  image_url: z.string({ message: "only images given by image_url are supported (no file_id)" }).refine(isInlineImage, imageByUrlRefused("a data: URL")),
  detail: z.string().nullable().optional(),
});
const InputPart = z.discriminatedUnion("type", [TextPart, ImagePart, OutputTextPart, RefusalPart], partError("input_text or input_image"));
const ToolOutputPart = z.discriminatedUnion("type", [TextPart, ImagePart], partError("input_text or input_image"));

const MessageItem = z.looseObject({
  type: z.literal("message"),
  role: z.enum(["user", "system", "developer", "assistant"]),
  content: stringOrArrayOf(InputPart, "content parts"),
});
const FunctionCallItem = z.looseObject({
  type: z.literal("function_call"),
  call_id: z.string().min(1),
  name: z.string().min(1),
  namespace: z.string().nullable().optional(),
  arguments: z.string(),
});
const FunctionCallOutputItem = z.looseObject({
  type: z.literal("function_call_output"),
  call_id: z.string().min(1),
  output: stringOrArrayOf(ToolOutputPart, "content parts"),
});
const ReasoningItem = z.looseObject({
  type: z.literal("reasoning"),
  encrypted_content: z.string().nullable().optional(),
});
const ItemReference = z.looseObject({ type: z.literal("item_reference") }).refine(() => false, {
  message: "item_reference is not supported: this gateway stores no items; send the item itself",
});

const SUPPORTED_ITEMS = "message, function_call, function_call_output or reasoning";
const InputItem = z.preprocess(
  // EasyInputMessage: `{role, content}` without a type.
  (v) => (v && typeof v === "object" && !Array.isArray(v) && !("type" in v) && "role" in v ? { ...v, type: "message" } : v),
  z.discriminatedUnion("type", [MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem, ItemReference], {
    error: (iss) => (iss.code === "invalid_union" ? `unsupported input item type; expected ${SUPPORTED_ITEMS}` : undefined),
  }),
);
type InputItem = z.infer<typeof InputItem>;

const FunctionTool = z.looseObject({
  type: z.literal("function"),
  name: z.string().min(1),
  description: z.string().nullable().optional(),
  parameters: z.record(z.string(), z.unknown()).nullable().optional(),
  strict: z.boolean().nullable().optional(),
});
const NamespaceTool = z.looseObject({
  type: z.literal("namespace"),
  name: z.string().min(1),
  description: z.string().nullable().optional(),
  tools: z.array(z.looseObject({ type: z.string() })),
});
/** Any tool: function and namespace tools are checked; hosted tools of any other type pass. */
const AnyTool = z.looseObject({ type: z.string() }).superRefine((tool, ctx) => {
  const check = (schema: z.ZodType, value: unknown, prefix: PropertyKey[]) => {
    const r = schema.safeParse(value);
    if (!r.success) for (const i of r.error.issues) ctx.addIssue({ code: "custom", message: i.message, path: [...prefix, ...i.path] });
  };
  if (tool.type === "function") check(FunctionTool, tool, []);
  if (tool.type === "namespace") {
    check(NamespaceTool, tool, []);
    const inner = Array.isArray(tool.tools) ? (tool.tools as { type?: unknown }[]) : [];
    inner.forEach((t, k) => {
      if (t && t.type === "function") check(FunctionTool, t, ["tools", k]);
    });
  }
});

const ToolChoiceParam = z.union([
  z.enum(["none", "auto", "required"]),
  z.looseObject({ type: z.literal("function"), name: z.string(), namespace: z.string().nullable().optional() }),
  z.looseObject({ type: z.literal("allowed_tools"), mode: z.enum(["auto", "required"]) }),
  z.looseObject({ type: z.string() }),
]);

const unsupportedState = (field: string) =>
  z
    .unknown()
    .optional()
    .refine((v) => v === undefined || v === null, {
      message: `${field} is not supported: this gateway stores no responses (store is always false); resend the whole conversation in input`,
    });

/** The efforts OpenAI's API (and its SDK's `ReasoningEffort`) takes. */
const REASONING_EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "max"] as const;

export const OpenAIResponsesRequest = z.looseObject({
  model: z.string().nullable().optional(),
  instructions: z.string().nullable().optional(),
  input: stringOrArrayOf(InputItem, "input items"),
  tools: z.array(AnyTool).nullable().optional(),
  tool_choice: ToolChoiceParam.nullable().optional(),
  parallel_tool_calls: z.boolean().nullable().optional(),
  reasoning: z
    .looseObject({ effort: z.enum(REASONING_EFFORTS).nullable().optional(), summary: z.string().nullable().optional() })
    .nullable()
    .optional(),
  include: z.array(z.string()).nullable().optional(),
  top_logprobs: z.number().int().min(0).max(20).nullable().optional(),
  store: z.boolean().nullable().optional(),
  previous_response_id: unsupportedState("previous_response_id"),
  conversation: unsupportedState("conversation"),
  max_output_tokens: z.number().int().positive().nullable().optional(),
  temperature: z.number().min(0).max(2).nullable().optional(),
  top_p: z.number().gt(0).max(1).nullable().optional(),
  // vLLM's sampling extensions of the Responses request.
  top_k: z.number().int().nullable().optional(),
  min_p: z.number().min(0).max(1).nullable().optional(),
  repetition_penalty: z.number().nullable().optional(),
  presence_penalty: z.number().nullable().optional(),
  frequency_penalty: z.number().nullable().optional(),
  seed: z.number().int().nullable().optional(),
  stop: z.union([z.string(), z.array(z.string())]).nullable().optional(),
  text: z
    .looseObject({ format: refusedUnless(isTextFormat, `text.format: ${NO_STRUCTURED_OUTPUT}`) })
    .nullable()
    .optional(),
  stream: z.boolean().nullable().optional(),
});
export type OpenAIResponsesRequest = z.infer<typeof OpenAIResponsesRequest>;

/** A canonical function name that came from a namespace tool, for mapping calls back. */
export interface NamespacedName {
  namespace: string;
  name: string;
}

export interface ResponsesCall {
  canonical: CanonicalChatRequest;
  /** The model name the client sent: given back in responses. */
  clientModel: string;
  /** Canonical names of flattened namespace functions → their namespace and own name. */
  namespaced: Map<string, NamespacedName>;
  /** Echoed on the response object. */
  echo: ResponsesEcho;
}

/** Request fields the response object repeats, as OpenAI's does. */
export interface ResponsesEcho {
  parallel_tool_calls: boolean;
  tool_choice: unknown;
  temperature: number | null;
  top_p: number | null;
  max_output_tokens: number | null;
  reasoning: { effort: string | null; summary: string | null };
}

function zodFail(path: PropertyKey[], message: string, input: unknown): never {
  throw new z.ZodError([{ code: "custom", path, message, input }]);
}

function toContentParts(parts: z.infer<typeof InputPart>[]): ContentPart[] {
  return parts.map((p): ContentPart => {
    switch (p.type) {
      case "input_text":
      case "output_text":
        return { type: "text", text: p.text };
      case "refusal":
        return { type: "text", text: p.refusal };
      case "input_image":
        return { type: "image_url", image_url: { url: p.image_url, ...(p.detail ? { detail: p.detail } : {}) } };
    }
  });
}

/** Content as the canonical form keeps it: strings stay strings, parts stay parts (vLLM joins text parts with "\n"). */
function messageContent(content: string | z.infer<typeof InputPart>[]): string | ContentPart[] {
  return typeof content === "string" ? content : toContentParts(content);
}

/** An assistant turn's text: the output_text parts we gave, joined back into the one string the engine produced. */
function assistantText(content: string | z.infer<typeof InputPart>[], path: PropertyKey[]): string {
  if (typeof content === "string") return content;
  return content
    .map((p, k) => {
      if (p.type === "input_image") zodFail([...path, k], "assistant messages cannot carry images", p);
      return p.type === "refusal" ? p.refusal : p.text;
    })
    .join("");
}

interface AssistantTurn {
  content: string | null;
  reasoning: string | null;
  tool_calls: ToolCall[];
}

/** Folds the items of a conversation into canonical messages (see the module comment). */
function toCanonicalMessages(instructions: string | null | undefined, input: string | InputItem[], reasoningKey: string | undefined): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (instructions) messages.push({ role: "system", content: instructions });
  if (typeof input === "string") {
    messages.push({ role: "user", content: input });
    return messages;
  }
  let turn: AssistantTurn | null = null;
  const flush = () => {
    if (!turn) return;
    const t: AssistantTurn = turn;
    turn = null;
    if (t.content === null && t.reasoning === null && t.tool_calls.length === 0) return; // only unreadable reasoning
    messages.push({
      role: "assistant",
      content: t.content ?? "",
      ...(t.reasoning !== null ? { reasoning: t.reasoning } : {}),
      ...(t.tool_calls.length > 0 ? { tool_calls: t.tool_calls } : {}),
    });
  };
  const open = (): AssistantTurn => (turn ??= { content: null, reasoning: null, tool_calls: [] });

  input.forEach((item, i) => {
    switch (item.type) {
      case "reasoning": {
        if (turn && (turn.content !== null || turn.tool_calls.length > 0 || turn.reasoning !== null)) flush();
        const t = open();
        const text = reasoningKey && item.encrypted_content ? openReasoning(reasoningKey, item.encrypted_content) : null;
        if (text !== null) t.reasoning = text;
        break;
      }
      case "function_call": {
        const name = item.namespace ? namespacedToolName(item.namespace, item.name) : item.name;
        open().tool_calls.push({ id: item.call_id, type: "function", function: { name, arguments: item.arguments } });
        break;
      }
      case "message": {
        if (item.role === "assistant") {
          // A message right after calls (no output between) is still the same answer: a streamed
          // answer gives text the model wrote after a call as a message item after it.
          const t = open();
          const text = assistantText(item.content, ["input", i, "content"]);
          t.content = (t.content ?? "") + text;
          break;
        }
        flush();
        const content = messageContent(item.content);
        if (item.role === "user") messages.push({ role: "user", content });
        else messages.push({ role: "system", content });
        break;
      }
      case "function_call_output":
        flush();
        messages.push({
          role: "tool",
          tool_call_id: item.call_id,
          content: typeof item.output === "string" ? item.output : toContentParts(item.output),
        });
        break;
      case "item_reference":
        break; // refused by the schema
    }
  });
  flush();
  return messages;
}

function toCanonicalTools(tools: z.infer<typeof AnyTool>[]): { tools: ToolDefinition[]; namespaced: Map<string, NamespacedName> } {
  const out: ToolDefinition[] = [];
  const namespaced = new Map<string, NamespacedName>();
  const seen = new Set<string>();
  const add = (fn: z.infer<typeof FunctionTool>, name: string, path: PropertyKey[]) => {
    if (seen.has(name)) zodFail(path, `tool name ${name} is declared twice`, name);
    seen.add(name);
    out.push({
      type: "function",
      function: {
        name,
        ...(fn.description != null ? { description: fn.description } : {}),
        ...(fn.parameters != null ? { parameters: fn.parameters } : {}),
        ...(fn.strict != null ? { strict: fn.strict } : {}),
      },
    });
  };
  tools.forEach((tool, i) => {
    if (tool.type === "function") {
      const fn = FunctionTool.parse(tool);
      add(fn, fn.name, ["tools", i, "name"]);
    }
    else if (tool.type === "namespace") {
      const ns = NamespaceTool.parse(tool);
      ns.tools.forEach((inner, k) => {
        if (inner.type !== "function") return; // hosted tools inside a namespace: not offered either
        const fn = FunctionTool.parse(inner);
        const name = namespacedToolName(ns.name, fn.name);
        add(fn, name, ["tools", i, "tools", k, "name"]);
        namespaced.set(name, { namespace: ns.name, name: fn.name });
      });
    }
    // Hosted tools: accepted, not offered to the engine.
  });
  return { tools: out, namespaced };
}

/**
 * The function tools an `allowed_tools` choice lets the model call: only those are offered, as the
 * Gemini route offers only ANY's allowed names (left as declared, the model could call one the agent
 * did not allow). An allowed tool that was never declared is a 400; hosted tools in the list allow
 * nothing the engine can call; an empty or missing list restricts nothing.
 */
function allowedTools(tools: ToolDefinition[], choice: OpenAIResponsesRequest["tool_choice"]): ToolDefinition[] {
  if (choice == null || typeof choice === "string" || choice.type !== "allowed_tools") return tools;
  const listed = (choice as { tools?: unknown }).tools;
  if (!Array.isArray(listed) || listed.length === 0) return tools;
  const names = new Set<string>();
  listed.forEach((t: unknown, i) => {
    const fn = t as { type?: unknown; name?: unknown; namespace?: unknown };
    if (fn?.type !== "function" || typeof fn.name !== "string") return;
    const name = typeof fn.namespace === "string" && fn.namespace ? namespacedToolName(fn.namespace, fn.name) : fn.name;
    if (!tools.some((d) => d.function.name === name)) zodFail(["tool_choice", "tools", i, "name"], `allowed tool ${fn.name} is not declared in tools`, fn.name);
    names.add(name);
  });
  return tools.filter((d) => names.has(d.function.name));
}

/** A tool_choice forcing a hosted tool (web_search, …): one the engine is never offered. */
function namesHostedTool(choice: OpenAIResponsesRequest["tool_choice"]): boolean {
  return choice != null && typeof choice !== "string" && choice.type !== "function" && choice.type !== "allowed_tools";
}

function toCanonicalToolChoice(choice: OpenAIResponsesRequest["tool_choice"]): ToolChoice | undefined {
  if (choice == null) return undefined;
  if (typeof choice === "string") return choice;
  if (choice.type === "function" && typeof choice.name === "string") {
    const ns = typeof choice.namespace === "string" && choice.namespace ? choice.namespace : null;
    return { type: "function", function: { name: ns ? namespacedToolName(ns, choice.name) : choice.name } };
  }
  if (choice.type === "allowed_tools" && (choice.mode === "auto" || choice.mode === "required")) return choice.mode;
  return undefined; // a hosted tool: the engine's default
}

export interface FromResponsesOptions {
  /** The session's key for opening `encrypted_content` we issued; without it reasoning items are ignored. */
  reasoningKey?: string;
}

/** The `include` entry by which a client asks for its text's logprobs. */
const OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs";

/** Parses an OpenAI Responses body into the canonical request; throws a ZodError naming bad fields. */
export function fromResponses(body: unknown, options: FromResponsesOptions = {}): ResponsesCall {
  const req = OpenAIResponsesRequest.parse(body);
  const messages = toCanonicalMessages(req.instructions, req.input, options.reasoningKey);
  if (messages.length === 0) zodFail(["input"], "input must hold at least one message", req.input);

  const sampling: SamplingParams = {};
  if (req.temperature != null) sampling.temperature = req.temperature;
  if (req.top_p != null) sampling.top_p = req.top_p;
  if (req.max_output_tokens != null) sampling.max_tokens = req.max_output_tokens;
  if (req.top_k != null) sampling.top_k = req.top_k;
  if (req.min_p != null) sampling.min_p = req.min_p;
  if (req.repetition_penalty != null) sampling.repetition_penalty = req.repetition_penalty;
  if (req.presence_penalty != null) sampling.presence_penalty = req.presence_penalty;
  if (req.frequency_penalty != null) sampling.frequency_penalty = req.frequency_penalty;
  if (req.seed != null) sampling.seed = req.seed;
  if (req.stop != null) sampling.stop = typeof req.stop === "string" ? [req.stop] : req.stop;

  const declared = toCanonicalTools(req.tools ?? []);
  const { namespaced } = declared;
  const tools = allowedTools(declared.tools, req.tool_choice);
  const choice = toCanonicalToolChoice(req.tool_choice);
  if (tools.length === 0 && (forcesACall(choice) || namesHostedTool(req.tool_choice))) zodFail(["tool_choice"], NO_TOOL_TO_CALL, req.tool_choice);
  const toolChoice = tools.length > 0 ? choice : undefined;
  const named = req.tool_choice != null && typeof req.tool_choice === "object" ? req.tool_choice : null;
  const shownName = typeof named?.namespace === "string" && named.namespace ? `${String(named.name)} (namespace ${named.namespace})` : undefined;
  const unoffered = namedToolNotOffered(toolChoice, tools, ["tool_choice", "name"], shownName);
  if (unoffered) throw unoffered;
  const effort = req.reasoning?.effort ?? null;
  const enableThinking = effort === null ? undefined : effort !== "none" && effort !== "minimal";

  const canonical: CanonicalChatRequest = {
    messages,
    sampling,
    stream: req.stream === true,
    client_logprobs: req.include?.includes(OUTPUT_TEXT_LOGPROBS) ? { top_logprobs: req.top_logprobs ?? 0 } : null,
    ...(tools.length > 0 ? { tools } : {}),
    ...(toolChoice !== undefined ? { tool_choice: toolChoice } : {}),
    ...(enableThinking !== undefined ? { enable_thinking: enableThinking } : {}),
    ...(effort !== null ? { reasoning_effort: effort } : {}),
  };
  return {
    canonical,
    clientModel: req.model ?? "",
    namespaced,
    echo: {
      parallel_tool_calls: req.parallel_tool_calls ?? true,
      tool_choice: req.tool_choice ?? "auto",
      temperature: req.temperature ?? null,
      top_p: req.top_p ?? null,
      max_output_tokens: req.max_output_tokens ?? null,
      reasoning: { effort, summary: req.reasoning?.summary ?? null },
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Response

export interface ResponsesContext {
  /** `resp_…`; item ids are derived from it. */
  id: string;
  /** Unix seconds. */
  createdAt: number;
  model: string;
  /** The session's key for sealing reasoning into `encrypted_content`. */
  reasoningKey: string;
  namespaced: Map<string, NamespacedName>;
  echo: ResponsesEcho;
  /**
   * The text of the output token that ends reasoning in this model's format (its model profile's,
   * `</think>` for Qwen3): reasoning tokens are counted up to it. Absent or null: not countable, 0.
   */
  reasoningEnd?: string | null;
  /** The client asked for its text's logprobs (`include: ["message.output_text.logprobs"]`); absent or null: `logprobs: []`. */
  clientLogprobs?: CanonicalChatRequest["client_logprobs"];
}

/** One token of an `output_text`: the engine's entry, its `top_logprobs` cut to what the client asked. */
export type ResponsesLogprob = TokenLogprob;

export interface ResponsesUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number };
  output_tokens: number;
  output_tokens_details: { reasoning_tokens: number };
  total_tokens: number;
}

export type ResponsesOutputItem =
  | { id: string; type: "reasoning"; summary: { type: "summary_text"; text: string }[]; encrypted_content?: string; status?: string }
  | {
      id: string;
      type: "message";
      status: "in_progress" | "completed" | "incomplete";
      role: "assistant";
      content: { type: "output_text"; text: string; annotations: []; logprobs: ResponsesLogprob[] }[];
    }
  | {
      id: string;
      type: "function_call";
      status: "in_progress" | "completed" | "incomplete";
      call_id: string;
      name: string;
      namespace?: string;
      arguments: string;
    };

export interface ResponsesObject {
  id: string;
  object: "response";
  created_at: number;
  status: "in_progress" | "completed" | "incomplete" | "failed";
  error: { code: string; message: string } | null;
  incomplete_details: { reason: string } | null;
  model: string;
  output: ResponsesOutputItem[];
  parallel_tool_calls: boolean;
  tool_choice: unknown;
  temperature: number | null;
  top_p: number | null;
  max_output_tokens: number | null;
  previous_response_id: null;
  reasoning: ResponsesEcho["reasoning"];
  store: false;
  text: { format: { type: "text" } };
  truncation: "disabled";
  metadata: Record<string, string>;
  usage: ResponsesUsage | null;
}

const idBase = (ctx: ResponsesContext) => ctx.id.replace(/^resp_/, "");
const reasoningId = (ctx: ResponsesContext) => `rs_${idBase(ctx)}`;
const messageId = (ctx: ResponsesContext) => `msg_${idBase(ctx)}`;
const callItemId = (ctx: ResponsesContext, k: number) => `fc_${idBase(ctx)}_${k}`;

/**
 * Output tokens spent reasoning (reasoningTokensOf: the count a replayed answer's usage carries, else
 * counted from token text); 0 when not countable (no reasoning, or no token text and no count).
 */
function reasoningTokens(result: EngineResult, end: string | null | undefined): number {
  return reasoningTokensOf(result, end) ?? 0;
}

export function toResponsesUsage(result: EngineResult, reasoningEnd?: string | null): ResponsesUsage {
  const u = result.usage;
  return {
    input_tokens: u.prompt_tokens,
    input_tokens_details: { cached_tokens: u.cached_tokens },
    output_tokens: u.completion_tokens,
    output_tokens_details: { reasoning_tokens: reasoningTokens(result, reasoningEnd) },
    total_tokens: u.prompt_tokens + u.completion_tokens,
  };
}

function isIncomplete(finishReason: string): boolean {
  return finishReason === "length";
}

/** Whether the answer's text is shown as a message item (not whitespace beside tool calls). */
function showsText(content: string | null, hasCalls: boolean): content is string {
  return content !== null && content !== "" && !(hasCalls && content.trim() === "");
}

function callItem(ctx: ResponsesContext, call: ToolCall, k: number, status: "in_progress" | "completed"): ResponsesOutputItem {
  const ns = ctx.namespaced.get(call.function.name);
  return {
    id: callItemId(ctx, k),
    type: "function_call",
    status,
    call_id: call.id,
    name: ns ? ns.name : call.function.name,
    ...(ns ? { namespace: ns.namespace } : {}),
    arguments: status === "completed" ? call.function.arguments : "",
  };
}

function reasoningItem(ctx: ResponsesContext, text: string): ResponsesOutputItem {
  return {
    id: reasoningId(ctx),
    type: "reasoning",
    summary: [{ type: "summary_text", text }],
    encrypted_content: sealReasoning(ctx.reasoningKey, text),
  };
}

function messageItem(ctx: ResponsesContext, text: string, status: "completed" | "incomplete", logprobs: readonly TokenLogprob[]): ResponsesOutputItem {
  return {
    id: messageId(ctx),
    type: "message",
    status,
    role: "assistant",
    content: [{ type: "output_text", text, annotations: [], logprobs: clientLogprobs(logprobs, ctx) }],
  };
}

/** The entries a client that asked for logprobs is given (none when it did not ask). */
function clientLogprobs(logprobs: readonly TokenLogprob[], ctx: ResponsesContext): ResponsesLogprob[] {
  const wanted = ctx.clientLogprobs;
  if (!wanted) return [];
  return logprobs.map((l) => ({ ...l, top_logprobs: l.top_logprobs.slice(0, wanted.top_logprobs) }));
}

const lossy = new TextDecoder("utf-8", { fatal: false });
/** A token's text as the engine spells it alone: a piece of a multi-byte character reads as U+FFFD (vLLM's token strings do). */
const tokenText = (l: TokenLogprob): string => (l.bytes ? lossy.decode(Uint8Array.from(l.bytes)) : l.token);

/**
 * A pattern finding `text` in the tokens' texts joined: a character outside ASCII matches itself or
 * the U+FFFD its pieces read as when tokens split it.
 */
function spelledIn(text: string): RegExp {
  let pattern = "";
  for (const ch of text) {
    const lit = ch.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
    pattern += ch.charCodeAt(0) < 0x80 ? lit : `(?:${lit}|\uFFFD{1,4})`;
  }
  return new RegExp(pattern, "g");
}

/** Where `text` first appears in `joined` at or after `from`: [start, end) in UTF-16 units, or null. */
function find(joined: string, text: string, from: number): [number, number] | null {
  const re = spelledIn(text);
  re.lastIndex = from;
  const m = re.exec(joined);
  return m ? [m.index, m.index + m[0].length] : null;
}

/**
 * The tokens of `text` (the answer's text as shown) among an answer's tokens: those whose text
 * overlaps it, found after the reasoning and its end marker `end` (when there is any: a short text
 * could otherwise be found inside the marker). Empty when the tokens carry no text or the text is
 * not found in them.
 */
export function textTokens(logprobs: readonly TokenLogprob[], reasoning: string | null, text: string, end?: string | null): TokenLogprob[] {
  if (text === "" || logprobs.length === 0) return [];
  const pieces = logprobs.map(tokenText);
  const starts: number[] = [];
  let joined = "";
  for (const p of pieces) {
    starts.push(joined.length);
    joined += p;
  }
  if (joined === "") return [];
  let from = 0;
  if (reasoning !== null) {
    const r = find(joined, reasoning, 0);
    if (r) from = r[1];
    const marker = end ? logprobs.findIndex((l, i) => starts[i]! >= from && l.token === end) : -1;
    if (marker >= 0) from = starts[marker]! + pieces[marker]!.length;
  }
  const span = find(joined, text, from);
  if (!span) return [];
  const [at, to] = span;
  return logprobs.filter((_, i) => starts[i]! < to && starts[i]! + pieces[i]!.length > at);
}

/** The output items for a finished answer, in the order the model produced them. */
export function toResponsesOutput(result: EngineResult, ctx: ResponsesContext): ResponsesOutputItem[] {
  const m = result.message;
  const output: ResponsesOutputItem[] = [];
  if (m.reasoning) output.push(reasoningItem(ctx, m.reasoning));
  const text = m.content !== null && m.reasoning ? m.content.replace(/^\n+/, "") : m.content;
  if (showsText(text, m.tool_calls.length > 0)) {
    const logprobs = ctx.clientLogprobs ? textTokens(result.logprobs, m.reasoning, text, ctx.reasoningEnd) : [];
    output.push(messageItem(ctx, text, isIncomplete(result.finish_reason) ? "incomplete" : "completed", logprobs));
  }
  m.tool_calls.forEach((c, k) => output.push(callItem(ctx, c, k, "completed")));
  // An empty answer is still a turn: a message with empty text, which the agent sends back, so the
  // engine renders that turn again and the next call's prompt continues this one.
  if (output.length === 0) output.push(messageItem(ctx, text ?? "", isIncomplete(result.finish_reason) ? "incomplete" : "completed", []));
  return output;
}

function responseObject(
  ctx: ResponsesContext,
  status: ResponsesObject["status"],
  output: ResponsesOutputItem[],
  usage: ResponsesUsage | null,
  extra: Partial<Pick<ResponsesObject, "error" | "incomplete_details">> = {},
): ResponsesObject {
  return {
    id: ctx.id,
    object: "response",
    created_at: ctx.createdAt,
    status,
    error: extra.error ?? null,
    incomplete_details: extra.incomplete_details ?? null,
    model: ctx.model,
    output,
    parallel_tool_calls: ctx.echo.parallel_tool_calls,
    tool_choice: ctx.echo.tool_choice,
    temperature: ctx.echo.temperature,
    top_p: ctx.echo.top_p,
    max_output_tokens: ctx.echo.max_output_tokens,
    previous_response_id: null,
    reasoning: ctx.echo.reasoning,
    store: false,
    text: { format: { type: "text" } },
    truncation: "disabled",
    metadata: {},
    usage,
  };
}

/** The non-streaming Responses object for an engine result. */
export function toResponsesResponse(result: EngineResult, ctx: ResponsesContext): ResponsesObject {
  const incomplete = isIncomplete(result.finish_reason);
  return responseObject(ctx, incomplete ? "incomplete" : "completed", toResponsesOutput(result, ctx), toResponsesUsage(result, ctx.reasoningEnd), {
    incomplete_details: incomplete ? { reason: "max_output_tokens" } : null,
  });
}

// ---------------------------------------------------------------------------------------------
// Streaming

/** One Responses streaming event (`type` plus its fields, `sequence_number` included). */
export type ResponsesStreamEvent = { type: string; sequence_number: number } & Record<string, unknown>;

type OpenItem =
  | { kind: "reasoning"; index: number; text: string }
  | { kind: "message"; index: number; text: string; logprobs: TokenLogprob[] }
  | { kind: "call"; index: number; k: number; call: ToolCall };

/**
 * Re-encodes engine stream events into the Responses event sequence as they arrive:
 * `response.created`, `response.in_progress`, then per output item `output_item.added` …
 * (`reasoning_summary_part.added`, `reasoning_summary_text.delta/.done`, `reasoning_summary_part.done`
 * | `content_part.added`, `output_text.delta/.done`, `content_part.done` |
 * `function_call_arguments.delta/.done`) … `output_item.done`, and finally `response.completed`
 * (or `response.incomplete`) with usage — or `response.failed` when the engine fails mid-stream.
 * The final output is built from the same accumulated result a non-streaming call returns.
 */
export class ResponsesStreamEncoder {
  private seq = 0;
  private readonly acc = new StreamAccumulator();
  private current: OpenItem | null = null;
  private readonly done: ResponsesOutputItem[] = [];
  /** Whitespace-only text not yet shown: it becomes a message only if no tool call follows. */
  private pendingText = "";
  private readonly calls = new Map<number, OpenItem & { kind: "call" }>();
  private callCount = 0;
  private hadReasoning = false;
  /** A message or call came after the last reasoning: later text is the model's own, not the template's newlines after `</think>`. */
  private shownAfterReasoning = false;
  /** The tokens of `pendingText`. */
  private pendingLogprobs: TokenLogprob[] = [];
  /** Tokens that showed nothing since the message's last text (a piece of a character, or the stop token): given with the next text, if any. */
  private heldLogprobs: TokenLogprob[] = [];
  /** Text (if only the template's newlines) came after the open reasoning: what follows belongs to the text. */
  private textAfterReasoning = false;

  constructor(private readonly ctx: ResponsesContext) {}

  private ev(type: string, fields: Record<string, unknown>): ResponsesStreamEvent {
    return { type, sequence_number: this.seq++, ...fields };
  }

  /** `response.created` and `response.in_progress`. */
  start(): ResponsesStreamEvent[] {
    const r = responseObject(this.ctx, "in_progress", [], null);
    return [this.ev("response.created", { response: r }), this.ev("response.in_progress", { response: r })];
  }

  push(event: EngineStreamEvent): ResponsesStreamEvent[] {
    this.acc.push(event);
    if (event.type !== "delta") return [];
    const out: ResponsesStreamEvent[] = [];
    if (event.reasoning) this.reasoningDelta(event.reasoning, out);
    if (event.content) this.textDelta(event.content, this.deltaTextTokens(event), out);
    else if (event.reasoning || event.tool_calls?.length) this.heldLogprobs = [];
    // A delta that shows nothing: its tokens go with the message's next text (pieces of a character),
    // or nowhere (reasoning's end marker, the stop token) unless text follows within the message.
    else if (this.ctx.clientLogprobs && (this.current?.kind !== "reasoning" || this.textAfterReasoning)) this.heldLogprobs.push(...event.logprobs);
    for (const d of event.tool_calls ?? []) {
      let open = this.calls.get(d.index);
      if (!open) {
        this.close(out);
        this.pendingText = ""; // whitespace before a tool call is not shown
        this.pendingLogprobs = [];
        open = {
          kind: "call",
          index: this.done.length,
          k: this.callCount++,
          call: { id: d.id ?? "", type: "function", function: { name: d.function?.name ?? "", arguments: "" } },
        };
        this.calls.set(d.index, open);
        this.current = open;
        this.shownAfterReasoning = true;
        out.push(this.ev("response.output_item.added", { output_index: open.index, item: callItem(this.ctx, open.call, open.k, "in_progress") }));
      } else if (this.current !== open) {
        // Fragments of an earlier call after another item started: should not happen; keep them in that call.
        open.call.function.arguments += d.function?.arguments ?? "";
        continue;
      }
      const args = d.function?.arguments ?? "";
      if (args) {
        open.call.function.arguments += args;
        out.push(this.ev("response.function_call_arguments.delta", { item_id: callItemId(this.ctx, open.k), output_index: open.index, delta: args }));
      }
    }
    return out;
  }

  private reasoningDelta(text: string, out: ResponsesStreamEvent[]) {
    this.textAfterReasoning = false;
    if (this.current?.kind !== "reasoning") {
      this.close(out);
      this.hadReasoning = true;
      this.shownAfterReasoning = false;
      this.current = { kind: "reasoning", index: this.done.length, text: "" };
      const id = reasoningId(this.ctx);
      out.push(this.ev("response.output_item.added", { output_index: this.current.index, item: { id, type: "reasoning", summary: [] } }));
      out.push(
        this.ev("response.reasoning_summary_part.added", {
          item_id: id,
          output_index: this.current.index,
          summary_index: 0,
          part: { type: "summary_text", text: "" },
        }),
      );
    }
    this.current.text += text;
    out.push(
      this.ev("response.reasoning_summary_text.delta", {
        item_id: reasoningId(this.ctx),
        output_index: this.current.index,
        summary_index: 0,
        delta: text,
      }),
    );
  }

  /** The tokens of a delta's text: all of them, unless the delta also carries reasoning or calls. */
  private deltaTextTokens(event: EngineStreamEvent & { type: "delta" }): TokenLogprob[] {
    if (!this.ctx.clientLogprobs) return [];
    if (!event.reasoning && !event.tool_calls?.length) {
      const tokens = [...this.heldLogprobs, ...event.logprobs];
      this.heldLogprobs = [];
      return tokens;
    }
    this.heldLogprobs = [];
    // A delta of several kinds (a replayed answer comes as one): find the text among its tokens.
    const shown = this.current?.kind === "message" ? event.content! : this.leadingText(event.content!);
    return textTokens(event.logprobs, event.reasoning ?? null, shown, this.ctx.reasoningEnd);
  }

  private textDelta(text: string, tokens: TokenLogprob[], out: ResponsesStreamEvent[]) {
    this.textAfterReasoning = true;
    if (this.current?.kind !== "message") {
      text = this.leadingText(this.pendingText + text);
      if (text.trim() === "") {
        // Only the template's newlines after reasoning: not shown, nor their tokens.
        if (text === "") this.pendingLogprobs = [];
        else this.pendingLogprobs.push(...tokens);
        this.pendingText = text;
        return;
      }
      tokens = [...this.pendingLogprobs, ...tokens];
      this.pendingText = "";
      this.pendingLogprobs = [];
      this.openMessage(out);
    }
    this.appendText(text, tokens, out);
  }

  /** Adds text and its tokens to the open message, with the delta event that shows them. */
  private appendText(text: string, tokens: TokenLogprob[], out: ResponsesStreamEvent[]) {
    const cur = this.current as OpenItem & { kind: "message" };
    cur.text += text;
    cur.logprobs.push(...tokens);
    out.push(
      this.ev("response.output_text.delta", {
        item_id: messageId(this.ctx),
        output_index: cur.index,
        content_index: 0,
        delta: text,
        logprobs: clientLogprobs(tokens, this.ctx),
      }),
    );
  }

  /** The start of the answer's text as shown: after reasoning, without the template's newlines. */
  private leadingText(text: string): string {
    return this.hadReasoning && !this.shownAfterReasoning ? text.replace(/^\n+/, "") : text;
  }

  private openMessage(out: ResponsesStreamEvent[]) {
    this.close(out);
    this.shownAfterReasoning = true;
    this.current = { kind: "message", index: this.done.length, text: "", logprobs: [] };
    const id = messageId(this.ctx);
    out.push(
      this.ev("response.output_item.added", {
        output_index: this.current.index,
        item: { id, type: "message", status: "in_progress", role: "assistant", content: [] },
      }),
    );
    out.push(
      this.ev("response.content_part.added", {
        item_id: id,
        output_index: this.current.index,
        content_index: 0,
        part: { type: "output_text", text: "", annotations: [], logprobs: [] },
      }),
    );
  }

  /** Closes the open item with its `.done` events. */
  private close(out: ResponsesStreamEvent[], incomplete = false) {
    const cur = this.current;
    if (!cur) return;
    this.current = null;
    if (cur.kind === "reasoning") {
      const id = reasoningId(this.ctx);
      const part = { type: "summary_text", text: cur.text };
      out.push(this.ev("response.reasoning_summary_text.done", { item_id: id, output_index: cur.index, summary_index: 0, text: cur.text }));
      out.push(this.ev("response.reasoning_summary_part.done", { item_id: id, output_index: cur.index, summary_index: 0, part }));
      const item = reasoningItem(this.ctx, cur.text);
      this.done.push(item);
      out.push(this.ev("response.output_item.done", { output_index: cur.index, item }));
    } else if (cur.kind === "message") {
      const id = messageId(this.ctx);
      const logprobs = clientLogprobs(cur.logprobs, this.ctx);
      const part = { type: "output_text", text: cur.text, annotations: [], logprobs };
      out.push(this.ev("response.output_text.done", { item_id: id, output_index: cur.index, content_index: 0, text: cur.text, logprobs }));
      out.push(this.ev("response.content_part.done", { item_id: id, output_index: cur.index, content_index: 0, part }));
      const item = messageItem(this.ctx, cur.text, incomplete ? "incomplete" : "completed", cur.logprobs);
      this.done.push(item);
      out.push(this.ev("response.output_item.done", { output_index: cur.index, item }));
    } else {
      const item = callItem(this.ctx, cur.call, cur.k, "completed");
      const fields = { item_id: item.id, output_index: cur.index };
      out.push(this.ev("response.function_call_arguments.done", { ...fields, name: item.type === "function_call" ? item.name : "", arguments: cur.call.function.arguments }));
      this.done.push(item);
      out.push(this.ev("response.output_item.done", { output_index: cur.index, item }));
    }
  }

  /** After the engine stream ended: closes what is open and sends `response.completed` (or `.incomplete`). */
  end(): ResponsesStreamEvent[] {
    const out: ResponsesStreamEvent[] = [];
    const result = this.acc.result();
    const incomplete = isIncomplete(result.finish_reason);
    if (this.leadingText(this.pendingText) !== "" && this.calls.size === 0) {
      const text = this.leadingText(this.pendingText);
      const tokens = this.pendingLogprobs;
      this.pendingText = "";
      this.pendingLogprobs = [];
      this.openMessage(out);
      this.appendText(text, tokens, out);
    } else if (this.current === null && this.done.length === 0) {
      // An empty answer: a message with empty text, as the non-streamed output has.
      this.openMessage(out);
    }
    this.close(out, incomplete);
    const response = responseObject(this.ctx, incomplete ? "incomplete" : "completed", this.done, toResponsesUsage(result, this.ctx.reasoningEnd), {
      incomplete_details: incomplete ? { reason: "max_output_tokens" } : null,
    });
    out.push(this.ev(incomplete ? "response.incomplete" : "response.completed", { response }));
    return out;
  }

  /** The engine failed mid-stream: `response.failed` with the error; nothing follows. */
  fail(error: { code: string; message: string }): ResponsesStreamEvent[] {
    return [this.ev("response.failed", { response: responseObject(this.ctx, "failed", this.done, null, { error }) })];
  }
}

/** One SSE frame as the Responses API writes it. */
export function responsesSseFrame(event: ResponsesStreamEvent): string {
  return `event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`;
}
