import type { BreakReason, RecordSpan, Trace, TraceBreak, TraceStats, Trajectory, TrajectoryStats, WeightVersion } from "@rollgate/protocol";

/** Qwen3's embedding size (151_643 BPE tokens + added tokens, padded): the default id bound. */
export const QWEN3_VOCAB_SIZE = 151_936;

export interface BuildOptions {
  /** Every prompt and output id must be an integer in [0, vocabSize). Default 151_936 (Qwen3). */
  vocabSize?: number;
}

// The stats shapes live in protocol (they cross the API boundary); these names are kept for
// readability inside this package.
export type { RecordSpan, TraceStats };
export type BuiltTraceBreak = TraceBreak;
export type BuiltTrajectoryStats = TrajectoryStats;
export type BuiltTrajectory = Trajectory;

/** What a builder produces before stats are attached. */
export interface BuiltTraces {
  traces: Trace[];
  spans: RecordSpan[][];
  /** Per trace, the weight version of each merged record, in order. */
  record_versions: WeightVersion[][];
  breaks: BuiltTraceBreak[];
}

export type { BreakReason };
