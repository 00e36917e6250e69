import type { CompletionRecord, PrefixTree, Trajectory } from "@rollgate/protocol";
import { Trajectory as TrajectorySchema } from "@rollgate/protocol";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { makeRecord } from "./__fixtures__/make-record.js";
import { checkTreeInvariants, pathOf, prefixMerging, prefixTree, toTrainerFormat, TrajectoryInvariantError } from "./index.js";

/** Each sample's tokens, read from the tree by following parent links. */
function pathTokens(tree: PrefixTree, node: number): number[] {
  return pathOf(tree, node).flatMap((n) => n.token_ids);
}

/** Every trainable token of the tree: (record, position in its conversation, id, logprob, version). */
function trainableTokens(tree: PrefixTree) {
  const out: { record_id: string; pos: number; id: number; lp: number; wv: string | null }[] = [];
  for (const node of tree.nodes) {
    for (const s of node.spans) {
      for (let i = s.start; i < s.end; i++) {
        out.push({ record_id: s.record_id, pos: node.depth + i, id: node.token_ids[i]!, lp: node.logprobs[i]!, wv: node.weight_versions[i]! });
      }
    }
  }
  return out;
}

/** The invariants a trainer relies on, checked against the records themselves (not the builder's own bookkeeping). */
function expectTreeInvariants(records: readonly CompletionRecord[], t: Trajectory): void {
  const tree = t.tree!;
  // 1. Every sampled token is trainable exactly once, where its record put it, with its own logprob and version.
  const byRecord = new Map<string, ReturnType<typeof trainableTokens>>();
  for (const tok of trainableTokens(tree)) byRecord.set(tok.record_id, [...(byRecord.get(tok.record_id) ?? []), tok]);
  for (const r of records) {
    const got = (byRecord.get(r.id) ?? []).sort((a, b) => a.pos - b.pos);
    const versions = r.output_weight_versions ?? r.output_ids.map(() => r.weight_version);
    expect(got).toEqual(r.output_ids.map((id, k) => ({ record_id: r.id, pos: r.prompt_ids.length + k, id, lp: r.output_logprobs[k], wv: versions[k] })));
  }
  expect([...byRecord.keys()].every((id) => records.some((r) => r.id === id))).toBe(true);
  // Masked tokens carry nothing a trainer could mistake for a sample.
  for (const n of tree.nodes) n.loss_mask.forEach((m, i) => m === 0 && expect([n.logprobs[i], n.weight_versions[i]]).toEqual([0, null]));

  // 2. Each sample's root-to-node path is its conversation, and the flat view trains exactly that conversation's own samples.
  expect(tree.samples.map((s) => s.trace)).toEqual(t.traces.map((_, i) => i));
  for (const s of tree.samples) {
    const trace = t.traces[s.trace]!;
    const full = trace.prompt_ids.concat(trace.response_ids);
    expect(pathTokens(tree, s.node)).toEqual(full);
    const own = new Set(trace.completion_ids);
    const fromTree = pathOf(tree, s.node).flatMap((n) => n.loss_mask.map((m, i) => (m === 1 && own.has(n.spans.find((x) => i >= x.start && i < x.end)!.record_id) ? 1 : 0)));
    expect(fromTree).toEqual(trace.prompt_ids.map(() => 0).concat(trace.loss_mask));
  }

  // 3. Shared prefixes are stored once: siblings start with the same token only when both tokens were sampled,
  // every leaf ends a conversation, and parents come first.
  const childrenOf = new Map<number | null, number[]>();
  tree.nodes.forEach((n, k) => {
    expect(n.parent === null || n.parent < k).toBe(true);
    childrenOf.set(n.parent, [...(childrenOf.get(n.parent) ?? []), k]);
  });
  for (const kids of childrenOf.values()) {
    const first = new Map<number, number[]>();
    for (const k of kids) {
      const n = tree.nodes[k]!;
      if (n.token_ids.length > 0) first.set(n.token_ids[0]!, [...(first.get(n.token_ids[0]!) ?? []), k]);
    }
    for (const same of first.values()) if (same.length > 1) expect(same.every((k) => tree.nodes[k]!.loss_mask[0] === 1)).toBe(true);
  }
  const ends = new Set(tree.samples.map((s) => s.node));
  tree.nodes.forEach((_, k) => !childrenOf.has(k) && expect(ends.has(k)).toBe(true));
  expect(tree.tree_tokens).toBe(tree.nodes.reduce((a, n) => a + n.token_ids.length, 0));
  expect(tree.tree_tokens).toBeLessThanOrEqual(tree.flat_tokens);
  expect(tree.flat_tokens).toBe(t.traces.reduce((a, x) => a + x.prompt_ids.length + x.response_ids.length, 0));
}

const SYS = [9, 9, 8];

describe("prefix_tree: a session of three conversations", () => {
  // main: system + task, then a second turn; a sub-agent with the same system prompt; a retry of
  // main's second turn that came out identical (two samples of the same tokens).
  const m1 = makeRecord({ id: "m1", seq: 0, prompt_ids: [...SYS, 1, 2], output_ids: [3, 4] });
  const m2 = makeRecord({ id: "m2", seq: 1, prompt_ids: [...SYS, 1, 2, 3, 4, 5], output_ids: [6, 7], weight_version: "v2" });
  const sub = makeRecord({ id: "s1", seq: 2, prompt_ids: [...SYS, 0, 0], output_ids: [3, 3] });
  const retry = makeRecord({ id: "m2b", seq: 3, prompt_ids: [...SYS, 1, 2, 3, 4, 5], output_ids: [6, 7] });
  const records = [m1, m2, sub, retry];

  it("stores the shared system prompt once and gives each conversation its own leaf", () => {
    const t = prefixTree(records);
    expect(t.builder).toBe("prefix_tree");
    expect(TrajectorySchema.parse(t)).toEqual(t);
    const tree = t.tree!;
    expect(tree.nodes[0]).toMatchObject({ parent: null, depth: 0, token_ids: SYS, loss_mask: [0, 0, 0] });
    expect(tree.nodes.filter((n) => n.parent === null)).toHaveLength(1);
    expect(t.traces.map((x) => x.completion_ids)).toEqual([["m1", "m2"], ["s1"], ["m2b"]]);
    // main and the retry share everything up to m2's prompt; each keeps its own sampled [6, 7].
    const [mainEnd, subEnd, retryEnd] = tree.samples.map((s) => s.node);
    expect(pathTokens(tree, mainEnd!)).toEqual([...SYS, 1, 2, 3, 4, 5, 6, 7]);
    expect(pathTokens(tree, retryEnd!)).toEqual([...SYS, 1, 2, 3, 4, 5, 6, 7]);
    expect(mainEnd).not.toBe(retryEnd);
    expect(tree.nodes[mainEnd!]!.parent).toBe(tree.nodes[retryEnd!]!.parent);
    expect(tree.nodes[mainEnd!]!.spans).toEqual([{ record_id: "m2", start: 0, end: 2 }]);
    expect(tree.nodes[retryEnd!]!.spans).toEqual([{ record_id: "m2b", start: 0, end: 2 }]);
    expect(pathTokens(tree, subEnd!)).toEqual([...SYS, 0, 0, 3, 3]);
    expect(tree.flat_tokens).toBe(10 + 7 + 10);
    expect(tree.tree_tokens).toBe(3 + 5 + 2 + 2 + 4);
    expectTreeInvariants(records, t);
  });

  it("its flat view is prefix_merging's traces, so every trainer format takes it unchanged", () => {
    const tree = prefixTree(records);
    const flat = prefixMerging(records);
    expect(tree.traces).toEqual(flat.traces);
    expect(tree.stats).toEqual(flat.stats);
    expect(toTrainerFormat(tree, "verl")).toEqual(toTrainerFormat(flat, "verl"));
    expect(flat.tree).toBeUndefined();
  });

  it("a token one conversation only read and another sampled is trainable once, for the record that sampled it", () => {
    // a's prompt holds [5, 6] as user text; b, from the shorter prompt, sampled exactly [5, 6].
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: [...SYS, 1, 5, 6, 2], output_ids: [7] });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: [...SYS, 1], output_ids: [5, 6] });
    const t = prefixTree([a, b]);
    expect(t.traces).toHaveLength(2);
    const tree = t.tree!;
    const shared = tree.nodes[tree.samples[1]!.node]!;
    expect(shared).toMatchObject({ token_ids: [...SYS, 1, 5, 6], loss_mask: [0, 0, 0, 0, 1, 1], spans: [{ record_id: "b", start: 4, end: 6 }] });
    expectTreeInvariants([a, b], t);
    // In a's flat sample the same tokens stay prompt: they are b's samples, not a's.
    expect(t.traces[0]!.prompt_ids).toEqual([...SYS, 1, 5, 6, 2]);
  });
});

describe("prefix_tree: the build's own checks", () => {
  const records = [
    makeRecord({ id: "a", seq: 0, prompt_ids: [...SYS, 1], output_ids: [2, 3] }),
    makeRecord({ id: "b", seq: 1, prompt_ids: [...SYS, 4], output_ids: [5] }),
  ];
  const rule = (mutate: (tree: PrefixTree) => void): string => {
    const t = prefixTree(records);
    const tree = structuredClone(t.tree!);
    mutate(tree);
    try {
      checkTreeInvariants(tree, t.traces);
    } catch (e) {
      expect(e).toBeInstanceOf(TrajectoryInvariantError);
      return (e as TrajectoryInvariantError).rule;
    }
    return "passed";
  };
  const leafOf = (tree: PrefixTree, trace: number) => tree.nodes[tree.samples[trace]!.node]!;

  it("pass on the tree it built, and name what is wrong in a corrupted one", () => {
    expect(rule(() => {})).toBe("passed");
    expect(rule((tree) => (leafOf(tree, 0).token_ids[0] = 99))).toBe("tree_path");
    expect(rule((tree) => (leafOf(tree, 0).spans = []))).toBe("tree_unowned_token");
    expect(rule((tree) => (leafOf(tree, 0).logprobs[1] = Number.NaN))).toBe("missing_logprob");
    expect(rule((tree) => (leafOf(tree, 0).logprobs[0] = -1))).toBe("masked_logprob_not_zero");
    expect(rule((tree) => ((tree.nodes[0]!.loss_mask[0] as number) = 1))).not.toBe("passed");
    expect(rule((tree) => (leafOf(tree, 1).depth = 0))).toBe("tree_depth");
    expect(rule((tree) => tree.samples.pop())).toBe("tree_samples");
  });
});

/** A token from a tiny vocabulary, so conversations share and collide by chance as well as by design. */
const token = fc.integer({ min: 0, max: 3 });
const tokens = (min: number, max: number) => fc.array(token, { minLength: min, maxLength: max });

type Step =
  | { op: "new"; sys: number; body: number[]; out: number[] }
  | { op: "extend"; of: number; glue: number[]; out: number[] }
  | { op: "retry"; of: number; same: boolean; out: number[] }
  | { op: "branch"; of: number; keep: number; body: number[]; out: number[] };

const step: fc.Arbitrary<Step> = fc.oneof(
  fc.record({ op: fc.constant("new" as const), sys: fc.integer({ min: 0, max: 2 }), body: tokens(0, 3), out: tokens(0, 4) }),
  fc.record({ op: fc.constant("extend" as const), of: fc.nat(), glue: tokens(0, 3), out: tokens(1, 4) }),
  fc.record({ op: fc.constant("extend" as const), of: fc.nat(), glue: tokens(0, 3), out: tokens(1, 4) }),
  fc.record({ op: fc.constant("retry" as const), of: fc.nat(), same: fc.boolean(), out: tokens(0, 4) }),
  fc.record({ op: fc.constant("branch" as const), of: fc.nat(), keep: fc.nat(), body: tokens(0, 3), out: tokens(1, 4) }),
);

const SYSTEMS = [[9, 9, 8, 7], [9, 9, 8, 6], [5]];

/** Records an agent session could produce: new conversations, continued ones, retries (some identical), branches. */
function session(steps: Step[], versions: boolean[]): CompletionRecord[] {
  const records: CompletionRecord[] = [];
  steps.forEach((s, seq) => {
    const prev = records.length > 0 ? records[(s.op === "new" ? 0 : s.of) % records.length]! : undefined;
    let prompt: number[];
    let out = s.out;
    if (s.op === "new" || prev === undefined) prompt = [...SYSTEMS[s.op === "new" ? s.sys : 0]!, ...(s.op === "new" ? s.body : [])];
    else if (s.op === "extend") prompt = [...prev.prompt_ids, ...prev.output_ids, ...s.glue];
    else if (s.op === "retry") {
      prompt = prev.prompt_ids.slice();
      if (s.same) out = prev.output_ids.slice();
    } else prompt = [...prev.prompt_ids.slice(0, s.keep % (prev.prompt_ids.length + 1)), ...s.body];
    records.push(
      makeRecord({
        id: `r${seq}`,
        seq,
        prompt_ids: prompt,
        output_ids: out,
        output_logprobs: out.map((_, k) => -(seq + 1) - k / 100),
        weight_version: versions[seq] ? "v2" : "v1",
      }),
    );
  });
  return records;
}

describe("prefix_tree: invariants on random sessions (property)", () => {
  it("every sampled token trainable exactly once; each sample's path is its conversation; shared prefixes stored once", () => {
    fc.assert(
      fc.property(fc.array(step, { minLength: 1, maxLength: 30 }), fc.array(fc.boolean(), { minLength: 30, maxLength: 30 }), (steps, versions) => {
        const records = session(steps, versions);
        const t = prefixTree(records);
        expectTreeInvariants(records, t);
        // The order records arrive in does not change the tree (the builder orders them by seq).
        expect(prefixTree([...records].reverse())).toEqual(t);
      }),
      { numRuns: 300, seed: 20 },
    );
  });
});
