/**
 * The `rollgate` CLI as a user runs it: the built bin spawned as a process against a real cluster,
 * stdout and stderr pipes (not a terminal), output and exit codes checked.
 */
import { spawn } from "node:child_process";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { RollgateClient } from "@rollgate/client";
import { Redis } from "ioredis";
import { freePort } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO_ROOT, startCluster, type RunningCluster } from "../support/cluster.js";
import { startApp, stopChild } from "../support/apps.js";
import { startOutageProxy } from "../support/outage-proxy.js";
import { poll } from "../support/poll.js";
import { TEST_REDIS_URL, dropPrefix, uniquePrefix } from "../support/redis.js";

const BIN = path.join(REPO_ROOT, "apps/cli/dist/main.js");

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** The working directory the CLI runs in (default result files land there). */
let workDir: string | undefined;

function rollgate(args: string[], env: Record<string, string> = {}, timeoutMs = 90_000): Promise<Run> {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, [BIN, ...args], {
      ...(workDir ? { cwd: workDir } : {}),
      env: { ...process.env, NO_COLOR: "", ROLLGATE_URL: "", ROLLGATE_API_KEY: "", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    proc.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    proc.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`rollgate ${args.join(" ")} did not exit in ${timeoutMs} ms\n${stdout}\n${stderr}`));
    }, timeoutMs);
    proc.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const quick = (text: string, extra: Record<string, unknown> = {}) => ({
  instruction: `Create hello.txt containing the word hello.\n#sim: [{"think": "Use the shell.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}]}, {"text": "${text}"}]`,
  agent: { harness: "command", command: ["rollgate-example-agent"] },
  evaluator: { kind: "command", command: ["bash", "-c", 'test "$(cat hello.txt)" = hello'] },
  limits: { timeout_s: 60 },
  ...extra,
});

describe("the rollgate CLI", () => {
  const prefix = uniquePrefix("cli");
  const apiKey = "cli-key";
  let cluster: RunningCluster;
  let dir: string;
  let env: Record<string, string>;
  let firstTask = "";
  let groupId = "";

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), "rollgate-cli-"));
    workDir = dir;
    cluster = await startCluster({ ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_API_KEY: apiKey });
    env = { ROLLGATE_URL: cluster.url, ROLLGATE_API_KEY: apiKey };
  }, 90_000);

  afterAll(async () => {
    await cluster?.stop();
    await dropPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  });

  it("has --help for itself and every command", async () => {
    const top = await rollgate(["--help"]);
    expect(top.code).toBe(0);
    for (const cmd of ["up", "submit", "tasks", "watch", "task", "trajectory", "pause", "resume", "weights"]) {
      expect(top.stdout).toContain(`  ${cmd} `);
      const help = await rollgate([cmd, "--help"]);
      expect(help.code, help.stderr).toBe(0);
      expect(help.stdout).toContain(`Usage: rollgate ${cmd}`);
      expect(help.stdout).toContain("--json");
    }
    expect((await rollgate(["help", "trajectory"])).stdout).toContain("--decode");
  });

  it("submits a JSONL file: plain progress lines in a pipe, a summary table, results as JSONL", async () => {
    const file = path.join(dir, "tasks.jsonl");
    writeFileSync(file, ["# two tasks", JSON.stringify(quick("first", { id: `cli-a-${prefix.slice(-8)}` })), "", JSON.stringify(quick("second"))].join("\n"));
    const out = path.join(dir, "results.jsonl");
    const run = await rollgate(["submit", file, "--out", out, "--interval", "0.2", "--progress-every", "0.2"], env);
    expect(run.code, run.stderr + run.stdout + cluster.output()).toBe(0);
    // Not a terminal: no cursor movement or colour, just lines.
    expect(run.stderr).not.toMatch(/\r|\x1b\[/); // eslint-disable-line no-control-regex
    const progress = run.stderr.split("\n").filter((l) => / ended · queued /.test(l));
    expect(progress.length).toBeGreaterThanOrEqual(1);
    expect(progress.at(-1)).toMatch(/2\/2 ended · queued 0 · running 0 · done 2 · failed 0 · [\d.]+ tok\/s · mean reward 1\.000/);
    expect(run.stdout).toContain(`submitted 2 task(s) from ${file} to ${cluster.url}; results appended to ${out}`);
    const results = readFileSync(out, "utf8").trim().split("\n").map((l) => JSON.parse(l));
    expect(results).toHaveLength(2);
    expect(results.every((r) => r.status === "completed" && r.reward === 1)).toBe(true);
    firstTask = `cli-a-${prefix.slice(-8)}`;
    expect(results.map((r) => r.id)).toContain(firstTask);
    // The ids it created, right after submitting: both tasks, the given one and the generated one.
    const second = results.map((r) => r.id as string).find((id) => id !== firstTask)!;
    expect(run.stdout).toMatch(new RegExp(`^  tasks: (${firstTask} ${second}|${second} ${firstTask})$`, "m"));
    expect(run.stdout).toMatch(/completed\s*[|│]\s*2\s*[|│]\s*1\.000/);
    expect(run.stdout).toContain(`results appended to ${out}`);
  }, 120_000);

  it("submits GRPO groups with -n and --json prints a parsable summary", async () => {
    const file = path.join(dir, "group.jsonl");
    groupId = `g-cli-${prefix.slice(-8)}`;
    writeFileSync(file, `${JSON.stringify(quick("grouped", { group_id: groupId }))}\n`);
    const run = await rollgate(["submit", file, "-n", "3", "--json", "--interval", "0.2", "--progress-every", "0.5"], env);
    expect(run.code, run.stderr).toBe(0);
    const summary = JSON.parse(run.stdout);
    expect(summary.submitted).toBe(3);
    expect(summary.by_status.completed).toBe(3);
    expect(summary.mean_reward).toBe(1);
    expect(summary.groups).toEqual([{ group_id: groupId, tasks: 3, completed: 3, mean_reward: 1, std_reward: 0 }]);
    expect(summary.task_ids).toEqual([0, 1, 2].map((k) => `${groupId}-${k}`));
    expect(summary.group_ids).toEqual([groupId]);
    expect(summary.statuses).toEqual([expect.objectContaining({ status: "completed", tasks: 3, errors: {}, nonzero_agent_exits: {} })]);
    expect(readFileSync(path.join(dir, "group.results.jsonl"), "utf8").trim().split("\n")).toHaveLength(3);
    // Without --json, the group and its task ids are printed as soon as they exist.
    const human = await rollgate(["submit", file, "-n", "2", "--no-wait"], env);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stderr).toContain(`submitted 2 task(s) from ${file} to ${cluster.url} in 1 group(s): ${groupId}`);
    expect(human.stdout.trim().split("\n")).toEqual([`${groupId}-0`, `${groupId}-1`]);
  }, 120_000);

  it("appends results to the same file across runs, and the summary gives error kinds and non-zero agent exits", async () => {
    const file = path.join(dir, "mixed.jsonl");
    const out = path.join(dir, "mixed.results.jsonl");
    const exits3 = quick("exits three", { agent: { harness: "command", command: ["bash", "-c", "rollgate-example-agent; exit 3"] } });
    const missing = quick("never runs", { agent: { harness: "command", command: ["no-such-agent-binary"] } });
    writeFileSync(file, [JSON.stringify(exits3), JSON.stringify(missing)].join("\n"));
    const first = await rollgate(["submit", file, "--out", out, "--interval", "0.2", "--json"], env);
    expect(first.code, first.stderr).toBe(1);
    const summary = JSON.parse(first.stdout);
    expect(summary.by_status).toMatchObject({ completed: 1, failed: 1 });
    expect(summary.statuses).toEqual([
      expect.objectContaining({ status: "completed", tasks: 1, mean_reward: 1, errors: {}, nonzero_agent_exits: { "3": 1 } }),
      expect.objectContaining({ status: "failed", tasks: 1, mean_reward: null, errors: { harness_missing: 1 } }),
    ]);
    const again = await rollgate(["submit", file, "--out", out, "--interval", "0.2"], env);
    expect(again.code).toBe(1);
    expect(again.stdout).toMatch(/completed\s*[|│]\s*1\s*[|│]\s*1\.000.*[|│]\s*–\s*[|│]\s*1 \(exit 3\)/);
    expect(again.stdout).toMatch(/failed\s*[|│]\s*1\s*[|│].*[|│]\s*harness_missing\s*[|│]/);
    expect(again.stdout).toContain(`results appended to ${out}`);
    // Both runs' results are in the file: the first run's lines were kept.
    const lines = readFileSync(out, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { id: string; status: string });
    expect(lines).toHaveLength(4);
    expect(new Set(lines.map((l) => l.id)).size).toBe(4);
    expect(lines.map((l) => l.status).sort()).toEqual(["completed", "completed", "failed", "failed"]);
  }, 120_000);

  it("tasks: lists tasks newest first, with status, group and since when; filters by status and group", async () => {
    const all = await rollgate(["tasks", "--limit", "100"], env);
    expect(all.code, all.stderr).toBe(0);
    expect(all.stdout).toMatch(/id\s*[|│]\s*status\s*[|│]\s*group\s*[|│]\s*since/);
    expect(all.stdout).toMatch(new RegExp(`${firstTask}\\s*[|│]\\s*completed\\s*[|│]\\s*–\\s*[|│]\\s*\\d+[smhd]`));
    expect(all.stdout).toMatch(/no-such-agent-binary|harness_missing/);
    const failed = JSON.parse((await rollgate(["tasks", "--status", "failed", "--json"], env)).stdout) as { id: string; status: string }[];
    expect(failed.length).toBe(2);
    expect(failed.every((t) => t.status === "failed")).toBe(true);
    const group = JSON.parse((await rollgate(["tasks", "--group", groupId, "--json"], env)).stdout) as { id: string; group_id: string }[];
    expect(group.map((t) => t.id).sort()).toEqual([0, 1, 2].map((k) => `${groupId}-${k}`));
    const none = await rollgate(["tasks", "--group", "no-such-group"], env);
    expect(none.stdout.trim()).toBe("no tasks (group no-such-group)");
    const bad = await rollgate(["tasks", "--status", "sleeping"], env);
    expect(bad.code).toBe(2);
  });

  it("task: human and --json", async () => {
    const human = await rollgate(["task", firstTask, "--logs"], env);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toMatch(/status\s+completed/);
    expect(human.stdout).toMatch(/reward\s+1\.000/);
    expect(human.stdout).toContain("── agent output ──");
    expect(human.stdout).toContain("first");
    const json = await rollgate(["task", firstTask, "--json"], env);
    expect(JSON.parse(json.stdout).result.reward).toBe(1);
  });

  it("task --logs: an agent's terminal escape sequences are shown, not played on the operator's terminal", async () => {
    // What a hostile agent prints to hide from (or act on) whoever reads its logs: erase the line
    // above, set the title, write the clipboard (OSC 52), redraw with a carriage return; its grader
    // prints one too. Only the agent's bytes can hold an ESC here: colours are off in a pipe.
    const evil = "printf 'before\\033[1A\\033[2K\\033]0;pwned\\007\\033]52;c;cm0gLXJmIH4=\\007\\rafter\\n'";
    const res = await fetch(`${cluster.url}/v1/tasks`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
      body: JSON.stringify({
        instruction: "print",
        agent: { harness: "command", command: ["bash", "-c", evil] },
        evaluator: { kind: "command", command: ["bash", "-c", `${evil}; echo 1`], reward: "last_line_float" },
        limits: { timeout_s: 60 },
      }),
    });
    expect(res.status).toBe(202);
    const { id } = (await res.json()) as { id: string };
    await poll(async () => (await rollgate(["task", id, "--json"], env)).stdout, (o) => JSON.parse(o).result !== null, 60_000, 300);
    const human = await rollgate(["task", id, "--logs"], env);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toContain("before");
    expect(human.stdout).toContain("after");
    expect(human.stdout).toContain("\u241b]52;c;cm0gLXJmIH4=");
    expect(human.stdout).not.toMatch(/[\x00-\x08\x0b-\x1f\x7f]/); // eslint-disable-line no-control-regex
  });

  it("watch: a task's events, and a whole group as NDJSON", async () => {
    const one = await rollgate(["watch", firstTask], env);
    expect(one.code, one.stderr).toBe(0);
    expect(one.stdout).toMatch(/started on /);
    expect(one.stdout).toMatch(/llm_call #0: prompt \d+/);
    expect(one.stdout).toMatch(/ended completed · reward 1\.000/);
    const group = await rollgate(["watch", groupId, "--json"], env);
    expect(group.code, group.stderr).toBe(0);
    const events = group.stdout.trim().split("\n").map((l) => JSON.parse(l));
    expect(events.filter((e) => e.type === "terminal").map((e) => e.task_id).sort()).toEqual([0, 1, 2].map((k) => `${groupId}-${k}`));
    const human = await rollgate(["watch", groupId], env);
    expect(human.stdout).toMatch(/3\/3 completed · mean reward 1\.000/);
  });

  it("trajectory: masks, --decode with masked text in brackets, and every trainer format", async () => {
    const ids = await rollgate(["trajectory", firstTask], env);
    expect(ids.code, ids.stderr).toBe(0);
    expect(ids.stdout).toMatch(/1 trace\(s\) from 2 record\(s\)/);
    expect(ids.stdout).toMatch(/\[\d+\]/); // masked ids in brackets
    const decoded = await rollgate(["trajectory", firstTask, "--decode", "--no-prompt"], env);
    expect(decoded.code, decoded.stderr).toBe(0);
    // Trainable text as is, masked text (the tool result, template glue) in [[…]].
    expect(decoded.stdout).toContain('<tool_call>\n{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}\n</tool_call><|im_end|>[[');
    expect(decoded.stdout).toMatch(/\[\[\n<\|im_start\|>user\n<tool_response>[\s\S]*?<\|im_start\|>assistant\n\]\]first<\|im_end\|>/);
    const dj = JSON.parse((await rollgate(["trajectory", firstTask, "--decode", "--json"], env)).stdout);
    expect(dj.traces[0].segments.filter((s: { trainable: boolean }) => s.trainable).map((s: { text: string }) => s.text).join("")).toContain("first<|im_end|>");
    const verl = JSON.parse((await rollgate(["trajectory", firstTask, "--format", "verl"], env)).stdout);
    expect(Object.keys(verl[0]).sort()).toEqual(["prompts", "response_mask", "responses", "rollout_log_probs"]);
    const slime = JSON.parse((await rollgate(["trajectory", firstTask, "-f", "slime"], env)).stdout);
    expect(slime[0].response_length).toBe(verl[0].responses.length);
    const prime = JSON.parse((await rollgate(["trajectory", firstTask, "--format", "prime-rl"], env)).stdout);
    expect(prime[0].completion_mask).toEqual(verl[0].response_mask);
    const raw = JSON.parse((await rollgate(["trajectory", firstTask, "--json"], env)).stdout);
    expect(raw.traces[0].loss_mask).toEqual(verl[0].response_mask);
  });

  it("trajectory <group id>: every task of the group, like watch <group id>", async () => {
    const human = await rollgate(["trajectory", groupId], env);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toContain(`group ${groupId}: 3 task(s)`);
    for (const k of [0, 1, 2]) expect(human.stdout).toMatch(new RegExp(`══ task ${groupId}-${k} · completed · reward 1\\.000 ══\\nsession s-`));
    expect(human.stdout.match(/1 trace\(s\) from 2 record\(s\)/g)).toHaveLength(3);
    const json = JSON.parse((await rollgate(["trajectory", groupId, "--json"], env)).stdout);
    expect(json.group_id).toBe(groupId);
    expect(json.tasks.map((t: { task_id: string }) => t.task_id)).toEqual([0, 1, 2].map((k) => `${groupId}-${k}`));
    expect(json.tasks.every((t: { trajectory: { traces: unknown[] } }) => t.trajectory.traces.length === 1)).toBe(true);
    const verl = JSON.parse((await rollgate(["trajectory", groupId, "--format", "verl"], env)).stdout);
    expect(verl.tasks).toHaveLength(3);
    expect(Object.keys(verl.tasks[0].samples[0]).sort()).toEqual(["prompts", "response_mask", "responses", "rollout_log_probs"]);
    const missing = await rollgate(["trajectory", "no-such-thing"], env);
    expect(missing.code).toBe(4);
    expect(missing.stderr).toContain("no task, session or group no-such-thing");
  });

  it("trajectory <group id>: a member whose trajectory cannot be read is named, and the others are still exported", async () => {
    // The trainer dropped one member's session (a 404 for it, as a member with an invalid trajectory gets a 422).
    const member = `${groupId}-1`;
    const task = JSON.parse((await rollgate(["task", member, "--json"], env)).stdout) as { session_id: string };
    const drop = await fetch(`${cluster.url}/v1/sessions/${task.session_id}`, { method: "DELETE", headers: { authorization: `Bearer ${apiKey}` } });
    expect(drop.status).toBe(204);
    const verl = await rollgate(["trajectory", groupId, "--format", "verl"], env);
    expect(verl.code).toBe(4);
    expect(verl.stderr).toContain(`task ${member}: 404 not_found`);
    const out = JSON.parse(verl.stdout) as { tasks: { task_id: string; samples: unknown[] | null; error: unknown; trajectory_error?: { status: number; type: string } }[] };
    expect(out.tasks.map((t) => t.task_id)).toEqual([0, 1, 2].map((k) => `${groupId}-${k}`));
    expect(out.tasks[1]).toMatchObject({ samples: null, error: null, trajectory_error: { status: 404, type: "not_found" } });
    for (const k of [0, 2]) expect(out.tasks[k]!.samples).toHaveLength(1);
    const human = await rollgate(["trajectory", groupId], env);
    expect(human.code).toBe(4);
    expect(human.stdout.match(/1 trace\(s\) from 2 record\(s\)/g)).toHaveLength(2);
    expect(human.stdout).toMatch(new RegExp(`══ task ${member} · completed · reward 1\\.000 ══\\n  cannot read its trajectory: 404 not_found`));
  });

  it("trajectory of a task that was not scored: its samples, and a warning that they are not a scored rollout's", async () => {
    // The agent runs and calls the model; the evaluator prints no number, so the task fails unscored.
    const file = path.join(dir, "unscored.json");
    writeFileSync(file, JSON.stringify(quick("unscored", { evaluator: { kind: "command", command: ["bash", "-c", "echo no number"], reward: "last_line_float" } })));
    const run = await rollgate(["submit", file, "--json", "--out", path.join(dir, "unscored.results.jsonl")], env);
    const id = (JSON.parse(run.stdout) as { task_ids: string[] }).task_ids[0]!;
    const verl = await rollgate(["trajectory", id, "--format", "verl"], env);
    expect(verl.code, verl.stderr).toBe(0);
    expect(JSON.parse(verl.stdout)).toHaveLength(1);
    expect(verl.stderr).toContain(`warning: task ${id} ended failed (evaluator_error:`);
    expect(verl.stderr).toContain("not a scored rollout's");
    const scored = await rollgate(["trajectory", firstTask, "--format", "verl"], env);
    expect(scored.stderr).toBe("");
  });

  it("pause / resume / weights reach the admin API (or say clearly that this gateway lacks it)", async () => {
    for (const args of [["weights", "step-7"], ["pause"], ["resume"]]) {
      const run = await rollgate([...args, "--json"], env);
      if (run.code === 0) {
        expect(() => JSON.parse(run.stdout)).not.toThrow();
      } else {
        expect(run.code, `${args.join(" ")}: ${run.stderr}`).toBe(4);
        expect(run.stderr).toMatch(/404 not_found: .*no POST \/admin\//);
      }
    }
  });

  it("fails clearly, with distinct non-zero exit codes", async () => {
    const unreachable = await rollgate(["task", "t-1", "--url", "http://127.0.0.1:9"]);
    expect(unreachable.code).toBe(3);
    expect(unreachable.stderr).toContain("cannot reach the rollgate gateway at http://127.0.0.1:9");
    expect(unreachable.stderr).toContain("rollgate up");

    const missing = await rollgate(["task", "no-such-task"], env);
    expect(missing.code).toBe(4);
    expect(missing.stderr).toContain("404 not_found: no task no-such-task");
    const missingJson = await rollgate(["task", "no-such-task", "--json"], env);
    expect(JSON.parse(missingJson.stdout)).toEqual({ error: { type: "not_found", message: "no task no-such-task" } });

    const noKey = await rollgate(["task", firstTask], { ROLLGATE_URL: cluster.url });
    expect(noKey.code).toBe(4);
    expect(noKey.stderr).toContain("401 unauthorized");
    expect(noKey.stderr).toContain("ROLLGATE_API_KEY");

    const bad = path.join(dir, "bad.jsonl");
    writeFileSync(bad, '{"instruction": "x"}\nnot json\n');
    const invalid = await rollgate(["submit", bad], env);
    expect(invalid.code).toBe(2);
    expect(invalid.stderr).toContain("line 1: agent:");
    expect(invalid.stderr).toContain("line 2: not JSON");

    const rejected = await rollgate(["submit", path.join(dir, "tasks.jsonl"), "--url", cluster.url, "--api-key", "wrong"]);
    expect(rejected.code).toBe(4);

    const usageMistakes = [["frobnicate"], ["submit"], ["task", "a", "b"], ["trajectory", "x", "--format", "nope"], ["watch", "x", "--bogus"], ["trajectory", "x", "--decode", "--format", "verl"], ["weights", "v1", "--lora", "x"]];
    for (const args of usageMistakes) {
      const r = await rollgate(args, env);
      expect(r.code, args.join(" ")).toBe(2);
      expect(r.stderr).toMatch(/rollgate: .*\n {2}See: rollgate /);
      // --json: the error on stdout as JSON too, whichever check found it.
      const j = await rollgate([...args, "--json"], env);
      expect(j.code, args.join(" ")).toBe(2);
      expect(JSON.parse(j.stdout), args.join(" ")).toMatchObject({ error: { type: "usage" } });
    }
  });

  it("submit: a gateway lost mid-submission says which tasks were submitted and which lines were not (human and --json)", async () => {
    const file = path.join(dir, "partial.jsonl");
    writeFileSync(file, [quick("p1"), quick("p2"), quick("p3")].map((t) => JSON.stringify(t)).join("\n"));
    for (const json of [false, true]) {
      // The gateway goes away after the second batch: the third never reaches it.
      const proxy = await startOutageProxy(cluster.url, { downAfter: { request: "POST /v1/tasks/batch", after: 2 } });
      try {
        const run = await rollgate(["submit", file, "--chunk", "1", "--no-wait", ...(json ? ["--json"] : [])], { ...env, ROLLGATE_URL: proxy.url });
        expect(run.code, run.stderr).toBe(3);
        expect(run.stderr).toContain(`partial submission: 2 of 3 task line(s) of ${file} were submitted (2 task(s)); line 3 were not`);
        if (json) {
          const out = JSON.parse(run.stdout) as { error: { type: string; details: { partial_submission: { task_ids: string[]; not_submitted_lines: number[] } } } };
          expect(out.error.type).toBe("unreachable");
          expect(out.error.details.partial_submission.not_submitted_lines).toEqual([3]);
          const submitted = out.error.details.partial_submission.task_ids;
          expect(submitted).toHaveLength(2);
          // They are real tasks on the cluster.
          for (const id of submitted) expect((await rollgate(["task", id, "--json"], env)).code).not.toBe(4);
        }
      } finally {
        await proxy.close();
      }
    }
  });

  it("submit: Ctrl-C while submitting stops after the request in flight and says what was and was not submitted", async () => {
    const file = path.join(dir, "interrupted.jsonl");
    const tag = `int-${prefix.slice(-8)}`;
    const task = { instruction: "x", agent: { harness: "command", command: ["true"] }, evaluator: { kind: "none" }, metadata: { tag } };
    writeFileSync(file, Array.from({ length: 300 }, () => JSON.stringify(task)).join("\n"));
    const proc = spawn(process.execPath, [BIN, "submit", file, "--chunk", "1", "--json"], { cwd: dir, env: { ...process.env, NO_COLOR: "", ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    proc.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    proc.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
    // Interrupted once the gateway has some of them.
    const client = new RollgateClient({ baseUrl: cluster.url, apiKey });
    await poll(
      async () => (await client.listTasksPage({ limit: 1000 })).tasks.filter((t) => (t.task.metadata as { tag?: string }).tag === tag).length,
      (n) => n > 0,
      30_000,
      20,
    );
    proc.kill("SIGINT");
    expect(await exited, stderr).toBe(130);
    const out = JSON.parse(stdout) as { interrupted: boolean; submitted: number; task_ids: string[]; not_submitted_lines: number[] };
    expect(out.interrupted).toBe(true);
    expect(out.submitted).toBeGreaterThan(0);
    expect(out.submitted + out.not_submitted_lines.length).toBe(300);
    expect(out.not_submitted_lines[0]).toBe(out.submitted + 1);
    expect(stderr).toContain(`interrupted: ${out.submitted} of 300 task line(s) of ${file} were submitted`);
    const onCluster = (await client.listTasksPage({ limit: 1000 })).tasks.filter((t) => (t.task.metadata as { tag?: string }).tag === tag).map((t) => t.id);
    expect(onCluster.sort()).toEqual([...out.task_ids].sort());
  });

  it("submit: follows through a gateway outage, saying so, and stops following a task the gateway no longer has (no endless wait)", async () => {
    const sleeper = (id: string, s: number) => ({ id, instruction: "x", agent: { harness: "command", command: ["bash", "-c", `sleep ${s}`] }, evaluator: { kind: "none" }, limits: { timeout_s: 60 } });
    const tag = prefix.slice(-8);
    // An outage while the tasks run: the follow rides it out and says so.
    const file = path.join(dir, "outage.jsonl");
    writeFileSync(file, JSON.stringify(sleeper(`cli-out-${tag}`, 4)));
    const proxy = await startOutageProxy(cluster.url);
    try {
      const run = rollgate(["submit", file, "--interval", "0.2", "--progress-every", "0.5"], { ...env, ROLLGATE_URL: proxy.url });
      const client = new RollgateClient({ baseUrl: cluster.url, apiKey });
      await poll(async () => (await client.getTask(`cli-out-${tag}`).catch(() => null))?.status, (st) => st === "running", 20_000, 50);
      proxy.down();
      await new Promise((r) => setTimeout(r, 2_000));
      proxy.up();
      const done = await run;
      expect(done.code, done.stderr).toBe(0);
      expect(done.stderr).toContain("warning: the gateway is not answering");
      expect(done.stderr).toContain("the gateway answers again");
    } finally {
      await proxy.close();
    }

    // A task whose record is gone (expired, the store emptied) answers 404 on every poll.
    const goneId = `cli-gone-${tag}`;
    const goneFile = path.join(dir, "gone.jsonl");
    writeFileSync(goneFile, JSON.stringify(sleeper(goneId, 20)));
    const run = rollgate(["submit", goneFile, "--interval", "0.2", "--json"], env, 30_000);
    const client = new RollgateClient({ baseUrl: cluster.url, apiKey });
    await poll(async () => (await client.getTask(goneId).catch(() => null))?.status, (st) => st === "running", 20_000, 50);
    const redis = new Redis(TEST_REDIS_URL);
    try {
      expect(await redis.del(`${prefix}:{t:${goneId}}:task`)).toBe(1);
    } finally {
      redis.disconnect();
    }
    const done = await run;
    expect(done.code, done.stderr).toBe(4);
    expect(done.stderr).toContain(`1 task(s) could not be followed: the gateway answered 404 not_found: no task ${goneId}`);
    expect((JSON.parse(done.stdout) as { not_followed: { id: string; status: number }[] }).not_followed).toEqual([expect.objectContaining({ id: goneId, status: 404 })]);
    await client.cancelTask(goneId).catch(() => undefined);
  }, 90_000);

  it("watch: rides out a gateway outage, saying so on stderr, and ends with the task", async () => {
    const id = `cli-watch-out-${prefix.slice(-8)}`;
    const file = path.join(dir, "watch-outage.jsonl");
    writeFileSync(file, JSON.stringify({ id, instruction: "x", agent: { harness: "command", command: ["bash", "-c", "sleep 4"] }, evaluator: { kind: "none" }, limits: { timeout_s: 60 } }));
    expect((await rollgate(["submit", file, "--no-wait"], env)).code).toBe(0);
    const proxy = await startOutageProxy(cluster.url);
    try {
      const run = rollgate(["watch", id], { ...env, ROLLGATE_URL: proxy.url });
      const client = new RollgateClient({ baseUrl: cluster.url, apiKey });
      await poll(async () => (await client.getTask(id)).status, (st) => st === "running", 20_000, 50);
      // The outage must come once the stream is open (a CLI that cannot reach the gateway at its start says so and exits 3).
      await poll(async () => proxy.seen(`GET /v1/tasks/${id}/events`), (n) => n > 0, 20_000, 50);
      await new Promise((r) => setTimeout(r, 300));
      proxy.down();
      await new Promise((r) => setTimeout(r, 2_000));
      proxy.up();
      const done = await run;
      expect(done.code, done.stderr).toBe(0);
      expect(done.stderr).toContain("warning: lost the gateway");
      expect(done.stderr).toMatch(/reconnected after /);
      expect(done.stdout).toContain("ended completed");
    } finally {
      await proxy.close();
    }
  }, 60_000);

  it("submit -n: two lines naming the same group are refused (the second would be answered with the first's tasks and never run)", async () => {
    const file = path.join(dir, "same-group.jsonl");
    const g = `g-same-${prefix.slice(-8)}`;
    writeFileSync(file, [quick("a", { group_id: g }), quick("b", { group_id: g })].map((t) => JSON.stringify(t)).join("\n"));
    const run = await rollgate(["submit", file, "-n", "2", "--no-wait"], env);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(`lines 1 and 2 are both group ${g}`);
    expect((await rollgate(["task", `${g}-0`], env)).code).toBe(4);
  });

  it("a URL where another web server answers is a gateway error (exit 4), in JSON too", async () => {
    const other = http.createServer((_req, res) => res.writeHead(200, { "content-type": "text/html" }).end("<html>welcome</html>"));
    await new Promise<void>((r) => other.listen(0, "127.0.0.1", r));
    try {
      const url = `http://127.0.0.1:${(other.address() as AddressInfo).port}`;
      for (const args of [["pause"], ["task", "t-1"]]) {
        const run = await rollgate([...args, "--json"], { ROLLGATE_URL: url });
        expect(run.code, args.join(" ")).toBe(4);
        expect(JSON.parse(run.stdout)).toMatchObject({ error: { type: "invalid_response" } });
      }
    } finally {
      await new Promise((r) => other.close(r));
    }
  });

  it("up: runs the all-in-one cluster, prints the ready line, stops on SIGINT", async () => {
    const upPrefix = uniquePrefix("cli-up");
    const proc = spawn(process.execPath, [BIN, "up", "--port", "0", "--dp", "1"], {
      env: { ...process.env, REDIS_URL: TEST_REDIS_URL, ROLLGATE_KEY_PREFIX: upPrefix, LOG_LEVEL: "warn", NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const lines: string[] = [];
    try {
      const url = await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`not ready:\n${lines.join("\n")}`)), 60_000);
        readline.createInterface({ input: proc.stdout! }).on("line", (l) => {
          lines.push(l);
          const m = /^rollgate ready: (\S+)/.exec(l);
          if (m) {
            clearTimeout(timer);
            resolve(m[1]!);
          }
        });
        proc.on("exit", (c) => reject(new Error(`exited ${c}`)));
      });
      expect((await fetch(`${url}/healthz`)).status).toBe(200);
      await new Promise((r) => setTimeout(r, 200));
      expect(lines.join("\n")).toContain(`dashboard  ${url}/dashboard`);
      // Each engine's preflight follows: engine-sim serves Qwen3 on vLLM.
      await poll(async () => lines.join("\n"), (t) => t.includes("abort pause:"), 30_000);
      const out = lines.join("\n");
      expect(out).toMatch(/engine 0 {3}vllm http:\/\/\S+ · profile qwen3 · vllm 0\.28\.0/);
      expect(out).toContain("vocabulary 151936");
      expect(out).toContain("✓ token-in via chat_kv_transfer_params (turns end with <|im_end|>)");
      expect(out).toMatch(/abort pause: keep \(vLLM 0\.28\.0 has \/pause\?mode=keep\)/);
    } finally {
      const code = await new Promise<number | null>((resolve) => {
        proc.on("exit", (c) => resolve(c));
        proc.kill("SIGINT");
      });
      expect(code).toBe(0);
      await dropPrefix(upPrefix);
    }
  }, 90_000);

  it("up: names an engine that does not answer, loudly, and says ready only once it does", async () => {
    const upPrefix = uniquePrefix("cli-up-wait");
    const port = await freePort();
    const engineUrl = `http://127.0.0.1:${port}`;
    const proc = spawn(process.execPath, [BIN, "up", "--port", "0", "--engines", JSON.stringify([{ kind: "vllm", url: engineUrl, dp_size: 1 }])], {
      env: { ...process.env, REDIS_URL: TEST_REDIS_URL, ROLLGATE_KEY_PREFIX: upPrefix, LOG_LEVEL: "warn", NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    proc.stderr.resume();
    const lines: string[] = [];
    readline.createInterface({ input: proc.stdout! }).on("line", (l) => lines.push(l));
    let engine: Awaited<ReturnType<typeof startApp>> | null = null;
    try {
      const warned = await poll(async () => lines.join("\n"), (t) => t.includes("NOT READY; tasks submitted now wait in the queue"), 60_000, 100);
      expect(warned).toContain(`WARNING: engine 0 (vllm ${engineUrl}) is NOT READY: no rank answers (rank 0: `);
      expect(warned).toMatch(/rollgate is up at http:\/\/127\.0\.0\.1:\d+ but NOT READY/);
      expect(warned).not.toContain("rollgate ready");
      engine = await startApp("engine-sim", ["--port", String(port)], {});
      const ready = await poll(async () => lines.join("\n"), (t) => /^rollgate ready: /m.test(t), 30_000, 100);
      expect(ready).toContain(`engine 0 (vllm ${engineUrl}): ready · model Qwen/Qwen3-8B · 1/1 rank(s) answer`);
      expect(ready).toMatch(/^rollgate ready: http:\/\/127\.0\.0\.1:\d+$/m);
    } finally {
      await new Promise<void>((resolve) => {
        if (proc.exitCode !== null) return resolve();
        proc.on("exit", () => resolve());
        proc.kill("SIGINT");
      });
      if (engine) await stopChild(engine.proc);
      await dropPrefix(upPrefix);
    }
  }, 120_000);

  // npm runs a script through a shell, and npx a bin through npm and a shell: a SIGTERM to the
  // launcher must still stop every process of the cluster (engine-sim, gateway, worker).
  for (const launcher of [
    { name: "npm start", argv: ["npm", "start"] },
    { name: "npx rollgate up", argv: ["npx", "rollgate", "up"] },
  ]) {
    it(`SIGTERM of \`${launcher.name}\` stops the whole cluster: no process is left`, async () => {
      const p = uniquePrefix("cli-sigterm");
      const proc = spawn(launcher.argv[0]!, launcher.argv.slice(1), {
        cwd: REPO_ROOT,
        env: { ...process.env, PORT: "0", REDIS_URL: TEST_REDIS_URL, ROLLGATE_KEY_PREFIX: p, LOG_LEVEL: "warn", NO_COLOR: "1", ROLLGATE_SIM_DP_SIZE: "1" },
        stdio: ["ignore", "pipe", "pipe"],
      });
      proc.stderr.resume();
      try {
        const url = await new Promise<string>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`${launcher.name} not ready`)), 60_000);
          readline.createInterface({ input: proc.stdout! }).on("line", (l) => {
            const m = /^rollgate ready: (\S+)/.exec(l);
            if (m) {
              clearTimeout(timer);
              resolve(m[1]!);
            }
          });
          proc.on("exit", (c) => reject(new Error(`${launcher.name} exited ${c}`)));
        });
        expect((await fetch(`${url}/readyz`)).status).toBe(200);
        const tree = descendants(proc.pid!);
        const apps = tree.filter((d) => /apps\/(engine-sim|gateway|worker|cluster)\/dist\/main\.js/.test(d.cmd));
        expect(apps.map((d) => d.cmd.match(/apps\/([a-z-]+)\//)![1]).sort()).toEqual(["cluster", "engine-sim", "gateway", "worker"]);
        proc.kill("SIGTERM");
        const left = await poll(async () => tree.filter((d) => alive(d.pid)), (l) => l.length === 0, 30_000, 200);
        expect(left.map((d) => `${d.pid} ${d.cmd}`)).toEqual([]);
      } finally {
        if (proc.exitCode === null) proc.kill("SIGKILL");
        await dropPrefix(p);
      }
    }, 90_000);
  }
});

/** Every process below `pid` (from /proc), with its command line. */
function descendants(pid: number): { pid: number; cmd: string }[] {
  const parents = new Map<number, number[]>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // The parent is the 4th field, after the command in parentheses (which may hold spaces).
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      parents.set(ppid, [...(parents.get(ppid) ?? []), Number(entry)]);
    } catch {
      // gone meanwhile
    }
  }
  const out: { pid: number; cmd: string }[] = [];
  const walk = (p: number) => {
    for (const child of parents.get(p) ?? []) {
      let cmd = "";
      try {
        cmd = readFileSync(`/proc/${child}/cmdline`, "utf8").replaceAll("\0", " ").trim();
      } catch {
        continue;
      }
      out.push({ pid: child, cmd });
      walk(child);
    }
  };
  walk(pid);
  return out;
}

function alive(pid: number): boolean {
  try {
    // A zombie (exited, not yet reaped by its parent) is gone for our purpose.
    return !/^\S+ \(.*\) Z /.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}
