import type { AssistantOutput, ChatMessage, EngineConfig } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "@rollgate/transforms";
import type { EngineCall } from "./vllm.js";
import { sglangTokenIn } from "./sglang-token-in.js";
import { vllmTokenIn } from "./vllm-token-in.js";

/**
 * Token-in generation: what the gateway needs from an engine to continue a recorded call from its
 * own token ids instead of letting the chat template re-render the history (llm/continuation.ts).
 * Optional per engine kind, beside the EngineAdapter: a kind without one always renders.
 */

export type TokenizeCall = Omit<EngineCall, "requestId">;

export interface TokenInCall extends EngineCall {
  /** The exact prompt to generate from. */
  promptIds: number[];
  /** The engine's context length (the default max_tokens, as the chat route computes it); null: unknown. */
  maxModelLen: number | null;
  /**
   * Text this answer already has (a generation cut by a pause, being continued): the output
   * parser reads it first without emitting it, so the new text is parsed in its context.
   */
  primeText?: string;
}

export interface TokenInEngine {
  /** Whether the continuation planner may use it for echoed history (it needs tokenizeChat without the generation prompt). */
  plansHistory: boolean;
  /** The prompt ids of `messages` rendered by the engine's own chat template and tokenizer (tools and enable_thinking from `call.request`). */
  tokenizeChat(call: TokenizeCall, messages: ChatMessage[], addGenerationPrompt: boolean): Promise<{ ids: number[]; maxModelLen: number | null }>;
  /** Token ids of plain text (special tokens recognised, none added). */
  tokenizeText(call: TokenizeCall, text: string): Promise<number[]>;
  /** The text of token ids as the engine's tokenizer decodes them (special tokens kept). */
  detokenize(call: TokenizeCall, ids: number[]): Promise<string>;
  /** The engine's context length, or null when it does not say. */
  maxModelLen(call: TokenizeCall): Promise<number | null>;
  /** An answer's whole text → the assistant message and finish reason the chat route would give. */
  parseAnswer(call: TokenInCall, text: string, engineFinish: string): { message: AssistantOutput; finish_reason: string };
  generate(call: TokenInCall): Promise<EngineResult>;
  generateStream(call: TokenInCall): AsyncGenerator<EngineStreamEvent>;
}

// Every engine kind has one (the type says so): a call an abort-mode pause cuts can always go on.
const engines: Record<EngineConfig["kind"], TokenInEngine> = { vllm: vllmTokenIn, sglang: sglangTokenIn };

/** The token-in engine for a kind. */
export function tokenInFor(kind: EngineConfig["kind"]): TokenInEngine {
  return engines[kind];
}
