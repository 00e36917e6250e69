import { routedRows, type RoutedExperts } from "@rollgate/protocol";
import { EngineError } from "./errors.js";
import type { RankTarget } from "./registry.js";

/**
 * Routed experts (R3) as the engines send them, read into the stored form (protocol
 * routed-experts.ts): rows for positions `[0, prompt + output - 1)`. An engine configured with
 * `routed_experts: true` whose answer lacks them, or whose rows do not fit the tokens, fails the
 * call: a record without its routing would train an MoE model on routing it cannot replay.
 *
 * vLLM (≥ 0.21, server flag `--enable-return-routed-experts`, no request field, non-streamed answers
 * only): `prompt_routed_experts` `[prompt][layers][topk]` beside the choices, the choice's
 * `routed_experts` `[output - 1][layers][topk]`. SGLang (the same server flag and
 * `return_routed_experts: true` in the request): `sgl_ext.routed_experts` on a chat choice,
 * `meta_info.routed_experts` on /generate, base64 int32 little-endian, flattened.
 */

/** Whether calls to this engine ask for and keep routed experts. */
export function wantsRoutedExperts(target: RankTarget): boolean {
  return target.engine.routed_experts === true;
}

/** The error of an engine configured for routed experts whose answer lacks them. */
export function routedExpertsMissing(target: RankTarget): EngineError {
  const how =
    target.engine.kind === "vllm"
      ? "vLLM ≥ 0.21 started with --enable-return-routed-experts, answering non-streamed"
      : "SGLang started with --enable-return-routed-experts";
  return new EngineError(`the engine returned no routed experts: routed_experts is on for ${target.engine.url}, which needs ${how}`, 502, "bad_response", "the engine returned no routed experts");
}

/** The rows, when they cover exactly `positions` positions. */
export function checkRoutedRows(r: RoutedExperts, positions: number): RoutedExperts {
  const rows = routedRows(r);
  if (rows !== positions) throw new EngineError(`the engine returned routed experts for ${rows} positions, not ${positions} (prompt + output - 1)`, 502, "bad_response");
  return r;
}

/**
 * The stamp of a whole answer read under a freeze-in-place pause (vLLM with routed experts answers
 * whole): the version when it did not change during the call, else unknown (null), since a whole
 * answer does not say which of its tokens came before the change.
 */
export function wholeAnswerStamp(stamp: () => string | null): () => string | null {
  const before = stamp();
  return () => {
    const now = stamp();
    return now === before ? now : null;
  };
}
