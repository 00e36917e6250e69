import type { CompletionRecord, Trace } from "@rollgate/protocol";
import { TrajectoryInvariantError } from "./errors.js";
import type { RecordSpan } from "./types.js";

/** A token id: a non-negative integer, below the vocabulary size when one is known. */
function isTokenId(id: unknown, vocabSize: number | null): boolean {
  return typeof id === "number" && Number.isInteger(id) && id >= 0 && (vocabSize === null || id < vocabSize);
}

function range(vocabSize: number | null): string {
  return vocabSize === null ? "a non-negative integer" : `a token id in [0, ${vocabSize})`;
}

function checkIds(
  ids: readonly unknown[],
  vocabSize: number | null,
  what: string,
  where: { record_id?: string | null; trace_index?: number | null },
): void {
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i];
    if (!isTokenId(id, vocabSize)) {
      throw new TrajectoryInvariantError("id_out_of_vocab", `${what}[${i}] = ${String(id)} is not ${range(vocabSize)}`, { ...where, position: i });
    }
  }
}

/** A real logprob from the engine: a finite number (never null, NaN or ±Infinity). */
export function isRealLogprob(lp: unknown): lp is number {
  return typeof lp === "number" && Number.isFinite(lp);
}

/**
 * Input invariants of one completion record, checked before it is used: one finite logprob per
 * output token (a gap is never filled with 0.0) and ids inside the vocabulary (null: any
 * non-negative integer).
 */
export function checkRecordInvariants(record: CompletionRecord, vocabSize: number | null = null): void {
  const where = { record_id: record.id };
  if (!Array.isArray(record.prompt_ids) || !Array.isArray(record.output_ids) || !Array.isArray(record.output_logprobs)) {
    throw new TrajectoryInvariantError("malformed_record", "prompt_ids, output_ids and output_logprobs must be arrays", where);
  }
  if (record.output_logprobs.length !== record.output_ids.length) {
    throw new TrajectoryInvariantError(
      "logprob_length_mismatch",
      `${record.output_ids.length} output ids but ${record.output_logprobs.length} output logprobs`,
      where,
    );
  }
  if (record.output_weight_versions && record.output_weight_versions.length !== record.output_ids.length) {
    throw new TrajectoryInvariantError(
      "weight_versions_length_mismatch",
      `${record.output_ids.length} output ids but ${record.output_weight_versions.length} per-token weight versions`,
      where,
    );
  }
  const lps: readonly unknown[] = record.output_logprobs;
  for (let i = 0; i < lps.length; i++) {
    if (!isRealLogprob(lps[i])) {
      throw new TrajectoryInvariantError(
        "missing_logprob",
        `output token ${i} has no real logprob (${String(lps[i])}); refusing to fill it`,
        { ...where, position: i },
      );
    }
  }
  checkIds(record.prompt_ids, vocabSize, "prompt_ids", where);
  checkIds(record.output_ids, vocabSize, "output_ids", where);
}

export interface TraceCheckOptions {
  vocabSize?: number | null;
  /** Index of the trace in its trajectory, for the error message. */
  traceIndex?: number;
  /** Where each merged record sits in the response, so a violation names the record. */
  spans?: readonly RecordSpan[];
}

function recordAt(trace: Trace, spans: readonly RecordSpan[] | undefined, pos: number): string | null {
  if (spans) {
    for (const s of spans) if (pos >= s.start && pos < s.end) return s.record_id;
  }
  return trace.completion_ids.length === 1 ? (trace.completion_ids[0] ?? null) : null;
}

/**
 * The trace invariants (docs/data-model.md#trace-and-trajectory): equal lengths of response_ids / response_logprobs / loss_mask /
 * weight_versions; masks only 0/1; every mask-1 token carries a real finite logprob; mask-0 tokens
 * carry logprob 0; ids inside the vocabulary. Throws `TrajectoryInvariantError` naming the record.
 */
export function checkTraceInvariants(trace: Trace, options: TraceCheckOptions = {}): void {
  const vocabSize = options.vocabSize ?? null;
  const traceIndex = options.traceIndex ?? null;
  const n = trace.response_ids.length;
  const base = { trace_index: traceIndex, record_id: trace.completion_ids.at(-1) ?? null };
  if (trace.completion_ids.length === 0) {
    throw new TrajectoryInvariantError("no_records", "a trace must come from at least one record", base);
  }
  for (const [name, len] of [
    ["response_logprobs", trace.response_logprobs.length],
    ["loss_mask", trace.loss_mask.length],
    ["weight_versions", trace.weight_versions.length],
  ] as const) {
    if (len !== n) {
      throw new TrajectoryInvariantError("length_mismatch", `${name} has ${len} entries for ${n} response tokens`, base);
    }
  }
  const where = (pos: number) => ({ trace_index: traceIndex, record_id: recordAt(trace, options.spans, pos), position: pos });
  const masks: readonly unknown[] = trace.loss_mask;
  const lps: readonly unknown[] = trace.response_logprobs;
  for (let i = 0; i < n; i++) {
    const m = masks[i];
    if (m !== 0 && m !== 1) {
      throw new TrajectoryInvariantError("mask_not_binary", `loss_mask[${i}] = ${String(m)}`, where(i));
    }
    const lp = lps[i];
    if (m === 1 && !isRealLogprob(lp)) {
      throw new TrajectoryInvariantError("missing_logprob", `trainable token ${i} has logprob ${String(lp)}`, where(i));
    }
    if (m === 0 && lp !== 0) {
      throw new TrajectoryInvariantError("masked_logprob_not_zero", `masked token ${i} has logprob ${String(lp)}`, where(i));
    }
  }
  checkIds(trace.prompt_ids, vocabSize, "prompt_ids", { trace_index: traceIndex, record_id: trace.completion_ids[0] ?? null });
  const ids: readonly unknown[] = trace.response_ids;
  for (let i = 0; i < n; i++) {
    const id = ids[i];
    if (!isTokenId(id, vocabSize)) {
      throw new TrajectoryInvariantError("id_out_of_vocab", `response_ids[${i}] = ${String(id)} is not ${range(vocabSize)}`, where(i));
    }
  }
}
