import type { TaskResult } from "@rollgate/client";
import { describe, expect, it } from "vitest";
import { GLOBAL_OPTIONS } from "./cli.js";
import { allCommands } from "./commands/index.js";
import { UsageError, findCommand, parseCommand } from "./framework.js";
import { clip, makeStyle, prettyJson } from "./output.js";
import { ProgressView, emptyCounts } from "./progress.js";
import { ago } from "./commands/tasks.js";
import { describeEvent } from "./commands/watch.js";
import { describeCounts, describeExits, listIds, mean, memberOrder, nonzeroExit, statusRows, std } from "./summary.js";
import { renderTable } from "./table.js";
import { TasksFileError, readTasksFile } from "./tasks-file.js";

const submit = allCommands.find((c) => c.name === "submit")!;

describe("argument parsing", () => {
  it("finds the command after global options that take values", () => {
    expect(findCommand(["--url", "http://x", "submit", "f.jsonl", "-n", "4"], GLOBAL_OPTIONS)).toEqual({ name: "submit", rest: ["--url", "http://x", "f.jsonl", "-n", "4"] });
    expect(findCommand(["--json"], GLOBAL_OPTIONS).name).toBeUndefined();
  });

  it("parses options, defaults, negations and env, and refuses mistakes", () => {
    const { args, values } = parseCommand(submit, ["f.jsonl", "-n", "4", "--no-wait"], GLOBAL_OPTIONS);
    expect(args).toEqual(["f.jsonl"]);
    expect(values).toMatchObject({ "group-size": "4", wait: false, interval: "1" });
    expect(() => parseCommand(submit, [], GLOBAL_OPTIONS)).toThrow(UsageError);
    expect(() => parseCommand(submit, ["a", "b"], GLOBAL_OPTIONS)).toThrow(/unexpected argument "b"/);
    expect(() => parseCommand(submit, ["a", "--frob"], GLOBAL_OPTIONS)).toThrow(/--frob/);
    const traj = allCommands.find((c) => c.name === "trajectory")!;
    expect(() => parseCommand(traj, ["a", "--format", "megatron"], GLOBAL_OPTIONS)).toThrow(/--format must be one of rollgate, verl, slime, prime-rl/);
  });
});

describe("progress rendering", () => {
  const counts = { ...emptyCounts(10), queued: 2, running: 3, done: 4, failed: 1, completionTokens: 5000, rewardSum: 3, rewardCount: 4 };

  it("writes plain lines (no control characters) at most every everyMs when not on a terminal", () => {
    let now = 0;
    const out: string[] = [];
    const p = new ProgressView((s) => out.push(s), { tty: false, everyMs: 1000, style: makeStyle(false), now: () => now });
    p.update(counts);
    now = 500;
    p.update(counts);
    now = 10_000;
    p.update(counts);
    p.finish(counts);
    expect(out).toEqual([
      "[0:00] 5/10 ended · queued 2 · running 3 · done 4 · failed 1 · 0.0 tok/s · mean reward 0.750\n",
      "[0:10] 5/10 ended · queued 2 · running 3 · done 4 · failed 1 · 500.0 tok/s · mean reward 0.750\n",
    ]);
    expect(out.join("")).not.toMatch(/[\r\x1b]/); // eslint-disable-line no-control-regex
  });

  it("redraws one line in place on a terminal (cli-progress), within the width", () => {
    const out: string[] = [];
    const p = new ProgressView((s) => out.push(s), { tty: true, everyMs: 1000, style: makeStyle(true), columns: 120 });
    p.update(counts);
    p.update(counts, true);
    p.finish(counts);
    const text = out.join("");
    expect(text.endsWith("\n")).toBe(true);
    // Every frame starts at column 1 of the same line: no newline before the final one.
    expect(text.slice(0, -1)).not.toContain("\n");
    const frames = text
      .replace(/\x1b\[[0-9;]*m/g, "") // eslint-disable-line no-control-regex -- colours don't take columns
      .replace(/\x1b\[[0-9;?]*[a-zA-Z]|\x1b[78]/g, "\u0000") // eslint-disable-line no-control-regex -- cursor moves separate the frames
      .split("\u0000")
      .filter((f) => f.includes("/10"));
    expect(frames.length).toBeGreaterThanOrEqual(2);
    for (const f of frames) {
      expect(f.length).toBeLessThanOrEqual(120);
      expect(f).toContain("5/10 │ queued 2  running 3  done 4  failed 1 │");
    }
  });
});

describe("tasks files", () => {
  const ok = { instruction: "x", agent: { harness: "command", command: ["true"] } };
  it("reads JSONL with comments and blank lines, and .json objects or arrays", () => {
    expect(readTasksFile("t.jsonl", `# c\n\n${JSON.stringify(ok)}\n// c\n${JSON.stringify(ok)}\n`).map((l) => l.line)).toEqual([3, 5]);
    expect(readTasksFile("t.json", JSON.stringify(ok))).toHaveLength(1);
    expect(readTasksFile("t.json", JSON.stringify([ok, ok, ok]))).toHaveLength(3);
  });
  it("lists every bad line, in order", () => {
    const bad = `${JSON.stringify({ instruction: 1 })}\n{oops\n${JSON.stringify({ ...ok, id: "a" })}\n${JSON.stringify({ ...ok, id: "a" })}\n`;
    expect(() => readTasksFile("t.jsonl", bad)).toThrow(TasksFileError);
    try {
      readTasksFile("t.jsonl", bad);
    } catch (err) {
      expect((err as Error).message).toMatch(/has 2 invalid task\(s\):\n {2}line 1: instruction: .*\n {2}line 2: not JSON/);
    }
    expect(() => readTasksFile("t.jsonl", `${JSON.stringify({ ...ok, id: "a" })}\n${JSON.stringify({ ...ok, id: "a" })}`)).toThrow(/task id a appears on lines 1 and 2/);
    expect(() => readTasksFile("t.jsonl", "\n# nothing\n")).toThrow(/holds no tasks/);
    // A 64-bit row id would reach the task changed (9223372036854775813 → …776000): refused, named.
    const big = JSON.stringify({ ...ok, metadata: { rows: [1, "X"] } }).replace('"X"', "9223372036854775813");
    expect(() => readTasksFile("t.jsonl", big)).toThrow(/line 1: metadata\.rows\[1\] = 9223372036854775813 cannot be held exactly .* arrive as 9223372036854776000\): write it as a string/);
    // Exact ones (2^53 − 1, 2^60), floats and digits in strings are fine.
    const fine = JSON.stringify({ ...ok, metadata: { a: 9007199254740991, b: 1.5e300, c: "9223372036854775813" } }).replace("1.5e+300", "1152921504606846976");
    expect(readTasksFile("t.jsonl", fine)).toHaveLength(1);
  });
});

describe("output helpers", () => {
  it("renders tables with colour-blind widths", () => {
    const s = makeStyle(true);
    const t = renderTable(["a", "bb"], [[s.green("x"), "1"], ["yyy", "22"]], { right: [1], ascii: true });
    expect(t.replace(/\x1b\[[0-9;]*m/g, "")).toBe(["+-----+----+", "| a   | bb |", "+-----+----+", "| x   |  1 |", "| yyy | 22 |", "+-----+----+"].join("\n")); // eslint-disable-line no-control-regex
  });
  it("keeps token arrays on one line in pretty JSON", () => {
    expect(prettyJson({ ids: [1, 2, -3.5e-2], s: ["a", "b"] })).toBe('{\n  "ids": [1,2,-3.5e-2],\n  "s": [\n    "a",\n    "b"\n  ]\n}'.replace("-3.5e-2", String(-3.5e-2)));
  });
});

describe("the submit summary", () => {
  const result = (id: string, status: TaskResult["status"], reward: number | null, error: string | null, exit: number | null, signal: string | null = null) =>
    ({
      id,
      status,
      reward,
      error: error ? { kind: error, message: "m" } : null,
      agent: { exit_code: exit, signal, log_tail: "" },
      usage: { llm_calls: 2, prompt_tokens: 0, completion_tokens: 10, cached_tokens: 0 },
      timings: { queued_ms: 0, run_ms: 0, eval_ms: 0, total_ms: 1000 },
    }) as TaskResult;

  it("counts each status with its error kinds and the agents that exited non-zero", () => {
    const rows = statusRows([
      result("a", "completed", 1, null, 0),
      result("b", "completed", 0, null, 3),
      result("c", "failed", null, "infrastructure", 1),
      result("d", "failed", null, "infrastructure", null),
      result("e", "failed", null, "harness_missing", null),
      result("f", "timed_out", null, "timeout", null, "SIGKILL"),
    ]);
    expect(rows.map((r) => [r.status, r.tasks, r.mean_reward, r.errors, r.nonzero_agent_exits])).toEqual([
      ["completed", 2, 0.5, {}, { "3": 1 }],
      ["failed", 3, null, { infrastructure: 2, harness_missing: 1 }, { "1": 1 }],
      ["timed_out", 1, null, { timeout: 1 }, { SIGKILL: 1 }],
    ]);
    expect(describeCounts(rows[1]!.errors)).toBe("infrastructure ×2, harness_missing");
    expect(describeCounts({})).toBe("–");
    expect(describeExits({ "3": 2, SIGKILL: 1 })).toBe("3 (exit 3 ×2, SIGKILL)");
    expect(describeExits({})).toBe("–");
    expect(nonzeroExit({ exit_code: 0, signal: null, log_tail: "" })).toBeNull();
  });

  it("a group whose rewards are all equal has std_reward exactly 0 (no signal), whatever float sums give", () => {
    expect(std([0.1, 0.1, 0.1])).toBe(0);
    expect(mean([0.1, 0.1, 0.1])).toBe(0.1);
    expect(std([1, 0])).toBe(0.5);
  });

  it("orders a group's members by number, whatever order the API lists them in", () => {
    // 12 members created in one millisecond: newest first, ties in reverse string order, as Redis gives them.
    const listed = ["g-9", "g-8", "g-7", "g-6", "g-5", "g-4", "g-3", "g-2", "g-11", "g-10", "g-1", "g-0"].map((id) => ({ id }));
    expect(memberOrder("g", listed).map((t) => t.id)).toEqual(Array.from({ length: 12 }, (_, k) => `g-${k}`));
    // Tasks named otherwise (a batch with its own ids) keep their creation order, after the members.
    expect(memberOrder("g", [{ id: "b" }, { id: "g-1" }, { id: "a" }, { id: "g-0" }]).map((t) => t.id)).toEqual(["g-0", "g-1", "a", "b"]);
  });

  it("lists ids up to a bound, then says how many more", () => {
    expect(listIds(["a", "b"])).toBe("a b");
    expect(listIds(["a", "b", "c", "d"], 2)).toBe("a b … and 2 more");
  });

  it("says how long ago in a few characters", () => {
    const now = Date.parse("2026-01-02T00:00:00Z");
    expect(ago("2026-01-01T23:59:55Z", now)).toBe("5s");
    expect(ago("2026-01-01T23:48:00Z", now)).toBe("12m");
    expect(ago("2026-01-01T21:00:00Z", now)).toBe("3h");
    expect(ago("2025-12-30T00:00:00Z", now)).toBe("3d");
    expect(ago(null, now)).toBe("–");
  });
});

describe("clip", () => {
  it("cuts long text (an agent's error in the tasks table) without splitting an emoji or a CJK character", () => {
    const note = `${"a".repeat(78)}😀 tail`;
    const cut = clip(note, 80);
    expect(cut).toBe(`${"a".repeat(78)}😀…`);
    // A lone surrogate half would not survive UTF-8 (it prints as �).
    expect(Buffer.from(cut, "utf8").toString("utf8")).toBe(cut);
    expect(clip("短い", 80)).toBe("短い");
  });
});

describe("watch", () => {
  const retrying = (data: Record<string, unknown>) => describeEvent(makeStyle(false), { id: "1-0", type: "retrying", at: "2026-01-01T00:00:00Z", data });

  it("says why an attempt is run again: a lost call, a failure of the infrastructure, a lost worker", () => {
    expect(retrying({ reason: "lost_call", attempt: 1, cause: "engine 503" })).toMatch(/attempt 1 lost an LLM call/);
    expect(retrying({ reason: "infrastructure", attempt: 2, cause: "gateway unreachable" })).toBe("retrying: attempt 2 failed on infrastructure and is not scored; it runs again (gateway unreachable)");
    expect(retrying({ reason: "worker_lost", previous_worker: "w1" })).toMatch(/the worker running it \(w1\) is gone/);
  });
});
