import type { CompletionRecord, TrajectoryBuilderName } from "@rollgate/protocol";
import { checkTraceInvariants } from "./invariants.js";
import { perRequestTraces } from "./per-request.js";
import { prefixMergingTraces } from "./prefix-merging.js";
import { orderRecords } from "./records.js";
import { computeStats } from "./stats.js";
import type { BuildOptions, BuiltTrajectory } from "./types.js";

/**
 * Completion records → traces: sort by seq, check every record, build, check every trace, count.
 * Throws `TrajectoryInvariantError` (naming the record) instead of returning a trace a trainer
 * would silently mis-train on.
 */
export function buildTrajectory(
  records: readonly CompletionRecord[],
  builder: TrajectoryBuilderName,
  options: BuildOptions = {},
): BuiltTrajectory {
  const vocabSize = options.vocabSize ?? null;
  const ordered = orderRecords(records, vocabSize);
  const built = builder === "per_request" ? perRequestTraces(ordered) : prefixMergingTraces(ordered, options.template);
  built.traces.forEach((trace, i) => checkTraceInvariants(trace, { vocabSize, traceIndex: i, spans: built.spans[i] }));
  return { builder, traces: built.traces, stats: computeStats(ordered, built) };
}

export function perRequest(records: readonly CompletionRecord[], options?: BuildOptions): BuiltTrajectory {
  return buildTrajectory(records, "per_request", options);
}

export function prefixMerging(records: readonly CompletionRecord[], options?: BuildOptions): BuiltTrajectory {
  return buildTrajectory(records, "prefix_merging", options);
}
