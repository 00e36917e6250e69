/**
 * Replay-then-branch with real agent CLIs (docs/data-model.md#branches), unmodified, in sealed
 * bubblewrap sandboxes, against engine-sim. Claude Code (Anthropic Messages) and Gemini CLI (Gemini)
 * each make a 4-call rollout — three calls of their own shell tool that build a.txt, then an answer —
 * and are branched at call 2 with n = 4. Every branch's first two answers are the source's (the CLI
 * re-ran the same shell commands in its own fresh sandbox, so the evaluator sees the same file),
 * calls 2 and 3 are the engine's, the trajectories mask the replayed answers, and the group
 * callback carries the four rewards.
 *
 * What makes this work: every CLI writes its working directory (and HOME's folders) into its
 * prompts, and a bwrap sandbox's folders are at the same paths in every sandbox (/workspace,
 * /rollgate/home), so the branch's requests are the source's. Without bwrap the sandbox is a host
 * folder named after the task, and Claude Code's branch diverges at its first call. opencode's title
 * request is its session's call 0, so its calls are numbered one later. Codex shows a
 * per-run value in a tool result: its exec_command output starts with a random `Chunk ID`, so a
 * Codex rollout diverges at the call after its first command and can be branched only before it.
 */
import { createHmac, randomUUID } from "node:crypto";
import type { CompletionRecord, GroupResult, TaskRecord, Trajectory } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AGENT_CASES, caseProtocol, type AgentCase } from "../agents/cases.js";
import { requireAgentClis, startAgentStack, type AgentStack } from "../agents/stack.js";
import { apiClient } from "../support/http.js";
import { terminalTask } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

const byHarness = (h: string) => AGENT_CASES.find((c) => c.harness === h)!;
const CASES = [byHarness("claude-code"), byHarness("gemini-cli")];
const COMMANDS = ["echo one > a.txt", "echo two >> a.txt", "echo three >> a.txt"];

/** Four calls: the CLI's own shell tool three times, then the answer; the evaluator checks a.txt. */
function buildTask(c: AgentCase, id: string, isolation: "bwrap" | "none" = "bwrap") {
  const shell = (command: string) => ({ tool_calls: [{ name: c.shell.name, arguments: { [c.shell.arg]: command } }] });
  const steps = [...COMMANDS.map(shell), { text: "a.txt is built." }];
  return {
    id,
    instruction: `Build a.txt with your shell tool.\n#sim: ${JSON.stringify(steps)}`,
    agent: { harness: c.harness, ...(c.protocol ? { protocol: c.protocol } : {}) },
    // Sealed bubblewrap: the sandbox's folders are at fixed paths, the same in the source and every branch.
    runtime: isolation === "bwrap" ? { kind: "local" as const, isolation: "bwrap" as const } : { kind: "local" as const },
    evaluator: { kind: "file" as const, path: "a.txt", equals: "one\ntwo\nthree\n" },
    sampling: { max_tokens: 4096 },
    limits: { timeout_s: 300, max_llm_calls: 30 },
  };
}

const prefix = uniquePrefix("agent-branches");
let stack: AgentStack;
const api = apiClient(() => stack.fleet.url);

beforeAll(async () => {
  requireAgentClis();
  stack = await startAgentStack({ prefix });
}, 5 * 60_000);

afterAll(async () => {
  await stack?.stop();
  await dropPrefix(prefix);
}, 60_000);

const terminal = (id: string) => terminalTask(api, id, 10 * 60_000, 500);

async function records(sid: string): Promise<CompletionRecord[]> {
  return ((await api(`/v1/sessions/${sid}/completions`)).body as { completions: CompletionRecord[] }).completions;
}

const diag = (t: TaskRecord) => JSON.stringify({ status: t.result?.status, error: t.result?.error, agent: t.result?.agent }, null, 1);

describe.each(CASES.map((c) => [c.harness, c] as const))("%s", (_name, c) => {
  it("a 4-call rollout branched at call 2 with n = 4: the source's answers replayed, the same files, fresh calls 2-3, masks, the group callback", async () => {
    const sourceId = `t-branch-${c.harness}-${randomUUID().slice(0, 8)}`;
    expect((await api("/v1/tasks", { body: buildTask(c, sourceId) })).status).toBe(202);
    const source = await terminal(sourceId);
    expect(source.result, diag(source)).toMatchObject({ status: "completed", reward: 1 });
    const sourceRecords = await records(source.session_id!);
    expect(sourceRecords.map((r) => r.protocol)).toEqual(Array(4).fill(caseProtocol(c)));
    // The CLI's own shell tool ran the three commands, one per call, then it answered.
    expect(sourceRecords.map((r) => r.message.tool_calls.map((t) => JSON.parse(t.function.arguments)[c.shell.arg]))).toEqual([...COMMANDS.map((x) => [x]), []]);

    const trainer = await startTrainer();
    const secret = `branch-${randomUUID()}`;
    try {
      const res = await api(`/v1/tasks/${sourceId}/branches`, { body: { at_call: 2, n: 4, callback: { url: trainer.url, secret } } });
      expect(res.status, JSON.stringify(res.body)).toBe(202);
      const { group_id, task_ids } = res.body as { group_id: string; task_ids: string[] };
      expect(task_ids).toHaveLength(4);
      for (const id of task_ids) {
        const t = await terminal(id);
        // The evaluator saw the file the replayed commands and the fresh one built in this branch's own sandbox.
        expect(t.result, diag(t)).toMatchObject({ status: "completed", reward: 1 });
        const rs = await records(t.session_id!);
        expect(rs.map((r) => r.replayed_from ?? null)).toEqual([sourceRecords[0]!.id, sourceRecords[1]!.id, null, null]);
        // The first two answers are the source's: content, tool calls with their ids, tokens and logprobs.
        for (const k of [0, 1]) {
          expect({ ...rs[k]!.message }).toEqual(sourceRecords[k]!.message);
          expect(rs[k]!.output_ids).toEqual(sourceRecords[k]!.output_ids);
          expect(rs[k]!.prompt_ids).toEqual(sourceRecords[k]!.prompt_ids);
        }
        // Calls 2 and 3 are the engine's: the CLI asked for them after re-running the replayed commands.
        expect(rs[2]!.message.tool_calls.map((t) => JSON.parse(t.function.arguments)[c.shell.arg])).toEqual([COMMANDS[2]]);
        expect(rs[3]!.message.content).toBe("a.txt is built.");
        const traj = t.result!.trajectory as Trajectory;
        expect(traj.traces).toHaveLength(1);
        const spans = traj.stats.per_trace[0]!.spans;
        expect(spans.map((s) => s.record_id)).toEqual(rs.map((r) => r.id));
        const mask = traj.traces[0]!.loss_mask;
        const trained = (k: number) => mask.slice(spans[k]!.output_start, spans[k]!.end);
        expect([0, 1].every((k) => trained(k).every((m) => m === 0))).toBe(true);
        expect([2, 3].every((k) => trained(k).length > 0 && trained(k).every((m) => m === 1))).toBe(true);
      }
      const [delivery] = await trainer.waitFor(1);
      expect(delivery!.headers["x-rollgate-event"]).toBe("group.completed");
      expect(String(delivery!.headers["x-rollgate-signature"] ?? "")).toContain(createHmac("sha256", secret).update(delivery!.rawBody).digest("hex"));
      const body = JSON.parse(delivery!.rawBody) as GroupResult;
      expect(body.group_id).toBe(group_id);
      expect(body.branch).toEqual({
        task_id: sourceId,
        at_call: 2,
        shared_prefix_ids: sourceRecords[1]!.prompt_ids.concat(sourceRecords[1]!.output_ids),
        rewards: [1, 1, 1, 1],
      });
    } finally {
      await trainer.close();
    }
  });
});

/** A source rollout of `c` that completed with reward 1 in four calls, and its records. */
async function completedSource(c: AgentCase, isolation: "bwrap" | "none" = "bwrap") {
  const id = `t-branch-${c.harness}-${randomUUID().slice(0, 8)}`;
  expect((await api("/v1/tasks", { body: buildTask(c, id, isolation) })).status).toBe(202);
  const source = await terminal(id);
  expect(source.result, diag(source)).toMatchObject({ status: "completed", reward: 1 });
  const rs = await records(source.session_id!);
  expect(rs).toHaveLength(4);
  return { id, records: rs };
}

async function branchOnce(sourceId: string, atCall: number): Promise<TaskRecord> {
  const res = await api(`/v1/tasks/${sourceId}/branches`, { body: { at_call: atCall, n: 1 } });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  return terminal((res.body as { task_ids: string[] }).task_ids[0]!);
}

describe("opencode", () => {
  it("its title request (no tools) goes beside its first step: branched at call 3, the title and the first two commands are replayed, in whichever order they arrive", async () => {
    const c = byHarness("opencode");
    const id = `t-branch-opencode-${randomUUID().slice(0, 8)}`;
    expect((await api("/v1/tasks", { body: buildTask(c, id) })).status).toBe(202);
    const source = await terminal(id);
    expect(source.result, diag(source)).toMatchObject({ status: "completed", reward: 1 });
    const sourceRecords = await records(source.session_id!);
    // The title request and the first step are sent together: either may take call 0.
    const withTools = sourceRecords.map((r) => (r.request.tools ?? []).length > 0);
    expect(withTools.slice(0, 2).sort()).toEqual([false, true]);
    expect(withTools.slice(2)).toEqual([true, true, true]);
    const res = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 3, n: 2 } });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    for (const bid of (res.body as { task_ids: string[] }).task_ids) {
      const t = await terminal(bid);
      expect(t.result, diag(t)).toMatchObject({ status: "completed", reward: 1 });
      const replayed = (await records(t.session_id!)).map((r) => r.replayed_from ?? null);
      expect(replayed.slice(0, 3).sort()).toEqual(sourceRecords.slice(0, 3).map((r) => r.id).sort());
      expect(replayed.slice(3)).toEqual([null, null]);
    }
  });
});

describe("what keeps a CLI's requests from being replayed", () => {
  it("claude-code without bwrap: its prompt holds the sandbox's host folder (named after the task), so the branch diverges at call 0", async () => {
    const c = byHarness("claude-code");
    const source = await completedSource(c, "none");
    const t = await branchOnce(source.id, 2);
    expect(t.result).toMatchObject({ status: "failed", reward: null, error: { kind: "replay_diverged", call: 0 } });
    expect(t.result!.error!.message).toMatch(/^call 0: message \d+ differs/);
  });

  it("codex: its exec_command results start with a random Chunk ID, so a branch diverges at the call after the first command, and branches before it", async () => {
    const c = byHarness("codex");
    const source = await completedSource(c);
    const chunk = (r: CompletionRecord) => r.request.messages.filter((m) => m.role === "tool").map((m) => /Chunk ID: (\w+)/.exec(JSON.stringify(m.content))?.[1]);
    expect(chunk(source.records[1]!)).toHaveLength(1);

    const diverged = await branchOnce(source.id, 2);
    expect(diverged.result).toMatchObject({ status: "failed", reward: null, error: { kind: "replay_diverged", call: 1 } });
    expect(diverged.result!.error!.message).toMatch(/^call 1: message \d+ differs: recorded .*Chunk ID: \w+.*, asked .*Chunk ID: \w+/);

    // At call 1 only the first answer is replayed (its request holds no tool result yet): the rest is sampled.
    const early = await branchOnce(source.id, 1);
    expect(early.result, diag(early)).toMatchObject({ status: "completed", reward: 1 });
    const rs = await records(early.session_id!);
    expect(rs.map((r) => r.replayed_from ?? null)).toEqual([source.records[0]!.id, null, null, null]);
  });
});
