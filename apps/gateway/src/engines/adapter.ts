import type { EngineConfig } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "@rollgate/transforms";
import { vllmChat, vllmChatStream, vllmCountTokens, type EngineCall } from "./vllm.js";

/**
 * What the gateway needs from an engine, whatever its kind. Every adapter asks the engine for
 * its own token ids and logprobs and fails the call (EngineError, 502) when they do not come back.
 */
export interface EngineAdapter {
  chat(call: EngineCall): Promise<EngineResult>;
  chatStream(call: EngineCall): AsyncGenerator<EngineStreamEvent>;
  countTokens(call: Omit<EngineCall, "requestId">): Promise<number>;
}

const vllm: EngineAdapter = { chat: vllmChat, chatStream: vllmChatStream, countTokens: vllmCountTokens };

const adapters: Partial<Record<EngineConfig["kind"], EngineAdapter>> = { vllm };

/** The adapter for an engine kind, or undefined when rollgate cannot drive it yet. */
export function adapterFor(kind: EngineConfig["kind"]): EngineAdapter | undefined {
  return adapters[kind];
}

/** Registers an adapter (the SGLang one registers itself from its module). */
export function registerAdapter(kind: EngineConfig["kind"], adapter: EngineAdapter): void {
  adapters[kind] = adapter;
}
