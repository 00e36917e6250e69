import type { ModelProfile } from "@rollgate/models";
import type { AssistantOutput } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "@rollgate/transforms";
import { adapterFor } from "./adapter.js";
import { pausePlan, sglangReadsGenerate, type EngineCapabilities } from "./capabilities.js";
import { chatFinishReason, parsesTools, profileParser } from "./chat-route-rules.js";
import { parseAnswerText } from "@rollgate/models";
import { sglangEngineParsed, sglangTokenIn } from "./sglang/token-in.js";
import { vllmTokenIn } from "./vllm/token-in.js";
import type { ChatPromptField, EngineCall } from "./call.js";
import type { EngineConfig } from "../env.js";

/**
 * Token-in generation: the engine generates from token ids the gateway gives it, instead of letting
 * the chat template re-render the history (llm/continuation.ts), or to continue an answer a pause
 * cut (llm/pause-continuation.ts). Which route an engine offers, best first:
 *
 * 1. its chat route with a pre-tokenised prompt (vLLM `prompt_token_ids` or
 *    `kv_transfer_params.prompt_token_ids`, SGLang `input_ids`): the engine's own tool and reasoning
 *    parsers see the output, whatever the model family;
 * 2. a route with no parser (vLLM `/v1/completions`, SGLang `/generate`), only when the model
 *    profile declares a gateway parser for the family's output format;
 * 3. SGLang `/generate` with its own parsers run afterwards through `/separate_reasoning` and
 *    `/parse_function_call` (the profile names SGLang's parsers for the family).
 *
 * Otherwise there is no token-in for that engine, and its chat template renders every call.
 */

export interface TokenInCall extends Omit<EngineCall, "promptIds"> {
  /** The exact prompt to generate from. */
  tokenIds: number[];
  /** The engine's context length (the default max_tokens, as the chat route computes it); null: unknown. */
  maxModelLen: number | null;
  /**
   * Text this answer already has (a generation cut by a pause, being continued): the output
   * parser reads it first without emitting it, so the new text is parsed in its context.
   */
  primeText?: string;
}

export type TokenInRouteName = "chat_prompt_token_ids" | "chat_kv_transfer_params" | "chat_input_ids" | "completions" | "generate" | "generate_engine_parsed";

export interface TokenInRoute {
  name: TokenInRouteName;
  /** Who parses the output: the engine's chat route, or the gateway parser the profile declares. */
  parsedBy: "engine" | "gateway";
  generate(call: TokenInCall): Promise<EngineResult>;
  generateStream(call: TokenInCall): AsyncGenerator<EngineStreamEvent>;
}

const CHAT_ROUTE_NAMES: Record<ChatPromptField, TokenInRouteName> = {
  prompt_token_ids: "chat_prompt_token_ids",
  kv_transfer_params: "chat_kv_transfer_params",
  input_ids: "chat_input_ids",
};

function chatRoute(kind: EngineConfig["kind"], field: ChatPromptField): TokenInRoute {
  const adapter = adapterFor(kind)!;
  const toChat = (call: TokenInCall): EngineCall => ({ ...call, promptIds: { ids: call.tokenIds, field } });
  return {
    name: CHAT_ROUTE_NAMES[field],
    parsedBy: "engine",
    generate: (call) => adapter.chat(toChat(call)),
    generateStream: (call) => adapter.chatStream(toChat(call)),
  };
}

function gatewayParsedRoute(kind: EngineConfig["kind"]): TokenInRoute {
  const e = kind === "vllm" ? vllmTokenIn : sglangTokenIn;
  return { name: kind === "vllm" ? "completions" : "generate", parsedBy: "gateway", generate: e.generate, generateStream: e.generateStream };
}

/** SGLang's /generate read by its own parse routes: the route every call of an `in_place` SGLang takes when its chat stream has no ids. */
export const SGLANG_GENERATE_ENGINE_PARSED: TokenInRoute = {
  name: "generate_engine_parsed",
  parsedBy: "engine",
  generate: sglangEngineParsed.generate,
  generateStream: sglangEngineParsed.generateStream,
};

/** The route for continuing a recorded call token-in (echoed history), or null with why not. */
export function historyRoute(kind: EngineConfig["kind"], caps: EngineCapabilities, profile: ModelProfile): { route: TokenInRoute } | { route: null; why: string } {
  if (profile.token_in === "off") return { route: null, why: `the ${profile.name} profile turns token-in off` };
  // An SGLang paused in place serves every call through /generate (capabilities.ts): history too,
  // unless its chat stream carries the ids and its chat route takes them: then that route, streamed.
  if (kind === "sglang" && pausePlan(kind, caps, profile).mode === "in_place" && !(caps.streamedIds && caps.chatPromptField)) return { route: SGLANG_GENERATE_ENGINE_PARSED };
  if (caps.chatPromptField) return { route: chatRoute(kind, caps.chatPromptField) };
  if (profile.gateway_parser) return { route: gatewayParsedRoute(kind) };
  if (kind === "sglang" && sglangReadsGenerate(caps, profile)) return { route: SGLANG_GENERATE_ENGINE_PARSED };
  return { route: null, why: `the engine's chat route takes no pre-tokenised prompt and the ${profile.name} profile declares no gateway parser` };
}

/** The route that continues an answer an abort-mode pause cut: its whole text is parsed again, so only the gateway's parser will do. */
export function cutContinuationRoute(kind: EngineConfig["kind"], profile: ModelProfile): TokenInRoute | null {
  return profile.gateway_parser ? gatewayParsedRoute(kind) : null;
}

/** An answer's whole text (as /detokenize gives it) → the message and finish reason the chat route would give. */
export function parseAnswer(call: Pick<TokenInCall, "target" | "request">, text: string, engineFinish: string): { message: AssistantOutput; finish_reason: string } {
  const message = parseAnswerText(profileParser(call), text, parsesTools(call));
  return { message, finish_reason: chatFinishReason(engineFinish, message.tool_calls.length) };
}
