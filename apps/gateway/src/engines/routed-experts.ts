import { packRoutedRows, routedRows, type RoutedExperts } from "@rollgate/protocol";
import { z } from "zod";
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

export const VllmRows = z.array(z.array(z.array(z.number().int())));
export const SglangRoutedField = z.string();

/** Whether calls to this engine ask for and keep routed experts. */
export function wantsRoutedExperts(target: RankTarget): boolean {
  return target.engine.routed_experts === true;
}

function missing(target: RankTarget): EngineError {
  const how =
    target.engine.kind === "vllm"
      ? "vLLM ≥ 0.21 started with --enable-return-routed-experts, answering non-streamed"
      : "SGLang started with --enable-return-routed-experts";
  return new EngineError(`the engine returned no routed experts: routed_experts is on for ${target.engine.url}, which needs ${how}`, 502, "bad_response");
}

function checkRows(r: RoutedExperts, positions: number): RoutedExperts {
  const rows = routedRows(r);
  if (rows !== positions) throw new EngineError(`the engine returned routed experts for ${rows} positions, not ${positions} (prompt + output - 1)`, 502, "bad_response");
  return r;
}

/** vLLM's two nested lists → the stored rows; undefined when routed experts are off for the engine. */
export function fromVllm(target: RankTarget, prompt: unknown, output: unknown, promptLen: number, outputLen: number): RoutedExperts | undefined {
  if (!wantsRoutedExperts(target)) return undefined;
  const p = VllmRows.safeParse(prompt);
  const o = VllmRows.safeParse(output ?? []);
  if (prompt == null || !p.success || !o.success) throw missing(target);
  const rows = p.data.concat(o.data);
  const first = rows[0]?.[0];
  if (!first || first.length === 0) throw missing(target);
  const positions = Math.max(promptLen + outputLen - 1, 0);
  let packed: RoutedExperts;
  try {
    packed = packRoutedRows(rows.slice(0, positions), { layers: rows[0]!.length, topk: first.length });
  } catch (err) {
    throw new EngineError(`the engine's routed experts are ragged: ${(err as Error).message}`, 502, "bad_response");
  }
  return checkRows(packed, positions);
}

/** SGLang's base64 int32 → the stored rows (the row width is what fits the positions). */
export function fromSglang(target: RankTarget, field: unknown, promptLen: number, outputLen: number): RoutedExperts | undefined {
  if (!wantsRoutedExperts(target)) return undefined;
  const data = SglangRoutedField.safeParse(field);
  if (!data.success || data.data === "") throw missing(target);
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
