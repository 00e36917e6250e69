import type { CompletionRecord, WeightVersion } from "@rollgate/protocol";
import { RoutingPieces } from "./routed-experts.js";
import { classifyBreak, type BreakEvidence, type ChainView } from "./breaks.js";
import { outputVersions, versionRuns } from "./records.js";
import {
  commonPrefix,
  extendHash,
  HashIndex,
  prefixHashes,
  samePrefix,
  stateAt,
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
 * Linear in the session's tokens: each prompt is hashed once, every prefix length is looked up in
 * an index of chain tips keyed by (length, hash), and only the longest hit is verified token by token.
 * The all-prefixes index used to diagnose breaks is built only when the first break happens.
 */

interface Chain extends ChainView {
  /** prompt + response: what the next prompt must start with. */
  seq: number[];
  state: HashState;
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
  constructor(private readonly template: TemplateFacts = {}) {}
  readonly chains: Chain[] = [];
  readonly breaks: BuiltTraceBreak[] = [];
  /** Current, not yet extended, tip of every chain. */
  private readonly tips = new HashIndex<number>();
  /** Tips that were extended: a prompt starting with one of them is a sibling. */
  private readonly formerTips = new HashIndex<StateRef>();
  /** Every record's full prompt: an identical prompt is a sibling. */
  private readonly prompts = new HashIndex<StateRef>();
  /** Every prefix of every chain sequence (first chain that had it); built lazily for diagnosis. */
  private prefixes: HashIndex<number> | null = null;

  add(record: CompletionRecord): void {
    const p = record.prompt_ids;
    const H = prefixHashes(p);
    const target = this.findTip(p, H);
    const ref: StateRef = { chain: -1, record_id: record.id };
    if (target) {
      ref.chain = target.index;
      this.extend(target, record, H);
    } else {
      if (this.chains.length > 0) this.breaks.push(classifyBreak(this.diagnose(record, H), this.template));
      ref.chain = this.open(record, H).index;
    }
    this.prompts.add(stateAt(H, p.length), ref);
  }

  /** The longest unextended chain tip that the prompt starts with (verified exactly). */
  private findTip(p: readonly number[], H: PrefixHashes): Chain | undefined {
    for (let len = p.length; len >= 1; len--) {
      if (!this.tips.hasLength(len)) continue;
      const candidates = this.tips.get(len, H.h1[len] as number, H.h2[len] as number).sort((a, b) => a - b);
      for (const c of candidates) {
        const chain = this.chains[c] as Chain;
        if (chain.seq.length === len && samePrefix(p, chain.seq, len)) return chain;
      }
    }
    return undefined;
  }

  private open(record: CompletionRecord, H: PrefixHashes): Chain {
    const p = record.prompt_ids;
    const out = record.output_ids;
    const chain: Chain = {
      index: this.chains.length,
      prompt_length: p.length,
      seq: p.concat(out),
      state: extendHash(stateAt(H, p.length), out),
      prompt_ids: p.slice(),
      response_ids: out.slice(),
      response_logprobs: record.output_logprobs.slice(),
      loss_mask: out.map(() => 1 as const),
      weight_versions: outputVersions(record),
      completion_ids: [record.id],
      records: [record],
      spans: [{ record_id: record.id, start: 0, output_start: 0, end: out.length }],
      finish_reason: record.finish_reason,
      routing: new RoutingPieces(),
    };
    chain.routing.add(record, 0);
    this.chains.push(chain);
    this.tips.add(chain.state, chain.index);
    if (this.prefixes) this.indexPrefixes(chain, { len: 0, h1: 0, h2: 0 });
    return chain;
  }

  private extend(chain: Chain, record: CompletionRecord, H: PrefixHashes): void {
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
    const versions = outputVersions(record);
    for (let i = 0; i < out.length; i++) {
      chain.response_ids.push(out[i] as number);
      chain.response_logprobs.push(record.output_logprobs[i] as number);
      chain.loss_mask.push(1);
      chain.weight_versions.push(versions[i] as WeightVersion);
    }
    chain.spans.push({ record_id: record.id, start, output_start: outputStart, end: chain.response_ids.length });
    chain.completion_ids.push(record.id);
    chain.records.push(record);
    chain.finish_reason = record.finish_reason;
    chain.routing.add(record, old.len - 1);
    chain.seq = p.concat(out);
    chain.state = extendHash(stateAt(H, p.length), out);
    this.tips.add(chain.state, chain.index);
    if (this.prefixes) this.indexPrefixes(chain, old);
  }

  /** Index chain.seq's prefixes longer than `from` (whose hash state is given). */
  private indexPrefixes(chain: Chain, from: HashState): void {
    const index = this.prefixes as HashIndex<number>;
    extendHash(from, chain.seq, from.len, chain.seq.length, (s) => index.addFirst(s, chain.index));
  }

  private diagnose(record: CompletionRecord, H: PrefixHashes): BreakEvidence {
    const p = record.prompt_ids;
    const sibling = this.findSibling(p, H);
    if (sibling) {
      const chain = this.chains[sibling.chain] as Chain;
      return { record, closest: chain, position: commonPrefix(p, chain.seq), sibling: sibling.sibling };
    }
    if (!this.prefixes) {
      this.prefixes = new HashIndex<number>();
      for (const c of this.chains) this.indexPrefixes(c, { len: 0, h1: 0, h2: 0 });
    }
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
export function prefixMergingTraces(records: readonly CompletionRecord[], template?: TemplateFacts): BuiltTraces {
  const m = new Merger(template);
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
    record_versions: m.chains.map((c) => c.records.flatMap(versionRuns)),
    breaks: m.breaks,
  };
}
