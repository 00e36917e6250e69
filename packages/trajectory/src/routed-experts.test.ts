import { packRoutedRows, unpackRoutedRows, type CompletionRecord } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { IM_END, IM_START, makeRecord, NL } from "./__fixtures__/make-record.js";
import { TrajectoryInvariantError } from "./errors.js";
import { perRequest, prefixMerging, prefixTree } from "./index.js";
import { toTrainerFormat } from "./formats.js";

// Routing that names its own position and token (2 layers × top-1): a row put on the wrong token shows.
// `tag` tells the records apart, so the test sees whose row each position kept.
const rowFor = (pos: number, token: number, tag: number) => [[pos * 1000 + tag], [token]];
function withRouting(r: CompletionRecord, tag: number, rows = r.prompt_ids.length + r.output_ids.length - 1): CompletionRecord {
  const seq = r.prompt_ids.concat(r.output_ids);
  return { ...r, routed_experts: packRoutedRows(Array.from({ length: rows }, (_, i) => rowFor(i, seq[i]!, tag)), { layers: 2, topk: 1 }) };
}

const P1 = [IM_START, 872, NL, 200, IM_END, NL, IM_START, 77091, NL];
const O1 = [300, 301, IM_END];
const P2 = [...P1, ...O1, NL, IM_START, 872, NL, 201, IM_END, NL, IM_START, 77091, NL];
const O2 = [302, IM_END];
const r1 = withRouting(makeRecord({ id: "r1", seq: 0, prompt_ids: P1, output_ids: O1 }), 1);
const r2 = withRouting(makeRecord({ id: "r2", seq: 1, prompt_ids: P2, output_ids: O2 }), 2);

describe("routed experts through the builders", () => {
  it("prefix_merging: each position keeps the row of the record whose forward pass sampled the next token", () => {
    const t = prefixMerging([r1, r2]);
    expect(t.traces).toHaveLength(1);
    const trace = t.traces[0]!;
    const seq = trace.prompt_ids.concat(trace.response_ids);
    const rows = unpackRoutedRows(trace.routed_experts!);
    expect(rows).toHaveLength(seq.length - 1);
    // r1 fed positions [0, |P1|+|O1|-1); its last token was first fed by r2, as was everything after.
    const firstOfR2 = P1.length + O1.length - 1;
    rows.forEach((row, i) => expect(row).toEqual(rowFor(i, seq[i]!, i < firstOfR2 ? 1 : 2).flat()));
    expect(trace.routed_experts).toMatchObject({ layers: 2, topk: 1, width: 2 });
  });

  it("per_request and prefix_tree traces carry each record's rows; trainer formats carry the trace's", () => {
    const pr = perRequest([r1, r2]);
    expect(pr.traces.map((t) => t.routed_experts)).toEqual([r1.routed_experts, r2.routed_experts]);
    const tree = prefixTree([r1, r2]);
    expect(tree.traces[0]!.routed_experts).toEqual(prefixMerging([r1, r2]).traces[0]!.routed_experts);
    const t = prefixMerging([r1, r2]);
    const routed = t.traces[0]!.routed_experts;
    expect(toTrainerFormat(t, "verl")[0]!.routed_experts).toEqual(routed);
    expect(toTrainerFormat(t, "slime")[0]!.rollout_routed_experts).toEqual(routed);
    expect(toTrainerFormat(t, "prime-rl")[0]!.routed_experts).toEqual(routed);
  });

  it("a trace with a record that has no routing has none (never a partial list)", () => {
    const bare = makeRecord({ id: "r2", seq: 1, prompt_ids: P2, output_ids: O2 });
    const t = prefixMerging([r1, bare]);
    expect(t.traces[0]!.routed_experts).toBeUndefined();
    expect(toTrainerFormat(t, "verl")[0]).not.toHaveProperty("routed_experts");
  });

  it("records of one trace whose rows have different widths fail the build as invalid, naming the record (a 422, not a crash)", () => {
    // r2's rows are 3 layers wide where r1's are 2: they cannot be one trace's routing.
    const seq = P2.concat(O2);
    const wide = { ...r2, routed_experts: packRoutedRows(Array.from({ length: seq.length - 1 }, (_, i) => [[i], [seq[i]!], [2]]), { layers: 3, topk: 1 }) };
    expect(() => prefixMerging([r1, wide])).toThrow(TrajectoryInvariantError);
    expect(() => prefixMerging([r1, wide])).toThrow(/record r2: .*width/);
  });

  it("a record whose rows do not fit its tokens fails the build, naming it", () => {
    const short = withRouting(makeRecord({ id: "short", seq: 1, prompt_ids: P2, output_ids: O2 }), 2, P2.length + O2.length - 2);
    expect(() => prefixMerging([r1, short])).toThrow(TrajectoryInvariantError);
    expect(() => prefixMerging([r1, short])).toThrow(/short.*routed experts cover/);
  });
});
