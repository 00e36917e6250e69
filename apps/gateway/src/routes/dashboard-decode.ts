import type { Trace, Trajectory } from "@rollgate/protocol";

/** Turns token ids into text (the engine's own /detokenize in production; anything in tests). */
export interface TokenDecoder {
  decode(ids: number[]): Promise<string>;
}

/** A run of response tokens with one loss-mask value: `trainable` = sampled by the policy (mask 1). */
export interface DecodedSegment {
  trainable: boolean;
  tokens: number;
  text: string;
}

export interface DecodedTrace {
  index: number;
  finish_reason: string;
  prompt_tokens: number;
  response_tokens: number;
  trainable_tokens: number;
  prompt_text: string;
  segments: DecodedSegment[];
  weight_versions: (string | null)[];
}

/**
 * Decodes a trace for people: the prompt as one text, the response as runs of equal loss mask.
 * Runs are decoded whole (not token by token), so a character split across tokens stays intact.
 */
export async function decodeTrace(trace: Trace, index: number, decoder: TokenDecoder): Promise<DecodedTrace> {
  const runs: { trainable: boolean; ids: number[] }[] = [];
  let start = 0;
  for (let i = 1; i <= trace.response_ids.length; i++) {
    if (i === trace.response_ids.length || trace.loss_mask[i] !== trace.loss_mask[start]) {
      runs.push({ trainable: trace.loss_mask[start] === 1, ids: trace.response_ids.slice(start, i) });
      start = i;
    }
  }
  const [promptText, ...texts] = await Promise.all([decoder.decode(trace.prompt_ids), ...runs.map((r) => decoder.decode(r.ids))]);
  const segments: DecodedSegment[] = runs.map((r, i) => ({ trainable: r.trainable, tokens: r.ids.length, text: texts[i]! }));
  return {
    index,
    finish_reason: trace.finish_reason,
    prompt_tokens: trace.prompt_ids.length,
    response_tokens: trace.response_ids.length,
    trainable_tokens: trace.loss_mask.reduce<number>((a, m) => a + m, 0),
    prompt_text: promptText!,
    segments,
    weight_versions: [...new Set(trace.weight_versions)],
  };
}

export async function decodeTrajectory(trajectory: Trajectory, decoder: TokenDecoder) {
  return {
    builder: trajectory.builder,
    traces: await Promise.all(trajectory.traces.map((t, i) => decodeTrace(t, i, decoder))),
    stats: {
      records: trajectory.stats.records,
      traces: trajectory.stats.traces,
      response_tokens: trajectory.stats.response_tokens,
      trainable_tokens: trajectory.stats.trainable_tokens,
      breaks: trajectory.stats.breaks,
      weight_versions: trajectory.stats.weight_versions,
    },
  };
}
