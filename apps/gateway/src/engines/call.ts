import type { CanonicalChatRequest } from "@rollgate/protocol";
import type { Dispatcher } from "undici";
import type { RankTarget } from "./registry.js";

/** One engine call, whatever the engine kind: where it goes, what it asks, and how it is cancelled. */
export interface EngineCall {
  target: RankTarget;
  model: string;
  request: CanonicalChatRequest;
  requestId: string;
  signal: AbortSignal;
  dispatcher: Dispatcher;
  /**
   * A pre-tokenised prompt for the chat route (token-in): the engine generates from these ids while
   * the messages and tools still drive its tool and reasoning parsers. `field` is how this engine
   * takes it (capabilities.ts probes which one it honours).
   */
  promptIds?: { ids: number[]; field: ChatPromptField };
  /**
   * Set when a freeze-in-place pause may fall inside this call: the weight version current now. The
   * adapter reads the answer as it arrives and stamps each token with it (EngineResult.output_versions).
   */
  stamp?: () => string | null;
  /**
   * SGLang: its streamed chat tells the ids (capabilities.ts `streamedIds`), so a streamed call is
   * streamed from the engine rather than answered whole and told as events.
   */
  streamedIds?: boolean;
  /**
   * Told the engine's prompt ids (its own render of the request) as soon as they arrive, before the
   * answer is complete, by adapters that read them from the first chunk of the engine's stream
   * (EngineAdapter.tellsPromptFirst).
   */
  onPromptIds?: (ids: number[]) => void;
}

/**
 * How a chat route takes a pre-tokenised prompt: vLLM `prompt_token_ids` (PR #55771) or
 * `kv_transfer_params.prompt_token_ids` (PR #48145), SGLang `input_ids`.
 */
export type ChatPromptField = "prompt_token_ids" | "kv_transfer_params" | "input_ids";

/** The body fields that carry a pre-tokenised prompt. */
export function promptIdsFields(p: EngineCall["promptIds"]): Record<string, unknown> {
  if (!p) return {};
  if (p.field === "kv_transfer_params") return { kv_transfer_params: { prompt_token_ids: p.ids } };
  return { [p.field]: p.ids };
}

const routeUrls = new Map<string, URL>();
/**
 * An engine route's URL, parsed once: undici parses a string URL on every request (a WHATWG URL
 * parse per engine call), and a URL it is given is used as is. Engines and routes are few.
 */
export function engineUrl(base: string, path: string): URL {
  const key = base + path;
  let url = routeUrls.get(key);
  if (!url) routeUrls.set(key, (url = new URL(key)));
  return url;
}
