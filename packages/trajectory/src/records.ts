import type { CompletionRecord, WeightVersion } from "@rollgate/protocol";
import { TrajectoryInvariantError } from "./errors.js";
import { checkRecordInvariants } from "./invariants.js";

/**
 * The session's records in `seq` order, each checked (logprobs, ids) before any builder sees it.
 * Two records with the same id or the same seq, or records of different sessions, fail the build.
 */
export function orderRecords(records: readonly CompletionRecord[], vocabSize: number | null): CompletionRecord[] {
  const sorted = records
    .map((r, i) => ({ r, i }))
    .sort((a, b) => a.r.seq - b.r.seq || a.i - b.i)
    .map((x) => x.r);
  const ids = new Set<string>();
  let prev: CompletionRecord | undefined;
  for (const r of sorted) {
    if (ids.has(r.id)) throw new TrajectoryInvariantError("duplicate_record", "appears twice", { record_id: r.id });
    ids.add(r.id);
    if (prev !== undefined) {
      if (prev.seq === r.seq) {
        throw new TrajectoryInvariantError("duplicate_seq", `has the same seq ${r.seq} as record ${prev.id}`, { record_id: r.id });
      }
      if (prev.session_id !== r.session_id) {
        throw new TrajectoryInvariantError(
          "mixed_sessions",
          `belongs to session ${r.session_id}, not ${prev.session_id}`,
          { record_id: r.id },
        );
      }
    }
    checkRecordInvariants(r, vocabSize);
    prev = r;
  }
  return sorted;
}

/** The weight version of each output token (a fresh array): the record's own list when a pause split it, else `weight_version` throughout. */
export function outputVersions(r: CompletionRecord): WeightVersion[] {
  return r.output_weight_versions?.slice() ?? r.output_ids.map(() => r.weight_version);
}

/** The record's weight versions in the order its tokens used them (one entry per run of equal versions). */
export function versionRuns(r: CompletionRecord): WeightVersion[] {
  if (!r.output_weight_versions) return [r.weight_version];
  const runs: WeightVersion[] = [];
  for (const v of r.output_weight_versions) if (runs.length === 0 || runs.at(-1) !== v) runs.push(v);
  return runs.length > 0 ? runs : [r.weight_version];
}

/**
 * Whether a record's output is trained on: a branch's replayed answer is not a sample of this run
 * (docs/data-model.md#branches), so it is masked unless the branch asked to train it.
 */
export function trainable(r: CompletionRecord, trainReplayed = false): boolean {
  return r.replayed_from === undefined || trainReplayed;
}

/**
 * The versions that sampled what a trace trains of this record (its versionRuns), none for a
 * masked replayed answer: its trace's weight stats count the policies its trainable tokens came from.
 */
export function trainedVersionRuns(r: CompletionRecord, trainReplayed = false): WeightVersion[] {
  return trainable(r, trainReplayed) ? versionRuns(r) : [];
}

/** A record's output columns in a trace: its logprobs, mask 1 and versions when trained, else 0 / 0 / null. */
export function outputColumns(r: CompletionRecord, trainReplayed = false): { logprobs: number[]; mask: (0 | 1)[]; versions: WeightVersion[] } {
  if (trainable(r, trainReplayed)) return { logprobs: r.output_logprobs.slice(), mask: r.output_ids.map(() => 1 as const), versions: outputVersions(r) };
  return { logprobs: r.output_ids.map(() => 0), mask: r.output_ids.map(() => 0 as const), versions: r.output_ids.map(() => null) };
}
