import { describe, expect, it } from "vitest";
import { definedSampling, SAMPLING_KEYS } from "./chat.js";
import { isTerminalStatus, summarizeGroup, TaskStatus, type TaskResult } from "./task.js";

const result = (id: string, status: TaskResult["status"], reward: number | null, error: TaskResult["error"] = null) => ({ id, status, reward, error }) as TaskResult;

describe("summarizeGroup", () => {
  it("counts members by status and lists every member without a reward, with why", () => {
    const ids = ["g-0", "g-1", "g-2", "g-3"];
    const summary = summarizeGroup(ids, [
      result("g-0", "completed", 1),
      result("g-1", "failed", null, { kind: "infrastructure", message: "an LLM call was lost to infrastructure: engine down" }),
      result("g-2", "completed", 0),
      null,
    ]);
    expect(summary).toEqual({
      size: 4,
      statuses: { completed: 2, failed: 1 },
      scored: 2,
      unscored: [
        { id: "g-1", status: "failed", error: { kind: "infrastructure", message: "an LLM call was lost to infrastructure: engine down" } },
        { id: "g-3", status: null, error: { kind: "missing", message: "no readable result is stored for this member" } },
      ],
    });
  });
});

describe("terminal statuses and sampling keys (the one definition of each)", () => {
  it("a task ends in completed, failed, timed_out or cancelled, and nothing else", () => {
    expect(TaskStatus.options.filter(isTerminalStatus)).toEqual(["completed", "failed", "timed_out", "cancelled"]);
    expect(isTerminalStatus("running")).toBe(false);
    expect(isTerminalStatus("done")).toBe(false);
  });

  it("definedSampling keeps the set parameters in schema order and leaves out the excepted ones", () => {
    expect(SAMPLING_KEYS).toContain("top_p");
    expect(definedSampling({ seed: 7, temperature: 0.5, max_tokens: 9, top_p: undefined })).toEqual({ temperature: 0.5, max_tokens: 9, seed: 7 });
    expect(Object.keys(definedSampling({ seed: 7, temperature: 0.5, max_tokens: 9 }))).toEqual(["temperature", "max_tokens", "seed"]);
    expect(definedSampling({ seed: 7, temperature: 0.5, max_tokens: 9 }, ["max_tokens", "seed"])).toEqual({ temperature: 0.5 });
  });
});
