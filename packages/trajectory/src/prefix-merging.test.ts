import { describe, expect, it } from "vitest";
import linear3 from "./__fixtures__/linear-3.json" with { type: "json" };
import { fromFixture, IM_END, IM_START, makeRecord, NL } from "./__fixtures__/make-record.js";
import { buildTrajectory, prefixMerging } from "./index.js";

const SYS = [IM_START, 8948, NL, 100, 101, IM_END, NL];
const user = (...body: number[]) => [IM_START, 872, NL, ...body, IM_END, NL];
const GEN = [IM_START, 77091, NL];

describe("prefix_merging: linear conversation", () => {
  it("merges a 3-call conversation into one trace with the exact mask/logprob layout", () => {
    const t = prefixMerging(fromFixture(linear3.records));
    expect(t.builder).toBe("prefix_merging");
    expect(t.traces).toEqual([linear3.expected_trace]);
    expect(t.stats.breaks).toEqual([]);
    expect(t.stats).toMatchObject({ records: 3, traces: 1, merged_records: 2, response_tokens: 31, trainable_tokens: 9 });
  });

  it("sorts by seq before merging", () => {
    const records = fromFixture(linear3.records);
    const shuffled = [records[2]!, records[0]!, records[1]!];
    expect(prefixMerging(shuffled).traces).toEqual([linear3.expected_trace]);
  });

  it("says when a trace spans a weight change", () => {
    const t = prefixMerging(fromFixture(linear3.records));
    expect(t.stats.weight_versions).toEqual(["v1", "v2"]);
    expect(t.stats.per_trace[0]).toMatchObject({ weight_versions: ["v1", "v2"], weight_changes: 1 });
    expect(t.stats).toMatchObject({ weight_changes: 1, traces_with_weight_change: 1 });
    // one version per response token: r1's output v1, glue null, later outputs v2
    const wv = t.traces[0]!.weight_versions;
    expect(wv.slice(0, 3)).toEqual(["v1", "v1", "v1"]);
    expect(wv.at(-1)).toBe("v2");
    expect(t.traces[0]!.loss_mask.every((m, i) => (m === 0) === (wv[i] === null))).toBe(true);
  });
});

describe("prefix_merging: end of turn", () => {
  const p1 = [...SYS, ...user(200), ...GEN];

  it("an output that stopped on <|im_end|> keeps it trainable exactly once", () => {
    const r1 = makeRecord({ id: "a", seq: 0, prompt_ids: p1, output_ids: [300, IM_END], output_logprobs: [-1, -0.01] });
    const p2 = [...p1, 300, IM_END, NL, ...user(400), ...GEN];
    const r2 = makeRecord({ id: "b", seq: 1, prompt_ids: p2, output_ids: [500, IM_END], output_logprobs: [-2, -0.02] });
    const [trace] = prefixMerging([r1, r2]).traces;
    expect(trace!.response_ids).toEqual([300, IM_END, NL, ...user(400), ...GEN, 500, IM_END]);
    expect(trace!.response_ids.filter((x) => x === IM_END)).toHaveLength(3); // two ends sampled, one user turn's end
    expect(trace!.loss_mask.slice(0, 3)).toEqual([1, 1, 0]);
    expect(trace!.response_logprobs[1]).toBe(-0.01);
  });

  it("an output cut on length gets the next prompt's <|im_end|> as mask-0 glue", () => {
    const r1 = makeRecord({ id: "a", seq: 0, prompt_ids: p1, output_ids: [300, 301], output_logprobs: [-1, -1.5], finish_reason: "length" });
    const p2 = [...p1, 300, 301, IM_END, NL, ...user(400), ...GEN];
    const r2 = makeRecord({ id: "b", seq: 1, prompt_ids: p2, output_ids: [500, IM_END], output_logprobs: [-2, -0.02] });
    const t = prefixMerging([r1, r2]);
    expect(t.traces).toHaveLength(1);
    const trace = t.traces[0]!;
    expect(trace.response_ids.slice(0, 4)).toEqual([300, 301, IM_END, NL]);
    expect(trace.loss_mask.slice(0, 4)).toEqual([1, 1, 0, 0]);
    expect(trace.response_logprobs.slice(0, 4)).toEqual([-1, -1.5, 0, 0]);
    expect(trace.weight_versions.slice(0, 4)).toEqual(["v1", "v1", null, null]);
    expect(trace.finish_reason).toBe("stop");
  });
});

describe("prefix_merging: siblings and branching", () => {
  const p1 = [...SYS, ...user(200), ...GEN];

  it("two records with the same prompt become two traces and a sibling break", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: p1, output_ids: [300, IM_END] });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: p1, output_ids: [301, IM_END] });
    const t = prefixMerging([a, b]);
    expect(t.traces.map((x) => x.completion_ids)).toEqual([["a"], ["b"]]);
    expect(t.traces[1]!.prompt_ids).toEqual(p1);
    expect(t.traces[1]!.loss_mask).toEqual([1, 1]);
    expect(t.stats.breaks).toEqual([
      expect.objectContaining({ record_id: "b", closest_trace: 0, position: p1.length, reason: "sibling" }),
    ]);
  });

  it("each sibling's continuation extends its own chain (n>1 then both continue)", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: p1, output_ids: [300, IM_END] });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: p1, output_ids: [301, IM_END] });
    const b2 = makeRecord({ id: "b2", seq: 2, prompt_ids: [...p1, 301, IM_END, NL, ...user(7), ...GEN], output_ids: [9, IM_END] });
    const a2 = makeRecord({ id: "a2", seq: 3, prompt_ids: [...p1, 300, IM_END, NL, ...user(8), ...GEN], output_ids: [10, IM_END] });
    const t = prefixMerging([a, b, b2, a2]);
    expect(t.traces.map((x) => x.completion_ids)).toEqual([["a", "a2"], ["b", "b2"]]);
    expect(t.stats.breaks.map((x) => x.reason)).toEqual(["sibling"]);
  });

  it("identical siblings with identical outputs (greedy n>1) still give two traces; the next turn takes one", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: p1, output_ids: [300, IM_END] });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: p1, output_ids: [300, IM_END] });
    const c = makeRecord({ id: "c", seq: 2, prompt_ids: [...p1, 300, IM_END, NL, ...user(7), ...GEN], output_ids: [1, IM_END] });
    const d = makeRecord({ id: "d", seq: 3, prompt_ids: [...p1, 300, IM_END, NL, ...user(7), ...GEN], output_ids: [2, IM_END] });
    const t = prefixMerging([a, b, c, d]);
    expect(t.traces.map((x) => x.completion_ids)).toEqual([["a", "c"], ["b", "d"]]);
  });

  it("a retry of a later turn (prompt starts with a tip already extended) is a sibling", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: p1, output_ids: [300, IM_END] });
    const p2 = [...p1, 300, IM_END, NL, ...user(7), ...GEN];
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: p2, output_ids: [1, IM_END] });
    const c = makeRecord({ id: "c", seq: 2, prompt_ids: [...p1, 300, IM_END, NL, ...user(8), ...GEN], output_ids: [2, IM_END] });
    const t = prefixMerging([a, b, c]);
    expect(t.traces.map((x) => x.completion_ids)).toEqual([["a", "b"], ["c"]]);
    expect(t.stats.breaks).toEqual([
      expect.objectContaining({ record_id: "c", closest_trace: 0, reason: "sibling", position: p1.length + 2 + 4 }),
    ]);
  });

  it("a break long after an earlier one is measured against the chains as they are now", () => {
    // a (chain 0) and an unrelated b (chain 1: the first break); then a grows over two calls;
    // e shares a's grown sequence up to its last output and then differs from it.
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: p1, output_ids: [300, IM_END] });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: [9, 9, 9], output_ids: [1] });
    const p2 = [...p1, 300, IM_END, NL, ...user(7), ...GEN];
    const c = makeRecord({ id: "c", seq: 2, prompt_ids: p2, output_ids: [301, IM_END] });
    const p3 = [...p2, 301, IM_END, NL, ...user(8), ...GEN];
    const d = makeRecord({ id: "d", seq: 3, prompt_ids: p3, output_ids: [302, 303, IM_END] });
    const e = makeRecord({ id: "e", seq: 4, prompt_ids: [...p3, 302, 999], output_ids: [5] });
    const t = prefixMerging([a, b, c, d, e]);
    expect(t.traces.map((x) => x.completion_ids)).toEqual([["a", "c", "d"], ["b"], ["e"]]);
    expect(t.stats.breaks.map((x) => [x.record_id, x.closest_trace, x.position])).toEqual([
      ["b", null, null],
      ["e", 0, p3.length + 1],
    ]);
  });

  it("extends the longest qualifying chain", () => {
    // chain 0 = short prompt; chain 1 = a longer conversation that starts with chain 0's prompt prefix
    const short = makeRecord({ id: "s", seq: 0, prompt_ids: [...SYS], output_ids: [5] });
    const long = makeRecord({ id: "l", seq: 1, prompt_ids: [...SYS, 5, 6], output_ids: [7, IM_END] });
    // "l" extends "s" (its prompt starts with SYS+[5]); now a third record extends the longer tip
    const next = makeRecord({ id: "n", seq: 2, prompt_ids: [...SYS, 5, 6, 7, IM_END, NL], output_ids: [8] });
    const t = prefixMerging([short, long, next]);
    expect(t.traces.map((x) => x.completion_ids)).toEqual([["s", "l", "n"]]);

    // two live tips where both qualify: the longer one wins
    const x = makeRecord({ id: "x", seq: 0, prompt_ids: [1, 2], output_ids: [3] });
    const y = makeRecord({ id: "y", seq: 1, prompt_ids: [1, 2, 3, 9, 9], output_ids: [4] }); // extends x
    const z = makeRecord({ id: "z", seq: 2, prompt_ids: [1, 2], output_ids: [3] }); // sibling of x
    const w = makeRecord({ id: "w", seq: 3, prompt_ids: [1, 2, 3, 9, 9, 4, 5], output_ids: [6] });
    const u = buildTrajectory([x, y, z, w], "prefix_merging");
    // w starts with z's tip [1,2,3] (len 3) and with the x-y chain's tip [1,2,3,9,9,4] (len 6)
    expect(u.traces.map((t2) => t2.completion_ids)).toEqual([["x", "y", "w"], ["z"]]);
  });
});

describe("prefix_merging: a long session", () => {
  it("builds a 500-record session (one conversation + interleaved sub-agent calls) correctly", () => {
    const records = [];
    let prompt = [...SYS, ...user(1), ...GEN];
    const sampled: number[] = [];
    const logprobs: number[] = [];
    let seq = 0;
    const mainMsgs = [{ role: "system" as const, content: "main" }, { role: "user" as const, content: "task" }];
    for (let turn = 0; turn < 400; turn++) {
      const out = [1000 + (turn % 500), 2000 + (turn % 7), IM_END];
      const lps = out.map((_, i) => -(turn + 1) / 1000 - i / 10);
      records.push(makeRecord({ id: `m${turn}`, seq: seq++, prompt_ids: prompt, output_ids: out, output_logprobs: lps, messages: mainMsgs }));
      sampled.push(...out);
      logprobs.push(...lps);
      prompt = [...prompt, ...out, NL, ...user(3000 + turn, 3001), ...GEN];
      if (turn % 4 === 0) {
        // a sub-agent with its own system prompt: a separate trace each time
        records.push(makeRecord({ id: `sub${turn}`, seq: seq++, prompt_ids: [IM_START, 8948, NL, 42, turn, IM_END, NL, ...GEN], output_ids: [7, IM_END], messages: [{ role: "system", content: `sub-agent ${turn}` }, { role: "user", content: "go" }] }));
      }
    }
    expect(records).toHaveLength(500);
    const t = prefixMerging(records);
    expect(t.stats.traces).toBe(101);
    const main = t.traces[0]!;
    expect(main.completion_ids).toHaveLength(400);
    expect(main.response_ids.filter((_, i) => main.loss_mask[i] === 1)).toEqual(sampled);
    expect(main.response_logprobs.filter((_, i) => main.loss_mask[i] === 1)).toEqual(logprobs);
    expect(main.prompt_ids.concat(main.response_ids)).toEqual(prompt.slice(0, prompt.length - (1 + 7 + 3)));
    expect(t.stats.breaks).toHaveLength(100);
    expect(new Set(t.stats.breaks.map((b) => b.reason))).toEqual(new Set(["system_changed"]));
  });
});

describe("a call continued across a weight change (abort-mode pause)", () => {
  const p1 = [...SYS, ...user(200), ...GEN];
  // Two tokens sampled under v1 before the pause cut the call, the rest under v2 after resume.
  const r1 = makeRecord({
    id: "a",
    seq: 0,
    prompt_ids: p1,
    output_ids: [300, 301, 302, IM_END],
    output_logprobs: [-1, -2, -3, -0.1],
    weight_version: "v2",
    output_weight_versions: ["v1", "v1", "v2", "v2"],
    continued_after_pause: 1,
  });
  const p2 = [...p1, 300, 301, 302, IM_END, NL, ...user(400), ...GEN];
  const r2 = makeRecord({ id: "b", seq: 1, prompt_ids: p2, output_ids: [500, IM_END], output_logprobs: [-1, -0.1], weight_version: "v2" });

  it("prefix_merging stamps each token with the version it was sampled under", () => {
    const t = prefixMerging([r1, r2]);
    const wv = t.traces[0]!.weight_versions;
    expect(wv.slice(0, 4)).toEqual(["v1", "v1", "v2", "v2"]);
    expect(wv.at(-1)).toBe("v2");
    expect(t.stats.per_trace[0]).toMatchObject({ weight_versions: ["v1", "v2"], weight_changes: 1 });
    expect(t.stats).toMatchObject({ weight_versions: ["v1", "v2"], traces_with_weight_change: 1 });
  });

  it("per_request does too", () => {
    const t = buildTrajectory([r1, r2], "per_request");
    expect(t.traces[0]!.weight_versions).toEqual(["v1", "v1", "v2", "v2"]);
    expect(t.traces[1]!.weight_versions).toEqual(["v2", "v2"]);
    expect(t.stats.per_trace.map((s) => s.weight_changes)).toEqual([1, 0]);
  });

  it("refuses a record whose per-token versions do not cover its output", () => {
    const bad = { ...r1, output_weight_versions: ["v1", "v2"] };
    expect(() => prefixMerging([bad])).toThrow(/weight_versions_length_mismatch/);
  });
});
