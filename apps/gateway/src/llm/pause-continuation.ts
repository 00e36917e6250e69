import { joinRoutedRows, routedRows, type CanonicalChatRequest, type RoutedExperts, type TokenLogprob, type WeightVersion } from "@rollgate/protocol";
import type { EngineResult } from "@rollgate/transforms";

/**
 * Transparent continuation after an abort-mode pause (docs/operations.md#pause-resume-and-weights): the engine cut a call
 * short with finish_reason "abort" and the tokens generated so far. After resume the gateway asks
 * the same rank to go on token-in from prompt + those tokens, on the new weights, and the agent
 * receives one answer. These pure helpers keep what each cut left and join the pieces; every
 * token remembers the weight version it was sampled under.
 */

/** What the pause cuts of one call left so far. */
export interface CutGeneration {
  /** The call's original prompt (the record's prompt_ids). */
  promptIds: number[];
  outputIds: number[];
  outputLogprobs: number[];
  logprobs: TokenLogprob[];
  /** The weight version of each output token. */
  versions: WeightVersion[];
  cachedTokens: number;
  /** How many times a pause cut the call. */
  cuts: number;
  /**
   * Routed experts of prompt + outputIds so far (all positions but the last), when the engine
   * sends them: each position's row comes from the piece whose forward pass sampled the next token.
   */
  routed?: RoutedExperts;
}

/**
 * Routed experts of a sequence grown by one more engine answer: positions already covered keep
 * their rows (they produced the tokens already kept); the piece gives the rest. Undefined when
 * either side has none.
 */
function extendRouted(sofar: RoutedExperts | undefined, covered: number, piece: RoutedExperts | undefined): RoutedExperts | undefined {
  if (!piece) return undefined;
  if (covered === 0) return piece;
  if (!sofar) return undefined;
  return joinRoutedRows([
    { experts: sofar, from: 0, to: covered },
    { experts: piece, from: covered, to: routedRows(piece) },
  ]) ?? undefined;
}

/** Positions of prompt + output the rows cover: every one but the last. */
function coveredPositions(promptIds: readonly number[], outputIds: readonly number[], started: boolean): number {
  return started ? Math.max(promptIds.length + outputIds.length - 1, 0) : 0;
}

/** Adds what an aborted engine answer generated (under `version`) to the call's cut so far. */
export function addCut(cut: CutGeneration | null, aborted: EngineResult, version: WeightVersion): CutGeneration {
  const base: CutGeneration = cut ?? {
    promptIds: aborted.prompt_ids,
    outputIds: [],
    outputLogprobs: [],
    logprobs: [],
    versions: [],
    cachedTokens: aborted.usage.cached_tokens,
    cuts: 0,
  };
  const routed = extendRouted(base.routed, coveredPositions(base.promptIds, base.outputIds, cut !== null), aborted.routed_experts);
  return {
    ...base,
    ...(routed ? { routed } : {}),
    outputIds: base.outputIds.concat(aborted.output_ids),
    outputLogprobs: base.outputLogprobs.concat(aborted.output_logprobs),
    logprobs: base.logprobs.concat(aborted.logprobs),
    versions: base.versions.concat(aborted.output_ids.map(() => version)),
    cuts: base.cuts + 1,
  };
}

/**
 * The request that continues a cut call: the same sampling with max_tokens reduced by what was
 * generated already; null when the cut already used the whole budget (the answer ends on "length").
 */
export function continuationRequest(cut: CutGeneration, request: CanonicalChatRequest): CanonicalChatRequest | null {
  const max = request.sampling.max_tokens;
  if (max === undefined) return request;
  const left = max - cut.outputIds.length;
  if (left <= 0) return null;
  return { ...request, sampling: { ...request.sampling, max_tokens: left } };
}

/** The prompt a continuation is generated from: the original prompt and every token generated so far. */
export function continuationPrompt(cut: CutGeneration): number[] {
  return cut.promptIds.concat(cut.outputIds);
}

/**
 * The whole answer: the cut pieces then the final engine answer (`rest`, under `version`, null
 * when the budget ran out at the cut), with the message and finish reason parsed from the whole
 * text. Usage counts the original prompt once and every generated token.
 */
export function joinContinuation(
  cut: CutGeneration,
  rest: EngineResult | null,
  version: WeightVersion,
  answer: { message: EngineResult["message"]; finish_reason: string },
): { result: EngineResult; versions: WeightVersion[] } {
  const restIds = rest?.output_ids ?? [];
  const outputIds = cut.outputIds.concat(restIds);
  const routed = rest ? extendRouted(cut.routed, coveredPositions(cut.promptIds, cut.outputIds, true), rest.routed_experts) : cut.routed;
  return {
    result: {
      prompt_ids: cut.promptIds,
      output_ids: outputIds,
      output_logprobs: cut.outputLogprobs.concat(rest?.output_logprobs ?? []),
      logprobs: cut.logprobs.concat(rest?.logprobs ?? []),
      message: answer.message,
      finish_reason: answer.finish_reason,
      stop_reason: rest?.stop_reason ?? null,
      usage: { prompt_tokens: cut.promptIds.length, completion_tokens: outputIds.length, cached_tokens: cut.cachedTokens },
      ...(routed ? { routed_experts: routed } : {}),
    },
    versions: cut.versions.concat(restIds.map(() => version)),
  };
}
