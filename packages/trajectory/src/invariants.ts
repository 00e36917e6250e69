import { routedRows, type CompletionRecord, type PrefixTree, type RoutedExperts, type Trace } from "@rollgate/protocol";
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
  checkRouted(record.routed_experts, record.prompt_ids.length + record.output_ids.length, where);
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
  checkRouted(trace.routed_experts, trace.prompt_ids.length + n, base);
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

/**
 * The tree invariants a trainer relies on: parents come first and each node's depth continues its
 * parent's; a node's arrays have one entry per token; trainable tokens carry a real logprob and
 * belong to a record span, the others logprob 0 and no weight version; every sample's root-to-node
 * path is its flat trace token for token; and the tree holds exactly as many trainable tokens as
 * the flat traces (each sampled token trainable exactly once).
 */
export function checkTreeInvariants(tree: PrefixTree, traces: readonly Trace[]): void {
  const fail = (rule: string, message: string, where: { record_id?: string | null; trace_index?: number | null; position?: number | null } = {}): never => {
    throw new TrajectoryInvariantError(rule, `prefix tree: ${message}`, where);
  };
  let trainable = 0;
  tree.nodes.forEach((node, k) => {
    const n = node.token_ids.length;
    if (node.loss_mask.length !== n || node.logprobs.length !== n || node.weight_versions.length !== n) {
      fail("tree_length_mismatch", `node ${k}'s arrays do not have one entry per token`);
    }
    const parent = node.parent === null ? null : tree.nodes[node.parent];
    if (node.parent !== null && (node.parent >= k || parent === undefined)) fail("tree_order", `node ${k}'s parent ${node.parent} does not come before it`);
    const depth = parent ? parent.depth + parent.token_ids.length : 0;
    if (node.depth !== depth) fail("tree_depth", `node ${k} has depth ${node.depth}, its parent ends at ${depth}`);
    let nodeTrainable = 0;
    for (let i = 0; i < n; i++) {
      if (node.loss_mask[i] === 1) {
        nodeTrainable++;
        if (!isRealLogprob(node.logprobs[i])) fail("missing_logprob", `node ${k} token ${i} is trainable without a real logprob`, { position: i });
      } else if (node.logprobs[i] !== 0 || node.weight_versions[i] !== null) {
        fail("masked_logprob_not_zero", `node ${k} token ${i} is masked but has a logprob or weight version`, { position: i });
      }
    }
    trainable += nodeTrainable;
    // Spans in order, disjoint, over trainable tokens only, and as many of them as the mask has: each trainable token has its record.
    let covered = 0;
    let prevEnd = 0;
    for (const s of node.spans) {
      if (s.start < prevEnd || s.end <= s.start || s.end > n) fail("tree_span_mismatch", `node ${k}'s record spans are not ordered, disjoint runs inside it`);
      for (let i = s.start; i < s.end; i++) if (node.loss_mask[i] !== 1) fail("tree_span_mismatch", `node ${k} token ${i} is in record ${s.record_id}'s span but masked`, { record_id: s.record_id, position: i });
      covered += s.end - s.start;
      prevEnd = s.end;
    }
    if (covered !== nodeTrainable) fail("tree_unowned_token", `node ${k} has ${nodeTrainable} trainable tokens but its record spans cover ${covered}`);
  });
  const flatTrainable = traces.reduce((a, t) => a + t.loss_mask.reduce<number>((x, m) => x + m, 0), 0);
  if (trainable !== flatTrainable) fail("tree_trainable_count", `${trainable} trainable tokens in the tree, ${flatTrainable} in the flat traces`);
  if (tree.samples.length !== traces.length) fail("tree_samples", `${tree.samples.length} samples for ${traces.length} traces`);
  for (const sample of tree.samples) {
    const t = traces[sample.trace];
    if (t === undefined) return fail("tree_samples", `a sample names trace ${sample.trace}, which does not exist`);
    const want = t.prompt_ids.length + t.response_ids.length;
    let pos = want;
    for (let k: number | null = sample.node; k !== null; ) {
      const node: PrefixTree["nodes"][number] | undefined = tree.nodes[k];
      if (node === undefined) return fail("tree_samples", `trace ${sample.trace}'s sample ends at node ${k}, which does not exist`);
      pos -= node.token_ids.length;
      if (pos !== node.depth) fail("tree_path", `trace ${sample.trace}'s path length differs from its ${want} tokens`, { trace_index: sample.trace });
      for (let i = 0; i < node.token_ids.length; i++) {
        const at = pos + i;
        const id = at < t.prompt_ids.length ? t.prompt_ids[at] : t.response_ids[at - t.prompt_ids.length];
        if (node.token_ids[i] !== id) fail("tree_path", `trace ${sample.trace}'s token ${at} differs from its path in the tree`, { trace_index: sample.trace, position: at });
      }
      k = node.parent;
    }
    if (pos !== 0) fail("tree_path", `trace ${sample.trace}'s path is shorter than its ${want} tokens`, { trace_index: sample.trace });
  }
}

/** Routed experts cover every position of the token sequence but the last (routed-experts.ts in protocol). */
function checkRouted(r: RoutedExperts | undefined, tokens: number, where: { record_id?: string | null; trace_index?: number | null }): void {
  if (!r) return;
  const rows = routedRows(r);
  if (rows !== Math.max(tokens - 1, 0)) {
    throw new TrajectoryInvariantError("routed_experts_misaligned", `routed experts cover ${rows} positions, not ${Math.max(tokens - 1, 0)} (tokens - 1)`, where);
  }
}
