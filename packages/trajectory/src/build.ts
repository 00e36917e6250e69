import type { CompletionRecord, Trace, TrajectoryBuilderName } from "@rollgate/protocol";
import { checkTraceInvariants, checkTreeInvariants } from "./invariants.js";
import { classifyTraces, nameBreaks } from "./kinds.js";
import { perRequestTraces } from "./per-request.js";
import { prefixMergingTraces } from "./prefix-merging.js";
import { buildPrefixTree } from "./prefix-tree.js";
import { orderRecords } from "./records.js";
import { computeStats } from "./stats.js";
import type { BuildOptions, BuiltTrajectory } from "./types.js";

/**
 * Completion records → traces: sort by seq, check every record, build, classify each trace's kind,
 * check every trace (and the tree), count. Throws `TrajectoryInvariantError` (naming the record)
 * instead of returning a trace a trainer would silently mis-train on.
 */
export function buildTrajectory(
  records: readonly CompletionRecord[],
  builder: TrajectoryBuilderName,
  options: BuildOptions = {},
): BuiltTrajectory {
  const vocabSize = options.vocabSize ?? null;
  const ordered = orderRecords(records, vocabSize);
  const trainReplayed = options.trainReplayed ?? false;
  const built = builder === "per_request" ? perRequestTraces(ordered, trainReplayed) : prefixMergingTraces(ordered, options.template, trainReplayed);
  const origins = classifyTraces(built.records);
  const traces: Trace[] = built.traces.map((t, i) => ({ kind: origins[i]?.kind ?? "main", parent: origins[i]?.parent ?? null, ...t }));
  built.breaks = nameBreaks(built.breaks, built.records.map((rs) => rs[0]?.id), origins);
  traces.forEach((trace, i) => checkTraceInvariants(trace, { vocabSize, traceIndex: i, spans: built.spans[i] }));
  const stats = computeStats(ordered, built);
  if (builder !== "prefix_tree") return { builder, traces, stats };
  const tree = buildPrefixTree(traces, built.spans);
  checkTreeInvariants(tree, traces);
  return { builder, traces, stats, tree };
}

export function perRequest(records: readonly CompletionRecord[], options?: BuildOptions): BuiltTrajectory {
  return buildTrajectory(records, "per_request", options);
}

export function prefixMerging(records: readonly CompletionRecord[], options?: BuildOptions): BuiltTrajectory {
  return buildTrajectory(records, "prefix_merging", options);
}

/** The session's conversations as a tree of shared token prefixes (`tree`), and as flat samples (`traces`). */
export function prefixTree(records: readonly CompletionRecord[], options?: BuildOptions): BuiltTrajectory {
  return buildTrajectory(records, "prefix_tree", options);
}
