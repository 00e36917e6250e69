import type { PrefixTree, PrefixTreeNode, PrefixTreeSpan, RecordSpan, Trace, WeightVersion } from "@rollgate/protocol";

/**
 * The `prefix_tree` builder: the conversations `prefix_merging` found, as one tree of token prefixes.
 * Every conversation is inserted from its first token; the tokens it shares with one inserted
 * earlier are walked, not stored again, and where it departs a new branch starts. A token is
 * trainable in the tree when a record sampled it; when two records sampled the same token at the
 * same place (a retry that came out the same), each keeps its own branch from there, so no sampled
 * token is lost or trained twice.
 *
 * Linear in the conversations' tokens: each token is compared once on the way down, nodes are views
 * into the conversation that first wrote them (a split is O(1), nothing is copied until the
 * output), and the output is one depth-first pass.
 */

/** A token that a conversation only read (mask 0) and a later one sampled at the same place. */
interface Sampled {
  logprob: number;
  version: WeightVersion;
  owner: string;
}

/**
 * One conversation, read in place from its flat trace (no copies: the build allocates little
 * beyond its output). Position q < prompt length is prompt_ids[q], else response_ids[q - p].
 */
interface Source {
  trace: Pick<Trace, "prompt_ids" | "response_ids" | "loss_mask" | "response_logprobs" | "weight_versions">;
  spans: readonly RecordSpan[];
  p: number;
  n: number;
  sampled: Map<number, Sampled> | null;
}

/** A node: src positions [start, end). Its object keeps its end position through splits (samples point at it). */
interface Node {
  src: Source;
  start: number;
  end: number;
  children: Map<number, Node[]>;
}

function sourceOf(trace: Source["trace"], spans: readonly RecordSpan[]): Source {
  const p = trace.prompt_ids.length;
  return { trace, spans, p, n: p + trace.response_ids.length, sampled: null };
}

function idAt(s: Source, q: number): number {
  return (q < s.p ? s.trace.prompt_ids[q] : s.trace.response_ids[q - s.p]) as number;
}

function maskAt(s: Source, q: number): 0 | 1 {
  if (s.sampled?.has(q)) return 1;
  return q < s.p ? 0 : (s.trace.loss_mask[q - s.p] as 0 | 1);
}

/** The span holding response offset r (spans are in response order). */
function spanAt(spans: readonly RecordSpan[], r: number): RecordSpan | undefined {
  let lo = 0;
  let hi = spans.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const sp = spans[mid] as RecordSpan;
    if (r < sp.start) hi = mid - 1;
    else if (r >= sp.end) lo = mid + 1;
    else return sp;
  }
  return undefined;
}

/** What a trainable position holds: the record that sampled it, its logprob and weight version. */
function sampleAt(s: Source, q: number): Sampled {
  const up = s.sampled?.get(q);
  if (up) return up;
  const r = q - s.p;
  return {
    logprob: s.trace.response_logprobs[r] as number,
    version: s.trace.weight_versions[r] as WeightVersion,
    owner: (spanAt(s.spans, r) as RecordSpan).record_id,
  };
}

/** How many of `node`'s tokens the conversation `c` (from position i) can walk: equal, and not both sampled. */
function walkable(node: Node, c: Source, i: number): number {
  const len = node.end - node.start;
  const s = node.src;
  let j = 0;
  while (j < len && i + j < c.n && idAt(s, node.start + j) === idAt(c, i + j) && !(maskAt(s, node.start + j) === 1 && maskAt(c, i + j) === 1)) j++;
  return j;
}

class TreeBuilder {
  readonly roots = new Map<number, Node[]>();

  /** Insert one conversation; returns the node holding its last token. */
  insert(c: Source): Node {
    const n = c.n;
    let children = this.roots;
    let cur: Node | null = null;
    let i = 0;
    while (i < n) {
      const key = idAt(c, i);
      const list = children.get(key);
      let next: Node | undefined;
      let at = -1;
      let len = 0;
      for (let k = 0; k < (list?.length ?? 0); k++) {
        const cand = (list as Node[])[k] as Node;
        const l = walkable(cand, c, i);
        if (l > len) [next, at, len] = [cand, k, l];
      }
      if (next === undefined) {
        const node: Node = { src: c, start: i, end: n, children: new Map() };
        if (list) list.push(node);
        else children.set(key, [node]);
        return node;
      }
      const s = next.src;
      for (let j = 0; j < len; j++) {
        // A token the earlier conversation only read (prompt, tool result) that this one sampled: trainable from now on.
        if (maskAt(c, i + j) === 1) (s.sampled ??= new Map()).set(next.start + j, sampleAt(c, i + j));
      }
      i += len;
      if (len < next.end - next.start) {
        // Split: a new head takes the walked tokens; `next` keeps its end (and every sample pointing at it).
        const head: Node = { src: s, start: next.start, end: next.start + len, children: new Map([[idAt(s, next.start + len), [next]]]) };
        next.start += len;
        (list as Node[])[at] = head;
        next = head;
      }
      cur = next;
      children = next.children;
    }
    if (cur === null) {
      // An empty conversation (no prompt, no output): an empty root of its own.
      cur = { src: c, start: 0, end: 0, children: new Map() };
      const list = this.roots.get(-1);
      if (list) list.push(cur);
      else this.roots.set(-1, [cur]);
    }
    return cur;
  }
}

/** A node's arrays, read from its source (sized up front: the output is most of what the build allocates). */
function nodeOf(node: Node, parent: number | null, depth: number): PrefixTreeNode {
  const { src, start, end } = node;
  const len = end - start;
  const token_ids = new Array<number>(len);
  const loss_mask = new Array<0 | 1>(len);
  const logprobs = new Array<number>(len);
  const weight_versions = new Array<WeightVersion>(len);
  const spans: PrefixTreeSpan[] = [];
  for (let i = 0; i < len; i++) {
    const q = start + i;
    token_ids[i] = idAt(src, q);
    if (maskAt(src, q) === 0) {
      loss_mask[i] = 0;
      logprobs[i] = 0;
      weight_versions[i] = null;
      continue;
    }
    const t = sampleAt(src, q);
    loss_mask[i] = 1;
    logprobs[i] = t.logprob;
    weight_versions[i] = t.version;
    const last = spans.at(-1);
    if (last && last.end === i && last.record_id === t.owner) last.end++;
    else spans.push({ record_id: t.owner, start: i, end: i + 1 });
  }
  return { parent, depth, token_ids, loss_mask, logprobs, weight_versions, spans };
}

/** The tree of `traces` (prefix_merging's conversations, with where each record sits in them). */
export function buildPrefixTree(traces: readonly Trace[], spans: readonly (readonly RecordSpan[])[]): PrefixTree {
  const b = new TreeBuilder();
  const ends = traces.map((t, i) => b.insert(sourceOf(t, spans[i] ?? [])));

  // Depth-first, parents first; an explicit stack so a deep tree cannot overflow the call stack.
  const nodes: PrefixTreeNode[] = [];
  const index = new Map<Node, number>();
  const stack: { node: Node; parent: number | null; depth: number }[] = [];
  const push = (children: Map<number, Node[]>, parent: number | null, depth: number) => {
    const all = [...children.values()].flat();
    for (let k = all.length - 1; k >= 0; k--) stack.push({ node: all[k] as Node, parent, depth });
  };
  push(b.roots, null, 0);
  while (stack.length > 0) {
    const { node, parent, depth } = stack.pop() as { node: Node; parent: number | null; depth: number };
    index.set(node, nodes.length);
    nodes.push(nodeOf(node, parent, depth));
    push(node.children, nodes.length - 1, depth + node.end - node.start);
  }
  return {
    nodes,
    samples: ends.map((node, trace) => ({ node: index.get(node) as number, trace })),
    tree_tokens: nodes.reduce((a, n) => a + n.token_ids.length, 0),
    flat_tokens: traces.reduce((a, t) => a + t.prompt_ids.length + t.response_ids.length, 0),
  };
}

/** The root-to-`node` path's tokens of a tree, node by node (what a trainer walking `parent` links reads). */
export function pathOf(tree: PrefixTree, node: number): PrefixTreeNode[] {
  const path: PrefixTreeNode[] = [];
  for (let k: number | null = node; k !== null; k = (tree.nodes[k] as PrefixTreeNode).parent) path.push(tree.nodes[k] as PrefixTreeNode);
  return path.reverse();
}
