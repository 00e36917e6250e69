import type { Generation } from "../engine.js";
import { generationRows, nestRows, packInt32Base64 } from "../moe.js";
import type { SimState } from "../state.js";

/**
 * Routed experts on the wire (README "Routed experts"). vLLM returns them whenever the server runs
 * with the flag, on non-streamed answers only; SGLang when the request also sets
 * `return_routed_experts: true`, streamed (on the finishing chunk) or not.
 */

/** Whether this answer carries routed experts. */
export function returnsRoutedExperts(sim: SimState, body: { return_routed_experts?: unknown }, sglang: boolean): boolean {
  if (!sim.opts.returnRoutedExperts || !sim.opts.moe) return false;
  return sglang ? body.return_routed_experts === true : true;
}

/**
 * vLLM: `prompt_routed_experts` `[prompt_len][layers][topk]` (positions served from the prefix
 * cache are rows of -1) and the choice's `routed_experts` for every generated token fed back
 * through the model (all but the last).
 */
export function vllmRoutedExperts(sim: SimState, g: Generation, promptIds: readonly number[]): { prompt: number[][][]; output: number[][][] } {
  const spec = sim.opts.moe!;
  const rows = generationRows(spec, { promptIds, tokens: g.tokens, promptVersion: g.promptVersion }, sim.weightVersion);
  const cachedRow = Array.from({ length: spec.layers * spec.topk }, () => -1);
  const prompt = rows.prompt.map((r, i) => (i < g.cached ? cachedRow : r));
  return { prompt: nestRows(spec, prompt), output: nestRows(spec, rows.output) };
}

/** SGLang: `[0, seqlen - 1)` of prompt + output, flattened int32 little-endian, base64. */
export function sglangRoutedExperts(sim: SimState, g: Generation, promptIds: readonly number[]): string {
  const rows = generationRows(sim.opts.moe!, { promptIds, tokens: g.tokens, promptVersion: g.promptVersion }, sim.weightVersion);
  return packInt32Base64([...rows.prompt, ...rows.output]);
}
