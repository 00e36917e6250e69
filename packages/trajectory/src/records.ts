import type { CompletionRecord } from "@rollgate/protocol";
import { TrajectoryInvariantError } from "./errors.js";
import { checkRecordInvariants } from "./invariants.js";

/**
 * The session's records in `seq` order, each checked (logprobs, ids) before any builder sees it.
 * Two records with the same id or the same seq, or records of different sessions, fail the build.
 */
export function orderRecords(records: readonly CompletionRecord[], vocabSize: number): CompletionRecord[] {
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
