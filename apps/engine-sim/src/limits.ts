import type { PolicyOutput } from "./policy.js";
import type { SimTokenizer } from "./tokenizer.js";

/**
 * Applies a request's stopping rules to what the policy generated, in vLLM v1's order
 * (`vllm/v1/core/sched/utils.py` check_stop): per token, the tokenizer's EOS (stop_reason null),
 * then `stop_token_ids` (stop_reason = id; vLLM adds generation_config's other EOS ids to them unless
 * ignore_eos), then `max_tokens` ("length");
 * stop strings are matched on the detokenised text afterwards and override (stop_reason = string).
 * On a stop (EOS, stop token) the stop token's text is left out unless include_stop_str_in_output,
 * as vLLM's detokenizer does; a stop string truncates the text before it.
 */

export interface StopParams {
  /** The tokenizer's EOS id. */
  eosId: number;
  /** generation_config's other EOS ids (stop tokens unless ignore_eos). */
  extraStopIds: readonly number[];
  maxTokens: number;
  stop: readonly string[];
  stopTokenIds: readonly number[];
  includeStopStrInOutput: boolean;
  skipSpecialTokens: boolean;
  /** `ignore_eos`: the EOS tokens are ordinary tokens. */
  ignoreEos?: boolean;
}

export interface Completion {
  ids: number[];
  finishReason: "stop" | "length";
  stopReason: string | number | null;
  /** Final output text (what the parsers see). */
  text: string;
  /** ends[i] = length of the text streamed once token i is out (monotonic, ≤ text.length). */
  ends: number[];
}

export function applyLimits(policy: PolicyOutput, p: StopParams, tok: SimTokenizer): Completion {
  let ids = policy.ids;
  let finishReason: "stop" | "length" = policy.finish;
  let stopReason: string | number | null = null;
  let stopTerminated = false;
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    if (id === p.eosId && !p.ignoreEos) {
      ids = ids.slice(0, i + 1);
      finishReason = "stop";
      stopTerminated = true;
      break;
    }
    if (p.stopTokenIds.includes(id) || (!p.ignoreEos && p.extraStopIds.includes(id))) {
      ids = ids.slice(0, i + 1);
      finishReason = "stop";
      stopReason = id;
      stopTerminated = true;
      break;
    }
    if (i + 1 >= p.maxTokens) {
      ids = ids.slice(0, i + 1);
      finishReason = "length";
      break;
    }
  }
  const textIds = stopTerminated && !p.includeStopStrInOutput ? ids.slice(0, -1) : ids;
  let { text, ends } = tok.incrementalDecode(textIds, p.skipSpecialTokens);
  if (textIds.length < ids.length) ends.push(text.length);

  if (p.stop.length > 0 && p.stop.some((s) => s && text.includes(s))) {
    const maxLen = Math.max(...p.stop.map((s) => s.length));
    let prev = 0;
    for (let i = 0; i < ids.length; i++) {
      const end = ends[i]!;
      if (end === prev) continue;
      const window = text.slice(Math.max(0, prev - maxLen + 1), end);
      const offset = Math.max(0, prev - maxLen + 1);
      let hit: { s: string; at: number } | undefined;
      for (const s of p.stop) {
        if (!s) continue;
        const at = window.indexOf(s);
        if (at >= 0) {
          hit = { s, at: offset + at };
          break;
        }
      }
      if (hit) {
        ids = ids.slice(0, i + 1);
        finishReason = "stop";
        stopReason = hit.s;
        text = text.slice(0, p.includeStopStrInOutput ? hit.at + hit.s.length : hit.at);
        ends = ends.slice(0, i + 1);
        break;
      }
      prev = end;
    }
  }
  ends = ends.map((e) => Math.min(e, text.length));
  return { ids, finishReason, stopReason, text, ends };
}
