// A naive prefix-merging builder, for comparison only (bench/ only): every record is compared,
// token by token, with the full sequence of every earlier record (all pairs), and extends the
// longest one that is still an unextended chain tip. O(records² × tokens).

/** @typedef {{ prompt_ids: number[], response_ids: number[], response_logprobs: number[], loss_mask: number[], completion_ids: string[] }} NaiveTrace */

/**
 * @param {readonly import("@rollgate/protocol").CompletionRecord[]} records
 * @returns {NaiveTrace[]}
 */
export function naivePrefixMerging(records) {
  const sorted = [...records].sort((a, b) => a.seq - b.seq);
  /** @type {number[][]} */
  const seqs = []; // per record: prompt + output
  /** @type {number[]} */
  const chainOf = []; // per record: its chain index
  /** @type {boolean[]} */
  const isTip = []; // per record: still the tip of its chain
  /** @type {NaiveTrace[]} */
  const chains = [];
  for (let i = 0; i < sorted.length; i++) {
    const r = sorted[i];
    const p = r.prompt_ids;
    let best = -1;
    for (let j = 0; j < i; j++) {
      const s = seqs[j];
      if (s.length > p.length) continue;
      let k = 0;
      while (k < s.length && s[k] === p[k]) k++;
      if (k === s.length && isTip[j] && (best < 0 || s.length > seqs[best].length)) best = j;
    }
    let chain;
    if (best >= 0) {
      chain = chains[chainOf[best]];
      isTip[best] = false;
      const from = seqs[best].length;
      for (let k = from; k < p.length; k++) {
        chain.response_ids.push(p[k]);
        chain.response_logprobs.push(0);
        chain.loss_mask.push(0);
      }
      chainOf.push(chainOf[best]);
    } else {
      chain = { prompt_ids: p.slice(), response_ids: [], response_logprobs: [], loss_mask: [], completion_ids: [] };
      chains.push(chain);
      chainOf.push(chains.length - 1);
    }
    for (let k = 0; k < r.output_ids.length; k++) {
      chain.response_ids.push(r.output_ids[k]);
      chain.response_logprobs.push(r.output_logprobs[k]);
      chain.loss_mask.push(1);
    }
    chain.completion_ids.push(r.id);
    seqs.push(p.concat(r.output_ids));
    isTip.push(true);
  }
  return chains;
}
