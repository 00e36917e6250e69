import { z } from "zod";
import { WeightVersion } from "./ids.js";
import { LostCalls } from "./lost-calls.js";
import { PrefixTree } from "./prefix-tree.js";
import { RoutedExperts } from "./routed-experts.js";
import { TraceKind, TraceParent } from "./trace-kind.js";

export const TrajectoryBuilderName = z.enum(["per_request", "prefix_merging", "prefix_tree"]);
export type TrajectoryBuilderName = z.infer<typeof TrajectoryBuilderName>;

/** One training sample built from one or more completion records (docs/data-model.md#trace-and-trajectory). */
export const Trace = z.object({
  /** Which conversation of the rollout this is (docs/trace-kinds.md). */
  kind: TraceKind.default("main"),
  /** The trace (and tool call) it came from, when the wire shows it. */
  parent: TraceParent.nullable().default(null),
  prompt_ids: z.array(z.number().int()),
  response_ids: z.array(z.number().int()),
  response_logprobs: z.array(z.number()),
  loss_mask: z.array(z.union([z.literal(0), z.literal(1)])),
  weight_versions: z.array(WeightVersion),
  completion_ids: z.array(z.string()),
  finish_reason: z.string(),
  /**
   * The routed experts of `prompt_ids ++ response_ids` (all positions but the last), each taken
   * from the record whose forward pass sampled the next token; present when every record has them.
   */
  routed_experts: RoutedExperts.optional(),
});
export type Trace = z.infer<typeof Trace>;

export const BreakReason = z.enum([
  "history_rewritten",
  "tools_changed",
  "system_changed",
  "sibling",
  "truncated_output",
  "unknown",
  // The record starts a conversation of another kind (TraceKind): no break in the agent's own conversation.
  "sub_agent",
  "compaction",
  "side_request",
]);
export type BreakReason = z.infer<typeof BreakReason>;

/** Why a record started a new trace instead of extending one. */
export const TraceBreak = z.object({
  record_id: z.string(),
  /** Index of the trace whose tip this record came closest to extending. */
  closest_trace: z.number().int().nullable(),
  /** First token position where the record's prompt differs from that chain. */
  position: z.number().int().nullable(),
  reason: BreakReason,
  /** A readable explanation of the break. */
  detail: z.string(),
});
export type TraceBreak = z.infer<typeof TraceBreak>;

/**
 * Where one record's tokens sit in a trace's response arrays: `[start, output_start)` is the
 * glue taken from its prompt (mask 0), `[output_start, end)` its sampled output (mask 1).
 */
export const RecordSpan = z.object({
  record_id: z.string(),
  start: z.number().int(),
  output_start: z.number().int(),
  end: z.number().int(),
});
export type RecordSpan = z.infer<typeof RecordSpan>;

export const TraceStats = z.object({
  /** Index into `traces`. */
  trace: z.number().int(),
  records: z.number().int(),
  response_tokens: z.number().int(),
  trainable_tokens: z.number().int(),
  /** Distinct weight versions of the records merged into this trace, in order of first use (a branch's masked replayed answers not counted: they are no sample of this run). */
  weight_versions: z.array(WeightVersion),
  /** How many times the weight version changes along this trace's generated tokens (between records, or inside one continued after a pause). */
  weight_changes: z.number().int(),
  spans: z.array(RecordSpan),
});
export type TraceStats = z.infer<typeof TraceStats>;

export const TrajectoryStats = z.object({
  records: z.number().int(),
  traces: z.number().int(),
  response_tokens: z.number().int(),
  trainable_tokens: z.number().int(),
  breaks: z.array(TraceBreak),
  weight_versions: z.array(WeightVersion),
  /** Records that extended an existing trace. */
  merged_records: z.number().int(),
  weight_changes: z.number().int(),
  /** Traces whose tokens were sampled under more than one weight version. */
  traces_with_weight_change: z.number().int(),
  per_trace: z.array(TraceStats),
  /**
   * LLM calls of the session that failed (the engine refused, broke off or was unreachable): they
   * have no tokens to train on, but a trainer should know the agent saw an error there.
   */
  failed_calls: z.array(z.object({ seq: z.number().int(), at: z.string(), kind: z.string(), message: z.string(), dp_rank: z.number().int() })).default([]),
  /**
   * The session's calls lost to infrastructure, as its `lost_calls` says when the trajectory is
   * read: a lost call's tokens may be missing from the traces (an answer the agent got whose record
   * never came reads as masked glue in the next call), so a trajectory with any is not a whole rollout.
   */
  lost_calls: LostCalls.default({ count: 0, first: null }),
});
export type TrajectoryStats = z.infer<typeof TrajectoryStats>;

export const Trajectory = z.object({
  builder: TrajectoryBuilderName,
  traces: z.array(Trace),
  stats: TrajectoryStats,
  /** `prefix_tree` only: the same conversations as a tree of shared token prefixes (`traces` is its flat view). */
  tree: PrefixTree.optional(),
});
export type Trajectory = z.infer<typeof Trajectory>;

/** A run of response tokens with one loss-mask value, as text: `trainable` = sampled by the policy (mask 1). */
export const DecodedSegment = z.object({ trainable: z.boolean(), tokens: z.number().int(), text: z.string() });
export type DecodedSegment = z.infer<typeof DecodedSegment>;

/** `GET /v1/sessions/:id/trajectory/decoded`: a trajectory as the engine's own tokenizer reads it. */
export const DecodedTrajectory = z.object({
  session_id: z.string(),
  /** The engine whose /detokenize decoded the tokens. */
  engine: z.string(),
  builder: TrajectoryBuilderName,
  traces: z.array(
    z.object({
      index: z.number().int(),
      finish_reason: z.string(),
      prompt_tokens: z.number().int(),
      response_tokens: z.number().int(),
      trainable_tokens: z.number().int(),
      prompt_text: z.string(),
      segments: z.array(DecodedSegment),
      weight_versions: z.array(WeightVersion),
    }),
  ),
  stats: TrajectoryStats.pick({ records: true, traces: true, response_tokens: true, trainable_tokens: true, breaks: true, weight_versions: true }),
});
export type DecodedTrajectory = z.infer<typeof DecodedTrajectory>;
