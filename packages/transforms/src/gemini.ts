import { Buffer } from "node:buffer";
import { z } from "zod";
import type { CanonicalChatRequest, ChatMessage, ContentPart, SamplingParams, ToolCall, ToolChoice, ToolDefinition, TokenLogprob } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";
import { openReasoning, sealReasoning } from "./reasoning-seal.js";
import { imageByUrlRefused } from "./content-parts.js";
import { camelCaseGeminiFields } from "./gemini-field-names.js";
import { countReasoningTokens } from "./reasoning-tokens.js";
import { NO_STRUCTURED_OUTPUT, forcesACall, isTextOnly, never, noToolToCall, refusedUnless } from "./unhonoured.js";

/**
 * Gemini API (`generateContent` / `streamGenerateContent`) ⇄ canonical.
 *
 * Request rules (where the Gemini API and the canonical form differ):
 * - Field names: proto3's JSON mapping takes snake_case names as well as camelCase, and so does
 *   the gateway (`system_instruction`, `inline_data`, `generation_config`, …: gemini-field-names.ts).
 *   A part holding no data the gateway reads but some field it does not know is refused with 400
 *   rather than left out.
 * - `contents[].role` is `user` (or the legacy `function`) or `model`; a missing role is `user`.
 *   The role of `systemInstruction` (a string, a Content or an array of parts) is not read.
 *   User turns become canonical `user` messages (one text part → a string, otherwise text and
 *   image parts), their `functionResponse` parts canonical `tool` messages in part order.
 * - A `model` turn becomes one assistant message: its text parts joined (they are pieces of one
 *   answer), its `functionCall` parts tool calls (`arguments` = `JSON.stringify(args)`, key order
 *   kept), `content: ""` when it has no text.
 * - Reasoning: the gateway's `thoughtSignature` is the reasoning itself, sealed (AES-GCM, keyed
 *   by the session's token hash, see reasoning-seal.ts) — Gemini CLI drops `thought` parts from
 *   the history it sends back but keeps the signature of the first function call, so the
 *   reasoning must travel inside the signature for the engine to re-render exactly what it
 *   generated. A turn's signature that opens with our key gives the turn's canonical `reasoning`;
 *   `thought` text without such a signature (another model's, or forged, or Gemini CLI's
 *   `skip_thought_signature_validator`) is not trusted as the policy's reasoning and is dropped.
 * - Function calls without an id get a deterministic one (`gemini-call-<turn>-<k>`); a
 *   `functionResponse` pairs with an unanswered call by id, else by name in order, else in order.
 *   Its `response` object becomes the tool message content as JSON; media in its `parts` follow
 *   that text as image parts of the tool message (inlineData images only; fileData and other media
 *   are refused with 400, as in user turns).
 * - `inlineData` images become `image_url` parts (a data URL); `fileData` (an image by URI) is
 *   refused with 400 (content-parts.ts: the engine would fetch it, and the rollout would not hold
 *   it); other media, `executableCode` and `codeExecutionResult` parts are refused with 400 (the canonical
 *   form cannot carry them). `cachedContent` (server-side caches) is refused with 400.
 * - `tools[].functionDeclarations` are offered: `parameters` (Gemini's OpenAPI-style schema, upper
 *   case types, `nullable`) is converted to JSON Schema; `parametersJsonSchema` passes through.
 *   Other tool kinds (googleSearch, codeExecution, urlContext, …) are accepted and not offered.
 * - `toolConfig.functionCallingConfig.mode`: AUTO / VALIDATED / unspecified → auto, NONE → none,
 *   ANY → required (one allowed name → that function; several → only those tools are offered).
 * - `generationConfig`: temperature, topP, topK, maxOutputTokens, stopSequences, seed, penalties,
 *   responseLogprobs + logprobs map to canonical sampling / client logprobs; `candidateCount > 1`
 *   is a 400. `thinkingConfig.thinkingBudget: 0` or `thinkingLevel: "MINIMAL"` turn thinking
 *   off, any other budget or level turns it on; absent, the template default holds; a positive
 *   budget is not enforced as a token cap. A `thinkingLevel` (one of the API's levels, any case;
 *   THINKING_LEVEL_UNSPECIFIED counts as none) is also kept, lower-cased, as the canonical
 *   `reasoning_effort`. `includeThoughts` decides whether `thought` parts are
 *   shown (the signature is always issued). Structured output (`responseMimeType` other than
 *   `text/plain`, `responseSchema`, `responseJsonSchema`) and output modalities other than text are
 *   refused with a 400: the gateway does not constrain decoding, and an answer that ignored the
 *   schema must not pass for one that followed it (unhonoured.ts).
 */

// ---------------------------------------------------------------------------------------------
// Request

const Blob = z.looseObject({ mimeType: z.string(), data: z.string() });
const FileData = z.looseObject({ mimeType: z.string().optional(), fileUri: z.string() });
const FunctionCall = z.looseObject({
  id: z.string().optional(),
  name: z.string().min(1),
  args: z.record(z.string(), z.unknown()).optional(),
});
/** Media a function returns beside its `response` (a screenshot, a file it read). */
const FunctionResponsePart = z.looseObject({ inlineData: Blob.optional(), fileData: FileData.optional() });
const FunctionResponse = z.looseObject({
  id: z.string().optional(),
  name: z.string().min(1),
  response: z.record(z.string(), z.unknown()).optional(),
  parts: z.array(FunctionResponsePart).optional(),
});

const Part = z.looseObject({
  text: z.string().optional(),
  thought: z.boolean().optional(),
  thoughtSignature: z.string().optional(),
  inlineData: Blob.optional(),
  fileData: FileData.optional(),
  functionCall: FunctionCall.optional(),
  functionResponse: FunctionResponse.optional(),
  executableCode: z.unknown().optional(),
  codeExecutionResult: z.unknown().optional(),
});
type Part = z.infer<typeof Part>;

/** Part fields that carry data, or that describe a part's data without carrying any. */
const DATA_FIELDS = ["text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode", "codeExecutionResult"] as const;
const DESCRIBING_FIELDS = new Set(["thought", "thoughtSignature", "videoMetadata", "partMetadata", "mediaResolution"]);

/** A field of a part that holds none of the data the gateway reads: its content would be left out unseen. */
function unreadField(p: Part): string | null {
  if (DATA_FIELDS.some((f) => p[f] !== undefined)) return null;
  return Object.keys(p).find((k) => !DESCRIBING_FIELDS.has(k)) ?? null;
}

const Content = z.looseObject({
  role: z.enum(["user", "model", "function"]).optional(),
  parts: z.array(Part).default([]),
});

const FunctionDeclaration = z.looseObject({
  name: z.string().min(1),
  description: z.string().optional(),
  parameters: z.record(z.string(), z.unknown()).optional(),
  parametersJsonSchema: z.record(z.string(), z.unknown()).optional(),
});

const Tool = z.looseObject({ functionDeclarations: z.array(FunctionDeclaration).optional() });

const FunctionCallingMode = z.enum(["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"]);

const THINKING_LEVELS = new Set(["THINKING_LEVEL_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH"]);

const GenerationConfig = z.looseObject({
  temperature: z.number().min(0).max(2).nullish(),
  topP: z.number().gt(0).max(1).nullish(),
  topK: z.number().int().nullish(),
  maxOutputTokens: z.number().int().positive().nullish(),
  stopSequences: z.array(z.string()).nullish(),
  seed: z.number().int().nullish(),
  presencePenalty: z.number().nullish(),
  frequencyPenalty: z.number().nullish(),
  candidateCount: z
    .number()
    .int()
    .max(1, { message: "candidateCount > 1 is not supported; send separate requests" })
    .nullish(),
  responseLogprobs: z.boolean().nullish(),
  logprobs: z.number().int().min(0).max(20).nullish(),
  responseMimeType: refusedUnless((v) => v === "text/plain", `responseMimeType: ${NO_STRUCTURED_OUTPUT}`),
  responseSchema: refusedUnless(never, `responseSchema: ${NO_STRUCTURED_OUTPUT}`),
  responseJsonSchema: refusedUnless(never, `responseJsonSchema: ${NO_STRUCTURED_OUTPUT}`),
  responseModalities: refusedUnless(isTextOnly, "responseModalities: only TEXT output is supported"),
  thinkingConfig: z
    .looseObject({
      includeThoughts: z.boolean().nullish(),
      thinkingBudget: z.number().int().nullish(),
      // The API's ThinkingLevel enum (case aside); THINKING_LEVEL_UNSPECIFIED is no level at all.
      thinkingLevel: z
        .string()
        .nullish()
        .refine((v) => v == null || THINKING_LEVELS.has(v.toUpperCase()), { message: `expected one of ${[...THINKING_LEVELS].join(", ")}` })
        .transform((v) => (v?.toUpperCase() === "THINKING_LEVEL_UNSPECIFIED" ? undefined : v)),
    })
    .nullish(),
});

export const GeminiRequest = z.looseObject({
  model: z.string().optional(),
  contents: z.array(Content).min(1, "contents must not be empty"),
  // Its role is not read: the SDK gives a string as role "user", and some agents send "system".
  systemInstruction: z.union([z.string(), Content.extend({ role: z.string().optional() }), z.array(Part)]).optional(),
  tools: z.array(Tool).optional(),
  toolConfig: z
    .looseObject({
      functionCallingConfig: z
        .looseObject({ mode: FunctionCallingMode.optional(), allowedFunctionNames: z.array(z.string()).optional() })
        .optional(),
    })
    .optional(),
  generationConfig: GenerationConfig.optional(),
  safetySettings: z.unknown().optional(),
  cachedContent: z.string().optional(),
});
export type GeminiRequest = z.infer<typeof GeminiRequest>;

export interface GeminiCall {
  canonical: CanonicalChatRequest;
  /** `thinkingConfig.includeThoughts`: whether responses show `thought` parts. */
  includeThoughts: boolean;
}

export interface FromGeminiOptions {
  /** The session's key for thought signatures (its token hash); without one none is trusted. */
  key?: string;
  stream?: boolean;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function invalid(path: (string | number)[], message: string): z.ZodError {
  return new z.ZodError([{ code: "custom", path, message, input: undefined }]);
}

const COUNT_KEYS = new Set(["minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"]);

/**
 * Gemini's OpenAPI-style `Schema` → JSON Schema: lower-case `type` (TYPE_UNSPECIFIED dropped),
 * `nullable: true` → a `"null"` alternative, int64 counts given as strings → numbers,
 * `propertyOrdering` dropped; every other keyword kept, in order.
 */
export function geminiSchemaToJsonSchema(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(geminiSchemaToJsonSchema);
  if (!isRecord(schema)) return schema;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(schema)) {
    if (k === "type" && typeof v === "string") {
      if (v.toUpperCase() !== "TYPE_UNSPECIFIED") out.type = v.toLowerCase();
    } else if ((k === "properties" || k === "$defs" || k === "definitions") && isRecord(v)) {
      out[k] = Object.fromEntries(Object.entries(v).map(([name, s]) => [name, geminiSchemaToJsonSchema(s)]));
    } else if (k === "items" || k === "additionalProperties" || k === "not" || k === "anyOf" || k === "oneOf" || k === "allOf" || k === "prefixItems") {
      out[k] = geminiSchemaToJsonSchema(v);
    } else if (COUNT_KEYS.has(k) && typeof v === "string" && /^\d+$/.test(v)) {
      out[k] = Number(v);
    } else if (k !== "nullable" && k !== "propertyOrdering") {
      out[k] = v;
    }
  }
  if (schema.nullable === true) {
    if (typeof out.type === "string") out.type = [out.type, "null"];
    else if (Array.isArray(out.anyOf)) out.anyOf = [...(out.anyOf as unknown[]), { type: "null" }];
  }
  return out;
}

/** The system instruction's text; a part holding anything else (an image, a call) is refused, not dropped. */
function systemText(si: NonNullable<GeminiRequest["systemInstruction"]>): string {
  if (typeof si === "string") return si;
  const parts = Array.isArray(si) ? si : si.parts;
  parts.forEach((p, i) => {
    const field = DATA_FIELDS.find((f) => f !== "text" && p[f] !== undefined);
    if (field) throw invalid(["systemInstruction", ...(Array.isArray(si) ? [] : ["parts"]), i, field], `systemInstruction holds text parts only, not ${field}`);
  });
  return parts
    .filter((p) => p.text !== undefined && !p.thought)
    .map((p) => p.text)
    .join("\n");
}

function mediaPart(p: Pick<Part, "inlineData" | "fileData">, path: (string | number)[]): ContentPart {
  if (p.inlineData) {
    if (!p.inlineData.mimeType.startsWith("image/")) {
      throw invalid([...path, "inlineData", "mimeType"], `only image inlineData is supported, got ${p.inlineData.mimeType}`);
    }
    return { type: "image_url", image_url: { url: `data:${p.inlineData.mimeType};base64,${p.inlineData.data}` } };
  }
  throw invalid([...path, "fileData"], imageByUrlRefused("inlineData"));
}

/**
 * A function response as the tool message's content: its `response` as JSON, then the media of its
 * `parts` (images only, as in user turns) after it; a part the canonical form cannot carry is refused.
 */
function toolContent(fr: z.infer<typeof FunctionResponse>, path: (string | number)[]): string | ContentPart[] {
  const json = JSON.stringify(fr.response ?? {});
  if (!fr.parts || fr.parts.length === 0) return json;
  const media = fr.parts.map((p, k) => {
    const at = [...path, "parts", k];
    if (!p.inlineData && !p.fileData) throw invalid(at, "a function response part holds inlineData or fileData");
    return mediaPart(p, at);
  });
  return [{ type: "text", text: json }, ...media];
}

function userMessage(parts: ContentPart[]): ChatMessage {
  if (parts.length === 1 && parts[0]!.type === "text") return { role: "user", content: parts[0]!.text };
  return { role: "user", content: parts };
}

/** The reasoning sealed in any of a turn's signatures (the last that opens), or null. */
function trustedReasoning(parts: Part[], key: string | undefined): string | null {
  if (!key) return null;
  let reasoning: string | null = null;
  for (const p of parts) {
    if (!p.thoughtSignature) continue;
    const opened = openReasoning(key, p.thoughtSignature);
    if (opened !== null) reasoning = opened;
  }
  return reasoning;
}

/** Parses a Gemini request body into the canonical request; throws a ZodError naming bad fields. */
export function fromGemini(body: unknown, opts: FromGeminiOptions = {}): GeminiCall {
  const req = GeminiRequest.parse(camelCaseGeminiFields(body));
  if (req.cachedContent !== undefined) throw invalid(["cachedContent"], "cachedContent is not supported; send the full contents");
  const messages: ChatMessage[] = [];
  if (req.systemInstruction !== undefined) {
    const text = systemText(req.systemInstruction);
    if (text !== "") messages.push({ role: "system", content: text });
  }

  // Calls of earlier model turns not yet answered by a functionResponse, oldest first.
  let pending: { id: string; name: string }[] = [];
  req.contents.forEach((content, ci) => {
    content.parts.forEach((p, pi) => {
      const field = unreadField(p);
      if (field !== null) throw invalid(["contents", ci, "parts", pi, field], `unsupported part field ${field}: a part holds text, inlineData, fileData, functionCall or functionResponse`);
    });
    const role = content.role ?? "user";
    if (role === "model") {
      const text: string[] = [];
      const calls: ToolCall[] = [];
      content.parts.forEach((p, pi) => {
        const path = ["contents", ci, "parts", pi];
        if (p.executableCode !== undefined || p.codeExecutionResult !== undefined) {
          throw invalid(path, "executableCode / codeExecutionResult parts are not supported");
        }
        if (p.inlineData || p.fileData) throw invalid(path, "media parts are not supported in model turns");
        if (p.functionCall) {
          const id = p.functionCall.id ?? `gemini-call-${ci}-${calls.length}`;
          calls.push({ id, type: "function", function: { name: p.functionCall.name, arguments: JSON.stringify(p.functionCall.args ?? {}) } });
        } else if (p.text !== undefined && !p.thought) text.push(p.text);
      });
      if (content.parts.length === 0) return;
      const reasoning = trustedReasoning(content.parts, opts.key);
      messages.push({
        role: "assistant",
        content: text.join(""),
        ...(reasoning !== null ? { reasoning } : {}),
        ...(calls.length > 0 ? { tool_calls: calls } : {}),
      });
      pending = calls.map((c) => ({ id: c.id, name: c.function.name }));
      return;
    }

    // A user turn: text / media parts grouped into user messages, function responses as tool messages, in order.
    let buffer: ContentPart[] = [];
    const flush = () => {
      if (buffer.length > 0) messages.push(userMessage(buffer));
      buffer = [];
    };
    content.parts.forEach((p, pi) => {
      const path = ["contents", ci, "parts", pi];
      if (p.executableCode !== undefined || p.codeExecutionResult !== undefined) {
        throw invalid(path, "executableCode / codeExecutionResult parts are not supported");
      }
      if (p.functionCall) throw invalid([...path, "functionCall"], "functionCall parts belong in model turns");
      if (p.functionResponse) {
        flush();
        const fr = p.functionResponse;
        let at = fr.id !== undefined ? pending.findIndex((c) => c.id === fr.id) : -1;
        if (at < 0 && fr.id === undefined) at = pending.findIndex((c) => c.name === fr.name);
        if (at < 0 && fr.id === undefined) at = 0;
        const match = pending[at];
        const id = fr.id ?? match?.id ?? `gemini-call-${ci}-${pi}`;
        if (match && (fr.id === undefined || match.id === fr.id)) pending.splice(at, 1);
        messages.push({ role: "tool", tool_call_id: id, content: toolContent(fr, [...path, "functionResponse"]) });
      } else if (p.inlineData || p.fileData) {
        buffer.push(mediaPart(p, path));
      } else if (p.text !== undefined && !p.thought) {
        buffer.push({ type: "text", text: p.text });
      }
    });
    flush();
  });

  if (messages.length === 0) throw invalid(["contents"], "contents hold no text, media or function parts");

  const decls = (req.tools ?? []).flatMap((t, ti) =>
    (t.functionDeclarations ?? []).map((d, di) => {
      if (d.parameters !== undefined && d.parametersJsonSchema !== undefined) {
        throw invalid(["tools", ti, "functionDeclarations", di], "give parameters or parametersJsonSchema, not both");
      }
      return d;
    }),
  );
  const fcc = req.toolConfig?.functionCallingConfig;
  const mode = fcc?.mode ?? "AUTO";
  const allowed = fcc?.allowedFunctionNames;
  let offered = decls;
  let toolChoice: ToolChoice | undefined;
  if (mode === "NONE") toolChoice = "none";
  else if (mode === "ANY") {
    if (allowed && allowed.length === 1) toolChoice = { type: "function", function: { name: allowed[0]! } };
    else {
      toolChoice = "required";
      if (allowed && allowed.length > 1) offered = decls.filter((d) => allowed.includes(d.name));
    }
  } else if (fcc?.mode !== undefined) toolChoice = "auto";
  if (offered.length === 0 && forcesACall(toolChoice)) throw noToolToCall(["toolConfig", "functionCallingConfig", "mode"], mode);
  if (allowed) {
    for (const name of allowed) {
      if (!decls.some((d) => d.name === name)) {
        throw invalid(["toolConfig", "functionCallingConfig", "allowedFunctionNames"], `no function named ${name} is declared`);
      }
    }
  }
  const tools: ToolDefinition[] = offered.map((d) => {
    const parameters = d.parametersJsonSchema ?? (d.parameters !== undefined ? (geminiSchemaToJsonSchema(d.parameters) as Record<string, unknown>) : undefined);
    return {
      type: "function",
      function: {
        name: d.name,
        ...(d.description !== undefined ? { description: d.description } : {}),
        ...(parameters !== undefined ? { parameters } : {}),
      },
    };
  });

  const g = req.generationConfig ?? {};
  const sampling: SamplingParams = {};
  if (g.temperature != null) sampling.temperature = g.temperature;
  if (g.topP != null) sampling.top_p = g.topP;
  if (g.topK != null) sampling.top_k = g.topK;
  if (g.maxOutputTokens != null) sampling.max_tokens = g.maxOutputTokens;
  if (g.stopSequences != null && g.stopSequences.length > 0) sampling.stop = g.stopSequences;
  if (g.seed != null) sampling.seed = g.seed;
  if (g.presencePenalty != null) sampling.presence_penalty = g.presencePenalty;
  if (g.frequencyPenalty != null) sampling.frequency_penalty = g.frequencyPenalty;
  if (g.logprobs != null && !g.responseLogprobs) {
    throw invalid(["generationConfig", "logprobs"], "logprobs requires responseLogprobs: true");
  }

  const thinking = g.thinkingConfig;
  let enableThinking: boolean | undefined;
  if (thinking?.thinkingBudget != null) enableThinking = thinking.thinkingBudget !== 0;
  else if (thinking?.thinkingLevel != null) enableThinking = thinking.thinkingLevel.toUpperCase() !== "MINIMAL";

  const canonical: CanonicalChatRequest = {
    messages,
    sampling,
    stream: opts.stream === true,
    client_logprobs: g.responseLogprobs ? { top_logprobs: g.logprobs ?? 0 } : null,
    ...(tools.length > 0 ? { tools } : {}),
    ...(tools.length > 0 && toolChoice !== undefined ? { tool_choice: toolChoice } : {}),
    ...(enableThinking !== undefined ? { enable_thinking: enableThinking } : {}),
    ...(thinking?.thinkingLevel != null ? { reasoning_effort: thinking.thinkingLevel.toLowerCase() } : {}),
  };
  return { canonical, includeThoughts: thinking?.includeThoughts === true };
}

// ---------------------------------------------------------------------------------------------
// Response

export interface GeminiResponseContext {
  /** The model name the client asked for (from the URL): given back as `modelVersion`. */
  model: string;
  responseId: string;
  /** The session's key for thought signatures (its token hash). */
  key: string;
  includeThoughts: boolean;
  clientLogprobs: CanonicalChatRequest["client_logprobs"];
  /** The text of the output token that ends reasoning in this model's format (its profile's); absent or null: thoughts are not counted. */
  reasoningEnd?: string | null;
}

export interface GeminiPart {
  text?: string;
  thought?: true;
  thoughtSignature?: string;
  functionCall?: { id?: string; name: string; args: Record<string, unknown> };
}

export interface GeminiCandidate {
  content: { role: "model"; parts: GeminiPart[] };
  finishReason?: string;
  index: 0;
  avgLogprobs?: number;
  logprobsResult?: GeminiLogprobsResult;
}

export interface GeminiUsageMetadata {
  promptTokenCount: number;
  candidatesTokenCount: number;
  totalTokenCount: number;
  cachedContentTokenCount: number;
  thoughtsTokenCount?: number;
}

export interface GeminiResponse {
  candidates: GeminiCandidate[];
  usageMetadata?: GeminiUsageMetadata;
  modelVersion: string;
  responseId: string;
}

interface LogprobCandidate {
  token: string;
  tokenId?: number;
  logProbability: number;
}
export interface GeminiLogprobsResult {
  topCandidates: { candidates: LogprobCandidate[] }[];
  chosenCandidates: LogprobCandidate[];
}

/** The engine's finish reason → Gemini's (`tool_calls` is STOP: Gemini has no separate reason). */
export function geminiFinishReason(reason: string): string {
  switch (reason) {
    case "stop":
    case "tool_calls":
      return "STOP";
    case "length":
      return "MAX_TOKENS";
    default:
      return "OTHER";
  }
}

/** `thoughtSignature` for a turn's reasoning: the reasoning sealed with the session's key, standard base64 (a proto `bytes`). */
export function geminiThoughtSignature(key: string, reasoning: string): string {
  return Buffer.from(sealReasoning(key, reasoning), "base64url").toString("base64");
}

function parseArgs(args: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(args === "" ? "{}" : args);
    return isRecord(v) ? v : { value: v };
  } catch {
    // vLLM's tool parsers re-serialise arguments as JSON; anything else is an engine fault.
    return {};
  }
}

function functionCallPart(call: ToolCall): GeminiPart {
  return { functionCall: { ...(call.id ? { id: call.id } : {}), name: call.function.name, args: parseArgs(call.function.arguments) } };
}

/** Tokens spent thinking: the answer's reasoning tokens (countReasoningTokens), or the count its usage carries (a replayed answer's). */
function thoughtsTokens(usage: EngineResult["usage"], logprobs: readonly TokenLogprob[], reasoning: string | null, end: string | null | undefined, finishReason: string): number | undefined {
  return usage.reasoning_tokens ?? countReasoningTokens(logprobs, reasoning, end, finishReason);
}

function usageMetadata(usage: EngineResult["usage"], thoughts: number | undefined): GeminiUsageMetadata {
  return {
    promptTokenCount: usage.prompt_tokens,
    candidatesTokenCount: usage.completion_tokens - (thoughts ?? 0),
    totalTokenCount: usage.prompt_tokens + usage.completion_tokens,
    cachedContentTokenCount: usage.cached_tokens,
    ...(thoughts !== undefined ? { thoughtsTokenCount: thoughts } : {}),
  };
}

function logprobsResult(logprobs: readonly TokenLogprob[], ids: readonly (number | undefined)[], wanted: NonNullable<GeminiResponseContext["clientLogprobs"]>): GeminiLogprobsResult {
  return {
    topCandidates: logprobs.map((l) => ({
      candidates: l.top_logprobs.slice(0, wanted.top_logprobs).map((t) => ({ token: t.token, logProbability: t.logprob })),
    })),
    chosenCandidates: logprobs.map((l, i) => ({
      token: l.token,
      ...(ids[i] !== undefined ? { tokenId: ids[i] } : {}),
      logProbability: l.logprob,
    })),
  };
}

function avg(logprobs: readonly TokenLogprob[]): number {
  return logprobs.length === 0 ? 0 : logprobs.reduce((s, l) => s + l.logprob, 0) / logprobs.length;
}

const isBlank = (s: string) => s.trim() === "";

/**
 * The parts of a model turn: thought (when shown), text, function calls. The signature goes on
 * the first visible non-thought part and on the first function call (where Gemini CLI keeps it);
 * a turn with nothing else to show gets an empty text part to carry it.
 */
function modelParts(m: EngineResult["message"], ctx: GeminiResponseContext): GeminiPart[] {
  const parts: GeminiPart[] = [];
  const reasoning = m.reasoning !== null && m.reasoning !== "" ? m.reasoning : null;
  if (reasoning !== null && ctx.includeThoughts) parts.push({ text: reasoning, thought: true });
  const text = m.content ?? "";
  // Whitespace beside tool calls is template glue (`</think>\n\n<tool_call>`), not an answer.
  if (text !== "" && !(m.tool_calls.length > 0 && isBlank(text))) parts.push({ text });
  parts.push(...m.tool_calls.map(functionCallPart));
  if (parts.every((p) => p.thought)) parts.push({ text: "" });
  if (reasoning !== null) {
    const sig = geminiThoughtSignature(ctx.key, reasoning);
    const first = parts.find((p) => !p.thought);
    if (first) first.thoughtSignature = sig;
    const firstCall = parts.find((p) => p.functionCall);
    if (firstCall) firstCall.thoughtSignature = sig;
  }
  return parts;
}

/** The non-streaming `GenerateContentResponse` for an engine result. */
export function toGeminiResponse(result: EngineResult, ctx: GeminiResponseContext): GeminiResponse {
  const candidate: GeminiCandidate = {
    content: { role: "model", parts: modelParts(result.message, ctx) },
    finishReason: geminiFinishReason(result.finish_reason),
    index: 0,
  };
  if (ctx.clientLogprobs) {
    candidate.avgLogprobs = avg(result.logprobs);
    candidate.logprobsResult = logprobsResult(result.logprobs, result.output_ids, ctx.clientLogprobs);
  }
  return {
    candidates: [candidate],
    usageMetadata: usageMetadata(result.usage, thoughtsTokens(result.usage, result.logprobs, result.message.reasoning, ctx.reasoningEnd, result.finish_reason)),
    modelVersion: ctx.model,
    responseId: ctx.responseId,
  };
}

/**
 * Re-encodes engine stream events as `GenerateContentResponse` chunks, each carrying only the new
 * parts: thought text as it comes (when shown), answer text as it comes, each function call
 * whole once complete (Gemini never streams partial arguments). The last chunk carries
 * `finishReason` and `usageMetadata`. Folding the chunks' parts gives the parts of
 * `toGeminiResponse` for the same result (text pieces split differently).
 */
export class GeminiStreamEncoder {
  private reasoning = "";
  private signed = false;
  private pendingBlank = "";
  private sawText = false;
  private readonly calls = new Map<number, ToolCall>();
  private currentCall = -1;
  private sawCalls = false;
  private readonly allLogprobs: TokenLogprob[] = [];
  private pendingLogprobs: TokenLogprob[] = [];
  private pendingIds: (number | undefined)[] = [];
  private promptTokens = 0;
  private outputTokens = 0;
  private finishReason: string | null = null;
  private usage: EngineResult["usage"] | null = null;
  private done = false;

  constructor(private readonly ctx: GeminiResponseContext) {}

  private sign(part: GeminiPart): void {
    if (this.reasoning === "") return;
    if (!this.signed || part.functionCall) part.thoughtSignature = geminiThoughtSignature(this.ctx.key, this.reasoning);
    this.signed = true;
  }

  private flushCall(index: number, parts: GeminiPart[]): void {
    const call = this.calls.get(index);
    if (!call) return;
    this.calls.delete(index);
    const part = functionCallPart(call);
    const firstCall = !this.sawCalls;
    this.sawCalls = true;
    if (firstCall) {
      const sig = this.reasoning !== "" ? geminiThoughtSignature(this.ctx.key, this.reasoning) : undefined;
      if (sig) part.thoughtSignature = sig;
      this.signed = this.signed || sig !== undefined;
    }
    parts.push(part);
  }

  private chunk(parts: GeminiPart[], final: { finishReason: string; usage: EngineResult["usage"] } | null): GeminiResponse {
    const candidate: GeminiCandidate = { content: { role: "model", parts }, index: 0 };
    if (final) candidate.finishReason = geminiFinishReason(final.finishReason);
    if (this.ctx.clientLogprobs && this.pendingLogprobs.length > 0) {
      candidate.avgLogprobs = avg(this.pendingLogprobs);
      candidate.logprobsResult = logprobsResult(this.pendingLogprobs, this.pendingIds, this.ctx.clientLogprobs);
      this.pendingLogprobs = [];
      this.pendingIds = [];
    }
    const out: GeminiResponse = { candidates: [candidate], modelVersion: this.ctx.model, responseId: this.ctx.responseId };
    if (final) out.usageMetadata = usageMetadata(final.usage, thoughtsTokens(final.usage, this.allLogprobs, this.reasoning !== "" ? this.reasoning : null, this.ctx.reasoningEnd, final.finishReason));
    return out;
  }

  /** Chunks to send for one engine event (often none: the start, swallowed tokens, the finish before usage). */
  push(event: EngineStreamEvent): GeminiResponse[] {
    if (this.done) return [];
    switch (event.type) {
      case "start":
        this.promptTokens = event.prompt_ids.length;
        return [];
      case "delta": {
        this.outputTokens += event.token_ids.length;
        // Loops, not push(...spread): a delta may be a whole long answer (no argument-list limit).
        for (let i = 0; i < event.logprobs.length; i++) {
          const lp = event.logprobs[i]!;
          this.allLogprobs.push(lp);
          this.pendingLogprobs.push(lp);
          this.pendingIds.push(event.token_ids[i]);
        }
        const parts: GeminiPart[] = [];
        if (event.reasoning) {
          this.reasoning += event.reasoning;
          if (this.ctx.includeThoughts) parts.push({ text: event.reasoning, thought: true });
        }
        if (event.content) {
          if (!this.sawText && isBlank(this.pendingBlank + event.content)) this.pendingBlank += event.content;
          else {
            const part: GeminiPart = { text: this.sawText ? event.content : this.pendingBlank + event.content };
            this.pendingBlank = "";
            this.sawText = true;
            this.sign(part);
            parts.push(part);
          }
        }
        for (const d of event.tool_calls ?? []) {
          if (d.index !== this.currentCall) {
            this.flushCall(this.currentCall, parts);
            this.currentCall = d.index;
          }
          const call = this.calls.get(d.index) ?? { id: "", type: "function" as const, function: { name: "", arguments: "" } };
          if (d.id) call.id = d.id;
          if (d.function?.name) call.function.name += d.function.name;
          if (d.function?.arguments) call.function.arguments += d.function.arguments;
          this.calls.set(d.index, call);
        }
        if (event.tool_calls && event.tool_calls.length > 0) this.pendingBlank = "";
        return parts.length > 0 ? [this.chunk(parts, null)] : [];
      }
      case "finish":
        this.finishReason = event.finish_reason;
        return this.usage ? this.finalChunk(this.usage) : [];
      case "usage":
        this.usage = event.usage;
        return this.finishReason !== null ? this.finalChunk(event.usage) : [];
    }
  }

  /** The closing chunk when the stream ended without finish and usage both seen (none once it was sent). */
  end(): GeminiResponse[] {
    if (this.done) return [];
    return this.finalChunk(this.usage ?? { prompt_tokens: this.promptTokens, completion_tokens: this.outputTokens, cached_tokens: 0 });
  }

  private finalChunk(usage: EngineResult["usage"]): GeminiResponse[] {
    this.done = true;
    const parts: GeminiPart[] = [];
    for (const index of [...this.calls.keys()].sort((a, b) => a - b)) this.flushCall(index, parts);
    if (this.pendingBlank !== "" && !this.sawCalls) {
      const part: GeminiPart = { text: this.pendingBlank };
      this.sawText = true;
      this.sign(part);
      parts.push(part);
    }
    this.pendingBlank = "";
    if (parts.length === 0) {
      // An empty text part ends the turn (SDK chats drop chunks without parts) and, after nothing
      // but thoughts, carries the signature.
      const part: GeminiPart = { text: "" };
      if (!this.sawText && !this.sawCalls) this.sign(part);
      parts.push(part);
    }
    return [this.chunk(parts, { finishReason: this.finishReason ?? "stop", usage })];
  }
}

export type GeminiStreamMode = "sse" | "array";

/** What opens a stream: `[` for the JSON array form, nothing for SSE. */
export function geminiStreamOpen(mode: GeminiStreamMode): string {
  return mode === "array" ? "[" : "";
}

/** One chunk on the wire: an SSE `data:` frame, or an array element (comma-separated after the first). */
export function geminiStreamFrame(chunk: unknown, mode: GeminiStreamMode, first: boolean): string {
  const json = JSON.stringify(chunk);
  if (mode === "sse") return `data: ${json}\r\n\r\n`;
  return first ? json : `,\r\n${json}`;
}

/** What closes a stream: `]` for the JSON array form. */
export function geminiStreamClose(mode: GeminiStreamMode): string {
  return mode === "array" ? "]" : "";
}

const STATUS_NAMES: Record<number, string> = {
  400: "INVALID_ARGUMENT",
  401: "UNAUTHENTICATED",
  403: "PERMISSION_DENIED",
  404: "NOT_FOUND",
  409: "ABORTED",
  413: "INVALID_ARGUMENT",
  429: "RESOURCE_EXHAUSTED",
  499: "CANCELLED",
  500: "INTERNAL",
  501: "UNIMPLEMENTED",
  502: "UNAVAILABLE",
  503: "UNAVAILABLE",
  504: "DEADLINE_EXCEEDED",
};

/** Google's canonical status name for an HTTP status. */
export function geminiStatusName(code: number): string {
  return STATUS_NAMES[code] ?? (code >= 500 ? "INTERNAL" : "FAILED_PRECONDITION");
}

/**
 * Google's error object `{error: {code, message, status, details?}}`, which @google/genai surfaces
 * as `ApiError` (status = code); `reason` goes in a `google.rpc.ErrorInfo` detail.
 */
export function geminiError(code: number, message: string, reason?: string) {
  return {
    error: {
      code,
      message,
      status: geminiStatusName(code),
      ...(reason ? { details: [{ "@type": "type.googleapis.com/google.rpc.ErrorInfo", reason, domain: "rollgate" }] } : {}),
    },
  };
}
