import { packRoutedRows, type RoutedExperts } from "@rollgate/protocol";
import { z } from "zod";
import { EngineError } from "../errors.js";
import type { RankTarget } from "../registry.js";
import { checkRoutedRows, routedExpertsMissing, wantsRoutedExperts } from "../routed-experts.js";

/**
 * vLLM's routed experts (≥ 0.21, server flag `--enable-return-routed-experts`, no request field,
 * non-streamed answers only): `prompt_routed_experts` `[prompt][layers][topk]` beside the choices,
 * the choice's `routed_experts` `[output - 1][layers][topk]`.
 */
const VllmRows = z.array(z.array(z.array(z.number().int())));

/** vLLM's two nested lists → the stored rows; undefined when routed experts are off for the engine. */
export function fromVllm(target: RankTarget, prompt: unknown, output: unknown, promptLen: number, outputLen: number): RoutedExperts | undefined {
  if (!wantsRoutedExperts(target)) return undefined;
  const p = VllmRows.safeParse(prompt);
  const o = VllmRows.safeParse(output ?? []);
  if (prompt == null || !p.success || !o.success) throw routedExpertsMissing(target);
  const rows = p.data.concat(o.data);
  const first = rows[0]?.[0];
  if (!first || first.length === 0) throw routedExpertsMissing(target);
  const positions = Math.max(promptLen + outputLen - 1, 0);
  let packed: RoutedExperts;
  try {
    packed = packRoutedRows(rows.slice(0, positions), { layers: rows[0]!.length, topk: first.length });
  } catch (err) {
    throw new EngineError(`the engine's routed experts are ragged: ${(err as Error).message}`, 502, "bad_response");
  }
  return checkRoutedRows(packed, positions);
}
