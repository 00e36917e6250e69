import type { CompletionRecord, Trace } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { IM_END, makeRecord } from "./__fixtures__/make-record.js";
import { buildTrajectory, checkTraceInvariants, TrajectoryInvariantError } from "./index.js";

const good = () => makeRecord({ id: "a", seq: 0, prompt_ids: [1, 2], output_ids: [3, IM_END] });
const next = (patch: Partial<CompletionRecord>) => ({ ...makeRecord({ id: "b", seq: 1, prompt_ids: [1, 2, 3, IM_END, 5], output_ids: [6, 7] }), ...patch });

function thrown(fn: () => unknown): TrajectoryInvariantError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(TrajectoryInvariantError);
    return e as TrajectoryInvariantError;
  }
  throw new Error("expected a TrajectoryInvariantError");
}

describe("record invariants fail the build naming the record", () => {
  for (const builder of ["prefix_merging", "per_request"] as const) {
    it(`${builder}: a missing logprob (null) is never filled with 0.0`, () => {
      const bad = next({ output_logprobs: [-0.5, null as unknown as number] });
      const e = thrown(() => buildTrajectory([good(), bad], builder));
      expect(e).toMatchObject({ record_id: "b", rule: "missing_logprob", position: 1 });
      expect(e.message).toContain("record b");
    });
  }

  it("NaN and infinite logprobs are not real logprobs", () => {
    expect(thrown(() => buildTrajectory([good(), next({ output_logprobs: [Number.NaN, -1] })], "prefix_merging"))).toMatchObject({ record_id: "b", rule: "missing_logprob" });
    expect(thrown(() => buildTrajectory([good(), next({ output_logprobs: [-1, -Infinity] })], "prefix_merging"))).toMatchObject({ record_id: "b", rule: "missing_logprob" });
  });

  it("output_logprobs shorter than output_ids", () => {
    const e = thrown(() => buildTrajectory([good(), next({ output_logprobs: [-1] })], "prefix_merging"));
    expect(e).toMatchObject({ record_id: "b", rule: "logprob_length_mismatch" });
  });

  it("ids that are not token ids: negative or fractional, whatever the vocabulary", () => {
    expect(thrown(() => buildTrajectory([good(), next({ prompt_ids: [1, 2, 3, IM_END, -1] })], "prefix_merging"))).toMatchObject({ record_id: "b", rule: "id_out_of_vocab" });
    expect(thrown(() => buildTrajectory([good(), next({ output_ids: [6, 7.5] })], "prefix_merging"))).toMatchObject({ record_id: "b" });
  });

  it("without a vocabulary size any non-negative id is valid: gpt-oss's <|start|> 200006, a Kimi-K2 special token 163587", () => {
    const t = buildTrajectory([good(), next({ output_ids: [200_006, 163_587] })], "prefix_merging");
    expect(t.traces).toHaveLength(1);
    expect(t.traces[0]!.response_ids.slice(-2)).toEqual([200_006, 163_587]);
    expect(buildTrajectory([good(), next({ output_ids: [6, 201_087] })], "prefix_merging", { vocabSize: 201_088 }).traces).toHaveLength(1);
  });

  it("a declared vocabulary still rejects ids beyond it, naming record and position", () => {
    expect(thrown(() => buildTrajectory([good(), next({ output_ids: [6, 151_936] })], "prefix_merging", { vocabSize: 151_936 }))).toMatchObject({ record_id: "b", rule: "id_out_of_vocab", position: 1 });
    expect(buildTrajectory([good(), next({ output_ids: [6, 151_935] })], "prefix_merging", { vocabSize: 151_936 }).traces).toHaveLength(1);
    expect(thrown(() => buildTrajectory([good()], "prefix_merging", { vocabSize: 1000 }))).toMatchObject({ record_id: "a", rule: "id_out_of_vocab" });
    expect(thrown(() => buildTrajectory([good()], "prefix_merging", { vocabSize: 1000 })).message).toMatch(/not a token id in \[0, 1000\)/);
  });

  it("duplicate records, duplicate seq and mixed sessions", () => {
    expect(thrown(() => buildTrajectory([good(), good()], "prefix_merging"))).toMatchObject({ record_id: "a", rule: "duplicate_record" });
    expect(thrown(() => buildTrajectory([good(), next({ seq: 0 })], "prefix_merging")).rule).toBe("duplicate_seq");
    expect(thrown(() => buildTrajectory([good(), next({ session_id: "other" })], "prefix_merging"))).toMatchObject({ record_id: "b", rule: "mixed_sessions" });
  });
});

describe("checkTraceInvariants", () => {
  const trace = (): Trace => ({
    kind: "main",
    parent: null,
    prompt_ids: [1, 2],
    response_ids: [3, IM_END, 5, 6, 7],
    response_logprobs: [-1, -2, 0, -3, -4],
    loss_mask: [1, 1, 0, 1, 1],
    weight_versions: ["v1", "v1", null, "v1", "v1"],
    completion_ids: ["a", "b"],
    finish_reason: "stop",
  });
  const spans = [
    { record_id: "a", start: 0, output_start: 0, end: 2 },
    { record_id: "b", start: 2, output_start: 3, end: 5 },
  ];

  it("accepts a good trace", () => {
    expect(() => checkTraceInvariants(trace(), { spans })).not.toThrow();
  });

  it("rejects unequal lengths", () => {
    expect(thrown(() => checkTraceInvariants({ ...trace(), weight_versions: ["v1"] })).rule).toBe("length_mismatch");
    expect(thrown(() => checkTraceInvariants({ ...trace(), response_logprobs: [-1] })).rule).toBe("length_mismatch");
  });

  it("rejects masks other than 0/1, naming the record that owns the token", () => {
    const t = { ...trace(), loss_mask: [1, 1, 0, 2, 1] as unknown as (0 | 1)[] };
    expect(thrown(() => checkTraceInvariants(t, { spans, traceIndex: 3 }))).toMatchObject({ rule: "mask_not_binary", record_id: "b", trace_index: 3, position: 3 });
  });

  it("rejects a trainable token without a real logprob, and a masked token with one", () => {
    const t = trace();
    t.response_logprobs[0] = null as unknown as number;
    expect(thrown(() => checkTraceInvariants(t, { spans }))).toMatchObject({ rule: "missing_logprob", record_id: "a", position: 0 });
    const u = trace();
    u.response_logprobs[2] = -0.7;
    expect(thrown(() => checkTraceInvariants(u, { spans }))).toMatchObject({ rule: "masked_logprob_not_zero", record_id: "b" });
  });

  it("rejects out-of-vocabulary response ids when a vocabulary size is given, and negative ones always", () => {
    const t = trace();
    t.response_ids[4] = 200_000;
    expect(thrown(() => checkTraceInvariants(t, { spans, vocabSize: 151_936 }))).toMatchObject({ rule: "id_out_of_vocab", record_id: "b" });
    expect(() => checkTraceInvariants(t, { spans })).not.toThrow();
    t.response_ids[4] = -3;
    expect(thrown(() => checkTraceInvariants(t, { spans }))).toMatchObject({ rule: "id_out_of_vocab", record_id: "b" });
  });
});
