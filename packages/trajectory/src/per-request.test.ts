import { describe, expect, it } from "vitest";
import linear3 from "./__fixtures__/linear-3.json" with { type: "json" };
import { fromFixture } from "./__fixtures__/make-record.js";
import { perRequest } from "./index.js";

describe("per_request", () => {
  it("one trace per record, whole output trainable, in seq order", () => {
    const records = fromFixture(linear3.records);
    const t = perRequest([records[1]!, records[2]!, records[0]!]);
    expect(t.builder).toBe("per_request");
    expect(t.traces).toHaveLength(3);
    t.traces.forEach((trace, i) => {
      const r = records[i]!;
      expect(trace).toEqual({
        kind: "main",
        parent: null,
        prompt_ids: r.prompt_ids,
        response_ids: r.output_ids,
        response_logprobs: r.output_logprobs,
        loss_mask: r.output_ids.map(() => 1),
        weight_versions: r.output_ids.map(() => r.weight_version),
        completion_ids: [r.id],
        finish_reason: r.finish_reason,
      });
    });
    expect(t.stats).toMatchObject({ records: 3, traces: 3, breaks: [], merged_records: 0, weight_changes: 0, weight_versions: ["v1", "v2"] });
    expect(t.stats.trainable_tokens).toBe(9);
    expect(t.stats.response_tokens).toBe(9);
  });

  it("does not alias the records' arrays", () => {
    const records = fromFixture(linear3.records);
    const t = perRequest(records);
    t.traces[0]!.response_ids.push(1);
    expect(records[0]!.output_ids).toHaveLength(3);
  });
});
