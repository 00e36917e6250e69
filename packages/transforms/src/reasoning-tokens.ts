import type { TokenLogprob } from "@rollgate/protocol";
import type { EngineResult } from "./canonical.js";

/**
 * Output tokens spent reasoning: up to and including the first reasoning end marker (the model
 * profile's, `</think>` for Qwen3), found by the engine's token text. The first: the same marker may
 * end later parts of the answer too (gpt-oss ends a commentary preamble with the `<|end|>` that
 * ended its analysis), and those are not reasoning. An answer cut by max_tokens before any marker
 * was cut inside its reasoning: every token is. Undefined when not countable: no reasoning, no
 * marker known, no token text (a replayed answer's logprobs have none), or a marker never seen.
 */
export function countReasoningTokens(
  logprobs: readonly TokenLogprob[],
  reasoning: string | null,
  end: string | null | undefined,
  finishReason: string,
): number | undefined {
  if (reasoning === null || !end || !logprobs.some((l) => l.token !== "")) return undefined;
  const at = logprobs.findIndex((l) => l.token === end);
  if (at >= 0) return at + 1;
  return finishReason === "length" ? logprobs.length : undefined;
}

/**
 * An answer's reasoning tokens: the count its usage already carries (a replayed answer's, from its
 * source's record), else counted from its token text; undefined when neither is known.
 */
export function reasoningTokensOf(result: Pick<EngineResult, "logprobs" | "message" | "finish_reason" | "usage">, end: string | null | undefined): number | undefined {
  return result.usage.reasoning_tokens ?? countReasoningTokens(result.logprobs, result.message.reasoning, end, result.finish_reason);
}
