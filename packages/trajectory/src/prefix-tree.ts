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
 * into the conversation that first wrote them (a split is O(1)), and the output is one depth-first pass.
 */

/** One conversation's tokens, mask, logprobs, versions and sampling record, position by position. */
interface Source {
  ids: number[];
  mask: (0 | 1)[];
  logprobs: number[];
  versions: WeightVersion[];
  owner: (string | null)[];
}

/** A node: src[start, end). Its object keeps its end position through splits (samples point at it). */
interface Node {
  src: Source;
  start: number;
  end: number;
  children: Map<number, Node[]>;
}

function sourceOf(trace: Pick<Trace, "prompt_ids" | "response_ids" | "loss_mask" | "response_logprobs" | "weight_versions">, spans: readonly RecordSpan[]): Source {
  const p = trace.prompt_ids.length;
  const owner: (string | null)[] = new Array<string | null>(p + trace.response_ids.length).fill(null);
  for (const s of spans) for (let k = s.output_start; k < s.end; k++) owner[p + k] = s.record_id;
  return {
    ids: trace.prompt_ids.concat(trace.response_ids),
    mask: new Array<0 | 1>(p).fill(0).concat(trace.loss_mask),
    logprobs: new Array<number>(p).fill(0).concat(trace.response_logprobs),
    versions: new Array<WeightVersion>(p).fill(null).concat(trace.weight_versions),
    owner,
  };
}

/** How many of `node`'s tokens the conversation `c` (from position i) can walk: equal, and not both sampled. */
function walkable(node: Node, c: Source, i: number): number {
  const n = node.end - node.start;
  const s = node.src;
  let j = 0;
  while (j < n && i + j < c.ids.length && s.ids[node.start + j] === c.ids[i + j] && !(s.mask[node.start + j] === 1 && c.mask[i + j] === 1)) j++;
  return j;
}

class TreeBuilder {
  readonly roots = new Map<number, Node[]>();

  /** Insert one conversation; returns the node holding its last token. */
  insert(c: Source): Node {
    const n = c.ids.length;
    let children = this.roots;
    let cur: Node | null = null;
    let i = 0;
    while (i < n) {
      const key = c.ids[i] as number;
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
        if (c.mask[i + j] === 1) {
          const q = next.start + j;
          s.mask[q] = 1;
          s.logprobs[q] = c.logprobs[i + j] as number;
          s.versions[q] = c.versions[i + j] as WeightVersion;
          s.owner[q] = c.owner[i + j] as string | null;
        }
      }
      i += len;
      if (len < next.end - next.start) {
        // Split: a new head takes the walked tokens; `next` keeps its end (and every sample pointing at it).
        const head: Node = { src: s, start: next.start, end: next.start + len, children: new Map([[s.ids[next.start + len] as number, [next]]]) };
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

function spansOf(src: Source, start: number, end: number): PrefixTreeSpan[] {
  const out: PrefixTreeSpan[] = [];
  for (let q = start; q < end; q++) {
    const owner = src.owner[q];
    if (src.mask[q] !== 1 || owner == null) continue;
    const last = out.at(-1);
    if (last && last.end === q - start && last.record_id === owner) last.end++;
    else out.push({ record_id: owner, start: q - start, end: q - start + 1 });
  }
  return out;
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
    const { src, start, end } = node;
    index.set(node, nodes.length);
    nodes.push({
      parent,
      depth,
      token_ids: src.ids.slice(start, end),
      loss_mask: src.mask.slice(start, end),
      logprobs: src.logprobs.slice(start, end),
      weight_versions: src.versions.slice(start, end),
      spans: spansOf(src, start, end),
    });
    push(node.children, nodes.length - 1, depth + end - start);
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
