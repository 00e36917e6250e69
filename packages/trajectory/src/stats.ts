import type { CompletionRecord, WeightVersion } from "@rollgate/protocol";
import type { BuiltTraces, BuiltTrajectoryStats, TraceStats } from "./types.js";

function distinct(versions: readonly WeightVersion[]): WeightVersion[] {
  return [...new Set(versions)];
}

/** Trajectory statistics, including per-trace weight-version spans. */
export function computeStats(records: readonly CompletionRecord[], built: BuiltTraces): BuiltTrajectoryStats {
  const per_trace: TraceStats[] = built.traces.map((t, i) => {
    const versions = built.record_versions[i] ?? [];
    let changes = 0;
    for (let k = 1; k < versions.length; k++) if (versions[k] !== versions[k - 1]) changes++;
    return {
      trace: i,
      records: t.completion_ids.length,
      response_tokens: t.response_ids.length,
      trainable_tokens: t.loss_mask.reduce<number>((a, m) => a + m, 0),
      weight_versions: distinct(versions),
      weight_changes: changes,
      spans: built.spans[i] ?? [],
    };
  });
  return {
    records: records.length,
    traces: built.traces.length,
    response_tokens: per_trace.reduce((a, s) => a + s.response_tokens, 0),
    trainable_tokens: per_trace.reduce((a, s) => a + s.trainable_tokens, 0),
    breaks: built.breaks,
    // The traces' (a masked replayed answer's version is no policy of this run's samples).
    weight_versions: distinct(built.record_versions.flat()),
    merged_records: records.length - built.traces.length,
    weight_changes: per_trace.reduce((a, s) => a + s.weight_changes, 0),
    traces_with_weight_change: per_trace.filter((s) => s.weight_changes > 0).length,
    per_trace,
    // The builder sees only successful calls; the gateway adds the session's failed ones.
    failed_calls: [],
    lost_calls: { count: 0, first: null },
  };
}
