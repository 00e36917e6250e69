import { describe, expect, it } from "vitest";
import { summarizeGroup, type TaskResult } from "./task.js";

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
