import type { EngineResult, EngineStreamEvent } from "@rollgate/transforms";
import { sglangChat, sglangChatStream, sglangCountTokens } from "./sglang/chat.js";
import { vllmChat, vllmChatStream, vllmCountTokens, vllmTellsPromptFirst } from "./vllm/chat.js";
import { type EngineCall } from "./call.js";
import type { EngineConfig } from "../env.js";

/**
 * What the gateway needs from an engine, whatever its kind. Every adapter asks the engine for
 * its own token ids and logprobs and fails the call (EngineError, 502) when they do not come back.
 */
export interface EngineAdapter {
  chat(call: EngineCall): Promise<EngineResult>;
  chatStream(call: EngineCall): AsyncGenerator<EngineStreamEvent>;
  countTokens(call: Omit<EngineCall, "requestId">): Promise<number>;
  /** Whether this call (streamed to the agent or not) tells `onPromptIds` from the engine's first chunk, before the answer is complete. */
  tellsPromptFirst(call: EngineCall, streamed: boolean): boolean;
}

const vllm: EngineAdapter = { chat: vllmChat, chatStream: vllmChatStream, countTokens: vllmCountTokens, tellsPromptFirst: vllmTellsPromptFirst };

// SGLang's stream sends the prompt's ids once, at its end; a whole answer brings them with the rest.
const sglang: EngineAdapter = { chat: sglangChat, chatStream: sglangChatStream, countTokens: sglangCountTokens, tellsPromptFirst: () => false };

const adapters: Record<EngineConfig["kind"], EngineAdapter> = { vllm, sglang };

/** The adapter for an engine kind, or undefined when rollgate cannot drive it. */
export function adapterFor(kind: string): EngineAdapter | undefined {
  return adapters[kind as EngineConfig["kind"]];
}
