import { describe, expect, it } from "vitest";
import linear3 from "./__fixtures__/linear-3.json" with { type: "json" };
import { fromFixture, IM_END, makeRecord } from "./__fixtures__/make-record.js";
import { prefixMerging, toTrainerFormat, type TrainerFormat } from "./index.js";

const exp = linear3.expected_trace;

describe("toTrainerFormat", () => {
  const t = prefixMerging(fromFixture(linear3.records));

  it("rollgate: the trajectory itself", () => {
    expect(toTrainerFormat(t, "rollgate")).toBe(t);
  });

  it("verl: prompts / responses / response_mask / rollout_log_probs", () => {
    expect(toTrainerFormat(t, "verl")).toEqual([
      { prompts: exp.prompt_ids, responses: exp.response_ids, response_mask: exp.loss_mask, rollout_log_probs: exp.response_logprobs },
    ]);
  });

  it("slime: tokens = prompt + response, response-aligned loss_mask and rollout_log_probs", () => {
    const [s] = toTrainerFormat(t, "slime");
    expect(s).toEqual({
      tokens: [...exp.prompt_ids, ...exp.response_ids],
      response_length: exp.response_ids.length,
      loss_mask: exp.loss_mask,
      rollout_log_probs: exp.response_logprobs,
      status: "completed",
    });
    expect(s!.tokens.slice(s!.tokens.length - s!.response_length)).toEqual(exp.response_ids);
  });

  it("slime: status says how the trace's last call ended, as slime's Sample.from_dict requires", () => {
    // slime sets TRUNCATED on finish_reason length and ABORTED on abort; Sample.from_dict reads data["status"].
    const ended = (finish_reason: string) =>
      toTrainerFormat(prefixMerging([makeRecord({ id: "a", seq: 0, prompt_ids: [1], output_ids: [2, 3], finish_reason })]), "slime")[0]!.status;
    expect(ended("length")).toBe("truncated");
    expect(ended("abort")).toBe("aborted");
    expect(ended("stop")).toBe("completed");
    expect(ended("tool_calls")).toBe("completed");
  });

  it("prime-rl: prompt_ids / completion_ids / completion_mask / completion_logprobs", () => {
    expect(toTrainerFormat(t, "prime-rl")).toEqual([
      {
        prompt_ids: exp.prompt_ids,
        prompt_mask: exp.prompt_ids.map(() => 0),
        completion_ids: exp.response_ids,
        completion_mask: exp.loss_mask,
        completion_logprobs: exp.response_logprobs,
        overlong_prompt: false,
        is_truncated: false,
      },
    ]);
    const cut = prefixMerging([makeRecord({ id: "a", seq: 0, prompt_ids: [1], output_ids: [2, 3], finish_reason: "length" })]);
    expect(toTrainerFormat(cut, "prime-rl")[0]!.is_truncated).toBe(true);
  });

  it("one sample per trace, and unknown formats are refused", () => {
    const two = prefixMerging([
      makeRecord({ id: "a", seq: 0, prompt_ids: [1, 2], output_ids: [3, IM_END] }),
      makeRecord({ id: "b", seq: 1, prompt_ids: [1, 2], output_ids: [4, IM_END] }),
    ]);
    for (const f of ["verl", "slime", "prime-rl"] as const) expect(toTrainerFormat(two, f)).toHaveLength(2);
    expect(() => toTrainerFormat(two, "openrlhf" as TrainerFormat)).toThrow(/unknown trainer format/);
  });
});
