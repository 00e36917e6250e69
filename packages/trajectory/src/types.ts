import type { BreakReason, CompletionRecord, RecordSpan, Trace, TraceBreak, TraceStats, Trajectory, TrajectoryStats, WeightVersion } from "@rollgate/protocol";

/**
 * What the break classifier may know of the chat template that rendered the records (the gateway
 * fills it from the engine's model profile). Without it, breaks get the generic wording.
 */
export interface TemplateFacts {
  /** Name of the model profile, quoted in break details. */
  profile?: string;
  /** User messages wrapped in one of these (open, close) are tool results the template marks, not user queries. */
  toolResultWrappers?: readonly (readonly [string, string])[];
  /** How this template drops earlier reasoning at a new user query, in words (null: it is not known to). */
  reasoningDropped?: string | null;
  /** How this template re-renders earlier turns without the generation prompt they were sampled after. */
  generationPromptDropped?: string | null;
  /** How this template otherwise re-renders a generated turn differently from what the model wrote. */
  rerendered?: string | null;
}

export interface BuildOptions {
  /** Every prompt and output id must be an integer in [0, vocabSize); absent or null: any non-negative integer. */
  vocabSize?: number | null;
  /** What is known of the chat template, for break reasons. */
  template?: TemplateFacts;
  /** A branch's replayed answers (records with `replayed_from`) stay trainable; by default they are loss_mask 0. */
  trainReplayed?: boolean;
}

// The stats shapes live in protocol (they cross the API boundary); these names are kept for
// readability inside this package.
export type { RecordSpan, TraceStats };
export type BuiltTraceBreak = TraceBreak;
export type BuiltTrajectoryStats = TrajectoryStats;
export type BuiltTrajectory = Trajectory;

/** A trace's tokens, before its kind and parent are known. */
export type TraceTokens = Omit<Trace, "kind" | "parent">;

/** What a builder produces before kinds and stats are attached. */
export interface BuiltTraces {
  traces: TraceTokens[];
  /** Per trace, the records it holds, in order. */
  records: CompletionRecord[][];
  spans: RecordSpan[][];
  /** Per trace, the weight versions of each merged record it trains, in order (none for a masked replayed answer). */
  record_versions: WeightVersion[][];
  breaks: BuiltTraceBreak[];
}

export type { BreakReason };
