/**
 * Replay-then-branch end to end, with real processes on real Redis (engine-sim, a gateway, a
 * worker running the example agent in fresh sandboxes): a 4-call rollout, then
 * `POST /v1/tasks/:id/branches` at call 2 with n = 4. Each branch's first two answers are the
 * source's (its agent re-ran the same shell commands in its own sandbox, so the evaluator sees the
 * same files), calls 2 and 3 went to the engine, the trajectories mask the replayed answers, and the
 * group callback carries the four rewards and the shared prefix once. A branch of a branch works;
 * a rollout whose sandbox answers differently before the branch point ends `replay_diverged`.
 */
import { spawnSync } from "node:child_process";
import { createHmac } from "node:crypto";
import path from "node:path";
import type { StartedChild } from "@rollgate/testkit";
import { RollgateClient } from "@rollgate/client";
import type { CompletionRecord, GroupResult, TaskEvent, Trajectory } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { REPO_ROOT } from "../support/cluster.js";
import { apiClient } from "../support/http.js";
import { terminalTask } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

const shell = (command: string) => ({ tool_calls: [{ name: "shell", arguments: { command } }] });
/** Four calls: three shell commands that build a.txt, then the answer; the evaluator checks a.txt. */
const buildTask = (first = "echo one > a.txt") => ({
  instruction: `Build a.txt.\n#sim: ${JSON.stringify([shell(first), shell("echo two >> a.txt"), shell("echo three >> a.txt"), { text: "done" }])}`,
  agent: { harness: "command", command: ["rollgate-example-agent"] },
  evaluator: { kind: "command", command: ["bash", "-c", 'test "$(tr "\\n" " " < a.txt)" = "one two three "'] },
  limits: { timeout_s: 60 },
});

describe("branching a recorded rollout", () => {
  let engine: StartedChild;
  let gateway: StartedChild;
  let worker: StartedChild;
  let prefix: string;
  let api: ReturnType<typeof apiClient>;
  const terminal = (id: string) => terminalTask(api, id);
  const records = async (sid: string) => ((await api(`/v1/sessions/${sid}/completions`)).body as { completions: CompletionRecord[] }).completions;

  beforeAll(async () => {
    prefix = uniquePrefix("branches");
    engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
    gateway = await startApp("gateway", ["--port", "0"], { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]) });
    worker = await startApp("worker", [], {
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_GATEWAY_URL: gateway.ready,
      ROLLGATE_WORKER_NAME: "w-branches",
      ROLLGATE_WORKER_CONCURRENCY: "4",
      ROLLGATE_CALLBACK_BACKOFF_MS: "100",
    });
    api = apiClient(() => gateway.ready);
  }, 60_000);
  afterAll(async () => {
    await stopChild(worker?.proc, 5_000);
    await stopChild(gateway?.proc, 5_000);
    await stopChild(engine?.proc);
    await dropPrefix(prefix);
  });

  it("n = 4 branches at call 2: replayed answers, the same sandbox state, fresh samples after, masks and the group callback", async () => {
    const { id: sourceId } = (await api("/v1/tasks", { body: buildTask() })).body as { id: string };
    const source = await terminal(sourceId);
    expect(source.result).toMatchObject({ status: "completed", reward: 1 });
    const sourceRecords = await records(source.session_id!);
    expect(sourceRecords).toHaveLength(4);

    const trainer = await startTrainer();
    const secret = "branch-secret";
    try {
      const res = await api(`/v1/tasks/${sourceId}/branches`, { body: { at_call: 2, n: 4, callback: { url: trainer.url, secret } } });
      expect(res.status).toBe(202);
      const { group_id, task_ids } = res.body as { group_id: string; task_ids: string[] };
      expect(task_ids).toEqual([0, 1, 2, 3].map((k) => `${group_id}-${k}`));
      for (const id of task_ids) {
        const t = await terminal(id);
        // The evaluator saw the files the replayed commands made in this branch's own sandbox.
        expect(t.result).toMatchObject({ status: "completed", reward: 1 });
        expect(t.task.branch).toEqual({ task_id: sourceId, session_id: source.session_id, at_call: 2, train_replayed: false });
        const rs = await records(t.session_id!);
        expect(rs.map((r) => r.replayed_from ?? null)).toEqual([sourceRecords[0]!.id, sourceRecords[1]!.id, null, null]);
        for (const k of [0, 1]) expect({ ...rs[k]!.message }).toEqual(sourceRecords[k]!.message);
        const traj = t.result!.trajectory as Trajectory;
        const spans = traj.stats.per_trace[0]!.spans;
        const mask = traj.traces[0]!.loss_mask;
        const trained = (k: number) => mask.slice(spans[k]!.output_start, spans[k]!.end);
        expect([0, 1].every((k) => trained(k).every((m) => m === 0))).toBe(true);
        expect([2, 3].every((k) => trained(k).every((m) => m === 1))).toBe(true);
      }
      const [delivery] = await trainer.waitFor(1);
      expect(delivery!.headers["x-rollgate-event"]).toBe("group.completed");
      const signature = String(delivery!.headers["x-rollgate-signature"] ?? "");
      expect(signature).toContain(createHmac("sha256", secret).update(delivery!.rawBody).digest("hex"));
      const body = JSON.parse(delivery!.rawBody) as GroupResult;
      expect(body.group_id).toBe(group_id);
      expect(body.branch).toEqual({
        task_id: sourceId,
        at_call: 2,
        shared_prefix_ids: sourceRecords[1]!.prompt_ids.concat(sourceRecords[1]!.output_ids),
        rewards: [1, 1, 1, 1],
      });
      expect(body.summary).toMatchObject({ size: 4, scored: 4 });

      // A branch of a branch, through the TS client: replayed through three calls of the first branch's own records.
      const again = await new RollgateClient({ baseUrl: gateway.ready }).branch(task_ids[0]!, { at_call: 3, n: 1 });
      const leaf = await terminal(again.task_ids[0]!);
      expect(leaf.result).toMatchObject({ status: "completed", reward: 1 });
      expect((await records(leaf.session_id!)).map((r) => r.replayed_from != null)).toEqual([true, true, true, false]);
      // Its task events say which calls were answered from records: their tokens are not the engine's work.
      const calls: TaskEvent[] = [];
      for await (const e of new RollgateClient({ baseUrl: gateway.ready }).streamEvents(leaf.id)) if (e.type === "llm_call") calls.push(e);
      expect(calls.map((e) => e.data.replayed ?? false)).toEqual([true, true, true, false]);
    } finally {
      await trainer.close();
    }
  }, 240_000);

  it("a rollout whose sandbox answers differently before the branch point ends replay_diverged, naming the call", async () => {
    // The first command's output differs on every run: the branch's second call cannot be the recorded one.
    const { id } = (await api("/v1/tasks", { body: buildTask("date +%s%N; echo one > a.txt") })).body as { id: string };
    expect((await terminal(id)).result).toMatchObject({ status: "completed", reward: 1 });
    const { task_ids } = (await api(`/v1/tasks/${id}/branches`, { body: { at_call: 2, n: 1 } })).body as { task_ids: string[] };
    const t = await terminal(task_ids[0]!);
    expect(t.result).toMatchObject({ status: "failed", reward: null, error: { kind: "replay_diverged", call: 1 } });
    expect(t.result!.error!.message).toMatch(/^call 1: message \d+ differs/);
  }, 120_000);

  it("a diverged branch of a task without an evaluator ends replay_diverged too, with no evaluating event", async () => {
    // Nothing to hold back before the session closes: the worker reads the divergence from the closed session.
    const { id } = (await api("/v1/tasks", { body: { ...buildTask("date +%s%N; echo one > a.txt"), evaluator: null } })).body as { id: string };
    expect((await terminal(id)).result).toMatchObject({ status: "completed", reward: null, error: null });
    const { task_ids } = (await api(`/v1/tasks/${id}/branches`, { body: { at_call: 2, n: 1 } })).body as { task_ids: string[] };
    const t = await terminal(task_ids[0]!);
    expect(t.result).toMatchObject({ status: "failed", reward: null, error: { kind: "replay_diverged", call: 1 } });
    // The event stream (SSE, ended by `terminal`) as its lifecycle's types.
    const eventTypes = async (taskId: string) =>
      [...((await api(`/v1/tasks/${taskId}/events`)).body as string).matchAll(/^event: (\S+)$/gm)].map((m) => m[1]).filter((t) => t !== "llm_call");
    expect(await eventTypes(task_ids[0]!)).toEqual(["queued", "started", "terminal"]);
    expect(await eventTypes(id)).toEqual(["queued", "started", "evaluating", "terminal"]);
  }, 120_000);

  it("refuses a branch point the rollout never reached, and a task that has not ended", async () => {
    const { id } = (await api("/v1/tasks", { body: buildTask() })).body as { id: string };
    const early = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 1, n: 2 } });
    if (early.status !== 202) expect(early.body).toMatchObject({ error: { type: "conflict" } });
    await terminal(id);
    const far = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 9, n: 2 } });
    expect(far.status).toBe(409);
    expect(JSON.stringify(far.body)).toMatch(/made 4 LLM calls/);
    // At its last call a branch replays every call and samples nothing: accepted (the cheapest
    // replay-and-mask check), and the answer says so.
    const whole = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 4, n: 1 } });
    expect(whole.status).toBe(202);
    expect(whole.body).toMatchObject({ whole_rollout: true });
    const copy = await terminal((whole.body as { task_ids: string[] }).task_ids[0]!);
    expect(copy.result).toMatchObject({ status: "completed", reward: 1 });
    expect((copy.result!.trajectory as Trajectory).stats.trainable_tokens).toBe(0);
    expect((await api(`/v1/tasks/nope/branches`, { body: { at_call: 1, n: 1 } })).status).toBe(404);
    expect((await api(`/v1/tasks/${id}/branches`, { body: { at_call: 0, n: 1 } })).status).toBe(400);

    // The CLI, as a user runs it.
    const cli = (...args: string[]) =>
      spawnSync(process.execPath, [path.join(REPO_ROOT, "apps/cli/dist/main.js"), ...args], { env: { ...process.env, NO_COLOR: "1", ROLLGATE_URL: gateway.ready, ROLLGATE_API_KEY: "" }, encoding: "utf8" });
    const made = cli("branch", id, "--at", "1", "-n", "2", "--json");
    expect(made.status).toBe(0);
    const { group_id, task_ids } = JSON.parse(made.stdout) as { group_id: string; task_ids: string[] };
    expect(task_ids).toEqual([`${group_id}-0`, `${group_id}-1`]);
    expect(JSON.parse(made.stdout)).toMatchObject({ whole_rollout: false });
    for (const t of task_ids) expect((await terminal(t)).result).toMatchObject({ status: "completed", reward: 1 });
    const usage = cli("branch", id);
    expect(usage.status).toBe(2);
    expect(usage.stderr).toMatch(/--at <call> is required/);
    const refused = cli("branch", id, "--at", "9");
    expect(refused.status).not.toBe(0);
    expect(refused.stderr).toMatch(/made 4 LLM calls/);

    // A group id names one branch request: sent again it is the same group (a retry), used for
    // another branch point or group it is refused, not merged into a group callback about other runs.
    const groupId = `g-${Date.now()}`;
    const once = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 1, n: 2, group_id: groupId } });
    expect(once.status).toBe(202);
    const again = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 1, n: 2, group_id: groupId } });
    expect(again).toMatchObject({ status: 202, body: once.body });
    const elsewhere = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 2, n: 2, group_id: groupId } });
    expect(elsewhere.status).toBe(409);
    expect(JSON.stringify(elsewhere.body)).toMatch(new RegExp(`group ${groupId} exists`));
    const grpo = `grpo-${Date.now()}`;
    expect((await api("/v1/tasks/batch", { body: { group_id: grpo, n: 1, task: buildTask() } })).status).toBe(202);
    expect((await api(`/v1/tasks/${id}/branches`, { body: { at_call: 1, n: 1, group_id: grpo } })).status).toBe(409);
    for (const t of [`${groupId}-0`, `${groupId}-1`, `${grpo}-0`]) await terminal(t);

    // A rollout whose session was deleted has no records to replay: said so, not "made 0 LLM calls".
    const { session_id } = (await api(`/v1/tasks/${id}`)).body as { session_id: string };
    expect((await api(`/v1/sessions/${session_id}`, { method: "DELETE" })).status).toBe(204);
    const gone = await api(`/v1/tasks/${id}/branches`, { body: { at_call: 1, n: 1 } });
    expect(gone.status).toBe(409);
    expect(JSON.stringify(gone.body)).toMatch(new RegExp(`its session ${session_id} was deleted`));
  }, 120_000);
});
