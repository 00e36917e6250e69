import type { CompletionRecord, WeightVersion } from "@rollgate/protocol";
import { RoutingPieces } from "./routed-experts.js";
import { classifyBreak, type BreakEvidence, type ChainView } from "./breaks.js";
import { outputColumns, trainedVersionRuns } from "./records.js";
import {
  commonPrefix,
  EMPTY_HASH,
  extendHash,
  HashIndex,
  prefixHashes,
  samePrefix,
  statesAt,
  type HashState,
  type PrefixHashes,
} from "./token-hash.js";
import type { BuiltTraceBreak, BuiltTraces, RecordSpan, TemplateFacts } from "./types.js";

/**
 * The `prefix_merging` builder (docs/data-model.md#builders). A record whose prompt starts with a chain's full token
 * sequence (prompt + everything appended so far) extends it: the extra prompt tokens are appended
 * with mask 0 / logprob 0 / weight version null, the new output with mask 1 and its own logprobs.
 * Each chain tip is extended at most once; a record that extends nothing opens a new chain and a
 * break explains why.
 *
 * End of turn needs no special case: an output that stopped on its end-of-turn token (`<|im_end|>`,
 * `<|eot_id|>`, …) holds that token, the next prompt repeats it inside the chain's prefix, so it is
 * neither duplicated nor masked out; an output cut on `length` has no end token, so the next
 * prompt's end-of-turn token is interstitial glue.
 *
 * Linear in the session's tokens: each prompt is hashed once, in one pass that keeps the hash only
 * at the lengths of current chain tips, which are looked up in an index keyed by (length, hash);
 * only the longest hit is verified token by token. The all-prefixes index used to diagnose breaks
 * is brought up to date only when a break needs it, so each chain token enters it at most once.
 */

interface Chain extends ChainView {
  /** prompt + response: what the next prompt must start with. */
  seq: number[];
  state: HashState;
  /** How much of seq the diagnosis index holds (it catches up only when a break needs it). */
  indexed: HashState;
  prompt_ids: number[];
  response_ids: number[];
  response_logprobs: number[];
  loss_mask: (0 | 1)[];
  weight_versions: WeightVersion[];
  completion_ids: string[];
  records: CompletionRecord[];
  spans: RecordSpan[];
  finish_reason: string;
  routing: RoutingPieces;
}

interface StateRef {
  chain: number;
  record_id: string;
}

class Merger {
  constructor(
    private readonly template: TemplateFacts = {},
    private readonly trainReplayed = false,
  ) {}
  readonly chains: Chain[] = [];
  readonly breaks: BuiltTraceBreak[] = [];
  /** Current, not yet extended, tip of every chain. */
  private readonly tips = new HashIndex<number>();
  /** Tips that were extended: a prompt starting with one of them is a sibling. */
  private readonly formerTips = new HashIndex<StateRef>();
  /** Every record's full prompt: an identical prompt is a sibling. */
  private readonly prompts = new HashIndex<StateRef>();
  /** Prefixes of chain sequences (the first chain indexed with it), for diagnosis; caught up lazily. */
  private readonly prefixes = new HashIndex<number>();

  add(record: CompletionRecord): void {
    const p = record.prompt_ids;
    const { at, whole } = statesAt(p, this.tips.lengthsUpTo(p.length));
    const target = this.findTip(p, at);
    const ref: StateRef = { chain: -1, record_id: record.id };
    if (target) {
      ref.chain = target.index;
      this.extend(target, record, whole);
    } else {
      if (this.chains.length > 0) this.breaks.push(classifyBreak(this.diagnose(record, prefixHashes(p)), this.template));
      ref.chain = this.open(record, whole).index;
    }
    this.prompts.add(whole, ref);
  }

  /** The longest unextended chain tip that the prompt starts with (verified exactly). */
  private findTip(p: readonly number[], tipStates: readonly HashState[]): Chain | undefined {
    for (let k = tipStates.length - 1; k >= 0; k--) {
      const s = tipStates[k] as HashState;
      const candidates = this.tips.get(s.len, s.h1, s.h2).sort((a, b) => a - b);
      for (const c of candidates) {
        const chain = this.chains[c] as Chain;
        if (chain.seq.length === s.len && samePrefix(p, chain.seq, s.len)) return chain;
      }
    }
    return undefined;
  }

  /** `promptState`: the hash of the record's whole prompt. */
  private open(record: CompletionRecord, promptState: HashState): Chain {
    const p = record.prompt_ids;
    const out = record.output_ids;
    const cols = outputColumns(record, this.trainReplayed);
    const chain: Chain = {
      index: this.chains.length,
      prompt_length: p.length,
      seq: p.concat(out),
      state: extendHash(promptState, out),
      indexed: EMPTY_HASH,
      prompt_ids: p.slice(),
      response_ids: out.slice(),
      response_logprobs: cols.logprobs,
      loss_mask: cols.mask,
      weight_versions: cols.versions,
      completion_ids: [record.id],
      records: [record],
      spans: [{ record_id: record.id, start: 0, output_start: 0, end: out.length }],
      finish_reason: record.finish_reason,
      routing: new RoutingPieces(),
    };
    chain.routing.add(record, 0);
    this.chains.push(chain);
    this.tips.add(chain.state, chain.index);
    return chain;
  }

  private extend(chain: Chain, record: CompletionRecord, promptState: HashState): void {
    const p = record.prompt_ids;
    const out = record.output_ids;
    const old = chain.state;
    const prev = chain.records.at(-1) as CompletionRecord;
    this.tips.remove(old, (c) => c === chain.index);
    this.formerTips.add(old, { chain: chain.index, record_id: prev.id });

    const start = chain.response_ids.length;
    for (let i = old.len; i < p.length; i++) {
      chain.response_ids.push(p[i] as number);
      chain.response_logprobs.push(0);
      chain.loss_mask.push(0);
      chain.weight_versions.push(null);
    }
    const outputStart = chain.response_ids.length;
    const cols = outputColumns(record, this.trainReplayed);
    for (let i = 0; i < out.length; i++) {
      chain.response_ids.push(out[i] as number);
      chain.response_logprobs.push(cols.logprobs[i] as number);
      chain.loss_mask.push(cols.mask[i] as 0 | 1);
      chain.weight_versions.push(cols.versions[i] as WeightVersion);
    }
    chain.spans.push({ record_id: record.id, start, output_start: outputStart, end: chain.response_ids.length });
    chain.completion_ids.push(record.id);
    chain.records.push(record);
    chain.finish_reason = record.finish_reason;
    chain.routing.add(record, old.len - 1);
    chain.seq = p.concat(out);
    chain.state = extendHash(promptState, out);
    this.tips.add(chain.state, chain.index);
  }

  /** Bring the diagnosis index up to every chain's current sequence (a chain only ever grows). */
  private catchUpPrefixes(): void {
    for (const chain of this.chains) {
      if (chain.indexed.len === chain.seq.length) continue;
      chain.indexed = extendHash(chain.indexed, chain.seq, chain.indexed.len, chain.seq.length, (s) =>
        this.prefixes.addFirst(s, chain.index),
      );
    }
  }

  private diagnose(record: CompletionRecord, H: PrefixHashes): BreakEvidence {
    const p = record.prompt_ids;
    const sibling = this.findSibling(p, H);
    if (sibling) {
      const chain = this.chains[sibling.chain] as Chain;
      return { record, closest: chain, position: commonPrefix(p, chain.seq), sibling: sibling.sibling };
    }
    this.catchUpPrefixes();
    // Longest common prefix with any chain: prefix membership is monotone, so walk until the first miss.
    let lcp = 0;
    let closest = -1;
    for (let len = 1; len <= p.length; len++) {
      const hit = this.prefixes.get(len, H.h1[len] as number, H.h2[len] as number)[0];
      if (hit === undefined) break;
      lcp = len;
      closest = hit;
    }
    if (closest >= 0 && commonPrefix(p, (this.chains[closest] as Chain).seq) < lcp) {
      // A hash collision misled the walk: fall back to comparing with every chain (never seen in practice).
      lcp = 0;
      closest = -1;
      for (const c of this.chains) {
        const n = commonPrefix(p, c.seq);
        if (n > lcp) [lcp, closest] = [n, c.index];
      }
    }
    if (closest < 0) return { record, closest: null, position: null, sibling: null };
    return { record, closest: this.chains[closest] as Chain, position: lcp, sibling: null };
  }

  private findSibling(
    p: readonly number[],
    H: PrefixHashes,
  ): { chain: number; sibling: NonNullable<BreakEvidence["sibling"]> } | undefined {
    const verify = (refs: StateRef[], len: number) =>
      refs.find((r) => samePrefix(p, (this.chains[r.chain] as Chain).seq, len));
    const same = verify(this.prompts.get(p.length, H.h1[p.length] as number, H.h2[p.length] as number), p.length);
    if (same) return { chain: same.chain, sibling: { kind: "identical_prompt", record_id: same.record_id } };
    for (let len = p.length; len >= 1; len--) {
      if (!this.formerTips.hasLength(len)) continue;
      const hit = verify(this.formerTips.get(len, H.h1[len] as number, H.h2[len] as number), len);
      if (hit) return { chain: hit.chain, sibling: { kind: "former_tip", record_id: hit.record_id } };
    }
    return undefined;
  }
}

/** Merge records (already in seq order and checked) into prefix-extending chains. */
export function prefixMergingTraces(records: readonly CompletionRecord[], template?: TemplateFacts, trainReplayed = false): BuiltTraces {
  const m = new Merger(template, trainReplayed);
  for (const r of records) m.add(r);
  return {
    traces: m.chains.map((c) => ({
      prompt_ids: c.prompt_ids,
      response_ids: c.response_ids,
      response_logprobs: c.response_logprobs,
      loss_mask: c.loss_mask,
      weight_versions: c.weight_versions,
      completion_ids: c.completion_ids,
      finish_reason: c.finish_reason,
      ...c.routing.field(),
    })),
    spans: m.chains.map((c) => c.spans),
    records: m.chains.map((c) => c.records),
    record_versions: m.chains.map((c) => c.records.flatMap((r) => trainedVersionRuns(r, trainReplayed))),
    breaks: m.breaks,
  };
}
