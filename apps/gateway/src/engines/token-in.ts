import type { ChatMessage, EngineConfig } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "@rollgate/transforms";
import type { EngineCall } from "./vllm.js";
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
}

export interface TokenInEngine {
  /** The prompt ids of `messages` rendered by the engine's own chat template and tokenizer (tools and enable_thinking from `call.request`). */
  tokenizeChat(call: TokenizeCall, messages: ChatMessage[], addGenerationPrompt: boolean): Promise<{ ids: number[]; maxModelLen: number | null }>;
  /** Token ids of plain text (special tokens recognised, none added). */
  tokenizeText(call: TokenizeCall, text: string): Promise<number[]>;
  generate(call: TokenInCall): Promise<EngineResult>;
  generateStream(call: TokenInCall): AsyncGenerator<EngineStreamEvent>;
}

const engines: Partial<Record<EngineConfig["kind"], TokenInEngine>> = { vllm: vllmTokenIn };

/** The token-in engine for a kind, or undefined (calls are then always rendered by the engine). */
export function tokenInFor(kind: EngineConfig["kind"]): TokenInEngine | undefined {
  return engines[kind];
}

export function registerTokenIn(kind: EngineConfig["kind"], engine: TokenInEngine): void {
  engines[kind] = engine;
}
