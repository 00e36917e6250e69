import type { RoutedExperts } from "@rollgate/protocol";
import { z } from "zod";
import { EngineError } from "../errors.js";
import type { RankTarget } from "../registry.js";
import { routedExpertsMissing, wantsRoutedExperts } from "../routed-experts.js";

/**
 * SGLang's routed experts (server flag `--enable-return-routed-experts` and
 * `return_routed_experts: true` in the request): `sgl_ext.routed_experts` on a chat choice,
 * `meta_info.routed_experts` on /generate, base64 int32 little-endian, flattened.
 */

/** SGLang's base64 int32 → the stored rows (the row width is what fits the positions). */
export function fromSglang(target: RankTarget, field: unknown, promptLen: number, outputLen: number): RoutedExperts | undefined {
  if (!wantsRoutedExperts(target)) return undefined;
  const data = z.string().safeParse(field);
  if (!data.success || data.data === "") throw routedExpertsMissing(target);
  const positions = promptLen + outputLen - 1;
  const ids = Buffer.byteLength(data.data, "base64") / 4;
  const width = positions > 0 ? ids / positions : 0;
  if (!Number.isInteger(width) || width <= 0) {
    throw new EngineError(`the engine returned ${ids} routed expert ids, which do not divide into ${positions} positions`, 502, "bad_response");
  }
  return { layers: null, topk: null, width, data: data.data };
}

/** The request field SGLang needs besides its server flag. */
export function sglangRoutedExpertsField(target: RankTarget): Record<string, unknown> {
  return wantsRoutedExperts(target) ? { return_routed_experts: true } : {};
}
