/**
 * The rollout fleet on real Redis with real processes: a gateway, several workers, engine-sim.
 * Each block runs its own fleet under its own key prefix.
 */
import { createHmac, randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import http from "node:http";
import type { AddressInfo } from "node:net";
import readline from "node:readline";
import type { TaskRecord, TaskResult } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, startFleet, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll, terminalTask } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

let engine: StartedChild;
const prefixes: string[] = [];

beforeAll(async () => {
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
}, 60_000);

afterAll(async () => {
  await stopChild(engine.proc);
  for (const p of prefixes) await dropPrefix(p);
});

function newPrefix(name: string) {
  const p = uniquePrefix(name);
  prefixes.push(p);
  return p;
}

/** One LLM call through the example agent, then an evaluator that passes. */
const quickTask = (extra: Record<string, unknown> = {}) => ({
  instruction: 'Say done.\n#sim: [{"text": "done"}]',
  agent: { harness: "command", command: ["rollgate-example-agent"] },
  evaluator: { kind: "command", command: ["true"] },
  limits: { timeout_s: 60 },
  ...extra,
});

/** An agent that just waits (to be cancelled, interrupted or killed). */
const sleepyTask = (seconds: number, extra: Record<string, unknown> = {}) => ({
  instruction: "wait",
  agent: { harness: "command", command: ["bash", "-c", `sleep ${seconds}; echo finished`] },
  evaluator: { kind: "none" },
  limits: { timeout_s: 120 },
  ...extra,
});

const terminal = (api: ReturnType<typeof apiClient>, id: string, timeoutMs = 60_000) => terminalTask(api, id, timeoutMs);

async function running(api: ReturnType<typeof apiClient>, id: string): Promise<TaskRecord> {
  const r = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.status === "running", 20_000, 100);
  expect(r.status).toBe("running");
  return r;
}

describe("a GRPO batch across three workers", () => {
  let fleet: Awaited<ReturnType<typeof startFleet>>;
  const api = apiClient(() => fleet.url);
  beforeAll(async () => {
    // Affinity routing, so a GRPO group shares a rank (the default, least_loaded, spreads it).
    fleet = await startFleet({ prefix: newPrefix("batch"), engineUrl: engine.ready, workers: 3, gatewayEnv: { ROLLGATE_ROUTING: "affinity" } });
  }, 60_000);
  afterAll(() => fleet?.stop());

  it("runs 50 tasks to completion with exactly one callback delivery each, and one group callback", async () => {
    const trainer = await startTrainer();
    try {
      const secret = "batch-secret";
      const groupId = `g-${randomUUID().slice(0, 8)}`;
      const res = await api("/v1/tasks/batch", {
        body: { group_id: groupId, n: 50, task: quickTask({ callback: { url: trainer.url, secret } }), group_callback: { url: trainer.url, secret } },
      });
      expect(res.status).toBe(202);
      expect(res.body.tasks).toHaveLength(50);
      expect(res.body.tasks[7]).toEqual({ id: `${groupId}-7`, status: "queued" });

      // 50 task callbacks + 1 group callback.
      const got = await trainer.waitFor(51, 120_000);
      await new Promise((r) => setTimeout(r, 1_000));
      expect(trainer.received).toHaveLength(51);
      const taskDeliveries = got.filter((d) => d.headers["x-rollgate-event"] !== "group.completed");
      const group = got.filter((d) => d.headers["x-rollgate-event"] === "group.completed");
      expect(group).toHaveLength(1);
      const results = taskDeliveries.map((d) => JSON.parse(d.rawBody) as TaskResult);
      expect(new Set(results.map((r) => r.id)).size).toBe(50);
      expect(new Set(taskDeliveries.map((d) => d.headers["x-rollgate-delivery"])).size).toBe(50);
      expect(results.every((r) => r.status === "completed" && r.reward === 1)).toBe(true);
      // The fleet shared the work.
      expect(new Set(results.map((r) => r.worker)).size).toBeGreaterThan(1);
      for (const d of got) {
        expect(d.headers["x-rollgate-signature"]).toBe(`sha256=${createHmac("sha256", secret).update(d.rawBody).digest("hex")}`);
      }
      const groupBody = JSON.parse(group[0]!.rawBody) as { group_id: string; tasks: TaskResult[] };
      expect(groupBody.group_id).toBe(groupId);
      expect(groupBody.tasks.map((t) => t.id).sort()).toEqual(results.map((r) => r.id).sort());

      // One routing affinity per group: every session of the group sat on one engine rank.
      const ranks = new Set<number>();
      for (const r of results.slice(0, 10)) {
        const s = await api(`/v1/sessions/${r.session_id}`);
        ranks.add(s.body.assignment.dp_rank);
      }
      expect(ranks.size).toBe(1);

      // Listing by group pages through all 50 without repeats.
      const seen: string[] = [];
      let cursor: string | null = null;
      do {
        const page: { body: { tasks: TaskRecord[]; next_cursor: string | null } } = await api(
          `/v1/tasks?group_id=${groupId}&limit=20${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`,
        );
        seen.push(...page.body.tasks.map((t) => t.id));
        cursor = page.body.next_cursor;
      } while (cursor);
      expect(new Set(seen).size).toBe(50);
      expect((await api(`/v1/tasks?group_id=${groupId}&status=failed`)).body.tasks).toEqual([]);
    } finally {
      await trainer.close();
    }
  }, 150_000);

  it("streams a task's lifecycle as SSE and replays after Last-Event-ID", async () => {
    const { body } = await api("/v1/tasks", { body: quickTask() });
    const res = await fetch(`${fleet.url}/v1/tasks/${body.id}/events`);
    const text = await res.text(); // the stream ends after the terminal event
    const events = text
      .split("\n\n")
      .filter((f) => f.includes("data: "))
      .map((f) => JSON.parse(f.slice(f.indexOf("data: ") + 6)) as { id: string; type: string; data: Record<string, unknown> });
    expect(events.map((e) => e.type)).toEqual(["queued", "started", "llm_call", "evaluating", "terminal"]);
    expect(events[2]!.data).toMatchObject({ seq: 0, completion_tokens: expect.any(Number) });
    expect(events[4]!.data).toMatchObject({ status: "completed", reward: 1 });
    const replay = await fetch(`${fleet.url}/v1/tasks/${body.id}/events`, { headers: { "last-event-id": events[2]!.id } });
    expect((await replay.text()).match(/^event: (\w+)/gm)).toEqual(["event: evaluating", "event: terminal"]);

    const logs = await api(`/v1/tasks/${body.id}/logs`);
    expect(logs.status).toBe(200);
    expect(logs.body).toContain("done");
  });

  it("rejects bad task bodies with 400 naming the field", async () => {
    const bad = async (task: Record<string, unknown>) => {
      const r = await api("/v1/tasks", { body: task });
      expect(r.status).toBe(400);
      return r.body.error.message as string;
    };
    expect(await bad(quickTask({ agent: { harness: "cursor" } }))).toContain("agent.harness");
    expect(await bad(quickTask({ runtime: { files: { "../../etc/passwd": "x" } } }))).toContain("runtime.files");
    expect(await bad(quickTask({ limits: { timeout_s: -5 } }))).toContain("limits.timeout_s");
    expect(await bad(quickTask({ evaluator: { kind: "magic" } }))).toContain("evaluator.kind");
    const batch = await api("/v1/tasks/batch", { body: { tasks: [quickTask(), quickTask({ limits: { timeout_s: 0 } })] } });
    expect(batch.status).toBe(400);
    expect(batch.body.error.message).toContain("tasks.1.limits.timeout_s");
  });
});

describe("cancellation", () => {
  let fleet: Awaited<ReturnType<typeof startFleet>>;
  const api = apiClient(() => fleet.url);
  beforeAll(async () => {
    fleet = await startFleet({ prefix: newPrefix("cancel"), engineUrl: engine.ready, workers: 1, workerEnv: { ROLLGATE_WORKER_CONCURRENCY: "1" } });
  }, 60_000);
  afterAll(() => fleet?.stop());

  it("kills a running task's sandbox within seconds and never starts a queued one", async () => {
    const first = (await api("/v1/tasks", { body: sleepyTask(60) })).body.id as string;
    const second = (await api("/v1/tasks", { body: sleepyTask(60) })).body.id as string;
    await running(api, first);
    // Concurrency 1: the second waits in the queue.
    const q = await api(`/v1/tasks/${second}`, { method: "DELETE" });
    expect(q.body).toEqual({ id: second, status: "cancelled" });
    const t0 = Date.now();
    const r = await api(`/v1/tasks/${first}`, { method: "DELETE" });
    expect(r.status).toBe(202);
    const a = await terminal(api, first, 15_000);
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(a.status).toBe("cancelled");
    expect(a.result!.error).toMatchObject({ kind: "cancelled", message: expect.stringMatching(/DELETE/) });
    const b = await terminal(api, second);
    expect(b.status).toBe("cancelled");
    expect(b.started_at).toBeNull();
    const events = await fetch(`${fleet.url}/v1/tasks/${second}/events`).then((x) => x.text());
    expect(events).not.toContain("event: started");
    expect((await api(`/v1/tasks/${first}`, { method: "DELETE" })).status).toBe(200);
    const done = (await api("/v1/tasks", { body: quickTask() })).body.id as string;
    await terminal(api, done);
    expect((await api(`/v1/tasks/${done}`, { method: "DELETE" })).status).toBe(409);
  }, 60_000);

  it("a cancelled group still ends: each task's callback and the group callback arrive once", async () => {
    const trainer = await startTrainer();
    try {
      const secret = "cancel-secret";
      const groupId = `gc-${randomUUID().slice(0, 8)}`;
      const res = await api("/v1/tasks/batch", {
        body: { group_id: groupId, n: 3, task: sleepyTask(60, { callback: { url: trainer.url, secret } }), group_callback: { url: trainer.url, secret } },
      });
      const ids = (res.body.tasks as { id: string }[]).map((t) => t.id);
      // Concurrency 1: one runs, two wait in the queue; all three are cancelled.
      await poll(async () => Promise.all(ids.map(async (id) => (await api(`/v1/tasks/${id}`)).body.status as string)), (s) => s.includes("running"), 20_000, 100);
      for (const id of ids) expect([200, 202]).toContain((await api(`/v1/tasks/${id}`, { method: "DELETE" })).status);
      for (const id of ids) expect((await terminal(api, id, 20_000)).status).toBe("cancelled");
      const got = await trainer.waitFor(4, 30_000);
      const events = got.map((d) => d.headers["x-rollgate-event"]).sort();
      expect(events).toEqual(["group.completed", "task.cancelled", "task.cancelled", "task.cancelled"]);
      const perTask = got.filter((d) => d.headers["x-rollgate-event"] === "task.cancelled").map((d) => (JSON.parse(d.rawBody) as { id: string }).id);
      expect(perTask.sort()).toEqual([...ids].sort());
      const group = got.filter((d) => d.headers["x-rollgate-event"] === "group.completed");
      expect((JSON.parse(group[0]!.rawBody) as { tasks: { status: string }[] }).tasks.map((t) => t.status)).toEqual(["cancelled", "cancelled", "cancelled"]);
      // Nothing more arrives.
      await new Promise((r) => setTimeout(r, 1_000));
      expect(trainer.received).toHaveLength(4);
    } finally {
      await trainer.close();
    }
  }, 60_000);
});

describe("workers going away", () => {
  it("SIGTERM lets a worker end its running rollout as cancelled with a reason after the grace period", async () => {
    const fleet = await startFleet({
      prefix: newPrefix("sigterm"),
      engineUrl: engine.ready,
      workers: 1,
      workerEnv: { ROLLGATE_SHUTDOWN_GRACE_S: "1" },
    });
    const api = apiClient(() => fleet.url);
    try {
      const id = (await api("/v1/tasks", { body: sleepyTask(60) })).body.id as string;
      await running(api, id);
      await stopChild(fleet.workers[0]!.proc);
      const r = await terminal(api, id, 15_000);
      expect(r.status).toBe("cancelled");
      expect(r.result!.error!.message).toBe("worker shutting down");
    } finally {
      await fleet.stop();
    }
  }, 60_000);

  it("SIGTERM lets a short rollout finish normally", async () => {
    const fleet = await startFleet({ prefix: newPrefix("sigterm2"), engineUrl: engine.ready, workers: 1, workerEnv: { ROLLGATE_SHUTDOWN_GRACE_S: "20" } });
    const api = apiClient(() => fleet.url);
    try {
      const id = (await api("/v1/tasks", { body: sleepyTask(2, { evaluator: { kind: "command", command: ["true"] } }) })).body.id as string;
      await running(api, id);
      await stopChild(fleet.workers[0]!.proc, 30_000);
      const r = await terminal(api, id, 5_000);
      expect(r.status).toBe("completed");
      expect(r.result!.reward).toBe(1);
    } finally {
      await fleet.stop();
    }
  }, 60_000);

  it("a worker SIGKILLed mid-rollout: another worker takes the task over and it ends, never stuck in running", async () => {
    const fleet = await startFleet({
      prefix: newPrefix("sigkill"),
      engineUrl: engine.ready,
      workers: 2,
      workerEnv: { ROLLGATE_JOB_LOCK_MS: "2000", ROLLGATE_STALLED_INTERVAL_MS: "1000", ROLLGATE_WORKER_CONCURRENCY: "1" },
    });
    const api = apiClient(() => fleet.url);
    try {
      const id = (await api("/v1/tasks", { body: quickTask({ agent: { harness: "command", command: ["bash", "-c", "sleep 4; rollgate-example-agent"] } }) })).body.id as string;
      const r1 = await running(api, id);
      const victim = fleet.workers.find((w) => w.ready === r1.worker)!;
      victim.proc.kill("SIGKILL");
      const r = await terminal(api, id, 45_000);
      expect(r.status).toBe("completed");
      expect(r.worker).not.toBe(r1.worker);
      expect(r.result!.attempts).toBe(2);
      // The dead worker's session was closed before the new attempt opened its own.
      const old = await api(`/v1/sessions/${r1.session_id}`);
      expect(old.body.state).toBe("closed");
      expect(r.session_id).not.toBe(r1.session_id);
    } finally {
      await fleet.stop();
    }
  }, 90_000);

  it("workers SIGKILLed mid-delivery twice: the callback is still delivered, every time under its one delivery id", async () => {
    // The trainer holds each delivery open until the test lets it answer.
    let hold = true;
    const seen: string[] = [];
    const trainer = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        seen.push(String(req.headers["x-rollgate-delivery"]));
        const answer = () => (hold ? setTimeout(answer, 50) : res.writeHead(200).end("ok"));
        answer();
      });
    });
    await new Promise<void>((r) => trainer.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(trainer.address() as AddressInfo).port}/rollouts`;
    const lockEnv = { ROLLGATE_JOB_LOCK_MS: "2000", ROLLGATE_STALLED_INTERVAL_MS: "1000" };
    const prefix = newPrefix("cbkill");
    const fleet = await startFleet({ prefix, engineUrl: engine.ready, workers: 1, workerEnv: lockEnv });
    const extra: StartedChild[] = [];
    const api = apiClient(() => fleet.url);
    try {
      const id = (await api("/v1/tasks", { body: quickTask({ callback: { url, secret: "s" } }) })).body.id as string;
      let victim = fleet.workers[0]!;
      for (const n of [1, 2]) {
        // (Up to the default 30 s lock and stalled check of a callback job on the code before.)
        expect(await poll(async () => seen.length, (k) => k >= n, 120_000)).toBe(n);
        victim.proc.kill("SIGKILL");
        victim = await startApp("worker", [], { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_GATEWAY_URL: fleet.url, ROLLGATE_WORKER_NAME: `w-next-${n}`, ...lockEnv });
        extra.push(victim);
      }
      hold = false;
      const done = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.callback.state !== "pending", 120_000);
      expect(done.callback.state).toBe("delivered");
      expect(seen.length).toBeGreaterThanOrEqual(3);
      expect(new Set(seen)).toEqual(new Set([done.callback.delivery_id]));
    } finally {
      hold = false;
      for (const w of extra) await stopChild(w.proc, 5_000);
      await fleet.stop();
      await new Promise((r) => trainer.close(r));
    }
  }, 400_000);

  it("a worker frozen mid-rollout past its lock, then thawed: its stale attempt's result, output and events never replace the attempt that took the task over's", async () => {
    // A worker whose job lock lapsed (its event loop stalled, or Redis was away longer than
    // ROLLGATE_JOB_LOCK_MS) is not dead: BullMQ hands the job to another worker, which closes the
    // first attempt's session mid-rollout, while the first one goes on. Its result (an interrupted
    // agent, a cut-short trajectory) must not become the task's.
    const dir = mkdtempSync(path.join(os.tmpdir(), "rg-frozen-"));
    const lockEnv = { ROLLGATE_JOB_LOCK_MS: "2000", ROLLGATE_STALLED_INTERVAL_MS: "1000", ROLLGATE_WORKER_CONCURRENCY: "1" };
    const prefix = newPrefix("frozen");
    const fleet = await startFleet({ prefix, engineUrl: engine.ready, workers: 1, workerEnv: lockEnv });
    const frozen = fleet.workers[0]!;
    let dropped = false;
    readline.createInterface({ input: frozen.proc.stdout! }).on("line", (l) => {
      if (l.includes("taken over by another attempt")) dropped = true;
    });
    let second: StartedChild | null = null;
    const api = apiClient(() => fleet.url);
    try {
      // Each attempt's agent says it started, then waits for the test to let its session go.
      const agent = 'touch "$MARKS/started-$ROLLGATE_SESSION_ID"; while [ ! -e "$MARKS/go-$ROLLGATE_SESSION_ID" ]; do sleep 0.1; done; echo "output of $ROLLGATE_SESSION_ID"';
      const id = (await api("/v1/tasks", { body: sleepyTask(0, { agent: { harness: "command", command: ["bash", "-c", agent], env: { MARKS: dir } }, evaluator: { kind: "command", command: ["true"] } }) })).body.id as string;
      const first = await running(api, id);
      const s1 = first.session_id!;
      expect(await poll(async () => existsSync(path.join(dir, `started-${s1}`)), Boolean, 20_000)).toBe(true);
      frozen.proc.kill("SIGSTOP");
      second = await startApp("worker", [], { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_GATEWAY_URL: fleet.url, ROLLGATE_WORKER_NAME: "w-second", ...lockEnv });
      const taken = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.status === "running" && t.session_id !== s1, 30_000);
      const s2 = taken.session_id!;
      expect(s2).not.toBe(s1);
      expect(await poll(async () => existsSync(path.join(dir, `started-${s2}`)), Boolean, 20_000)).toBe(true);

      // The frozen worker thaws; its agent ends; it evaluates and tries to store its result.
      writeFileSync(path.join(dir, `go-${s1}`), "");
      frozen.proc.kill("SIGCONT");
      const meanwhile = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.result !== null || dropped, 30_000);
      expect(meanwhile.result?.session_id ?? null).toBeNull();
      expect(meanwhile.status).toBe("running");
      // Nor did its agent's output become the task's (the live attempt's agent has printed nothing yet).
      expect(String((await api(`/v1/tasks/${id}/logs`)).body ?? "")).not.toContain(`output of ${s1}`);

      writeFileSync(path.join(dir, `go-${s2}`), "");
      const r = await terminal(api, id, 30_000);
      expect(r.status).toBe("completed");
      expect(r.result.session_id).toBe(s2);
      expect(r.result.worker).toBe("w-second");
      expect(r.result.attempts).toBe(2);
      expect(String((await api(`/v1/tasks/${id}/logs`)).body)).toContain(`output of ${s2}`);
      // One evaluation on record, the live attempt's: the stale attempt's evaluating event was refused.
      const events = await (await fetch(`${fleet.url}/v1/tasks/${id}/events`)).text();
      expect(events.match(/^event: evaluating$/gm)).toHaveLength(1);
    } finally {
      frozen.proc.kill("SIGCONT");
      if (second) await stopChild(second.proc, 5_000);
      await fleet.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});

describe("task ids", () => {
  it("an id submitted again after its record expired runs again, in one batch or alone, instead of waiting in the queue for good", async () => {
    // The queue keeps ended jobs (for the board) longer than a short ROLLGATE_RESULT_TTL_S keeps the
    // task: a trainer that reuses its ids (prompt-17-sample-3 every epoch) submits ids whose old
    // job is still there.
    const fleet = await startFleet({ prefix: newPrefix("reuse"), engineUrl: engine.ready, workers: 1, workerEnv: { ROLLGATE_RESULT_TTL_S: "1" } });
    const api = apiClient(() => fleet.url);
    try {
      const ids = ["reuse-a", "reuse-b"];
      await api("/v1/tasks", { body: quickTask({ id: ids[0] }) });
      await api("/v1/tasks/batch", { body: { tasks: [quickTask({ id: ids[1] })] } });
      for (const id of ids) expect((await terminal(api, id)).status).toBe("completed");
      for (const id of ids) expect((await poll(() => api(`/v1/tasks/${id}`), (r) => r.status === 404, 20_000)).status).toBe(404);

      expect((await api("/v1/tasks", { body: quickTask({ id: ids[0] }) })).body).toEqual({ id: ids[0], status: "queued" });
      expect((await api("/v1/tasks/batch", { body: { tasks: [quickTask({ id: ids[1] })] } })).body.tasks).toEqual([{ id: ids[1], status: "queued" }]);
      for (const id of ids) {
        const r = await terminal(api, id, 30_000);
        expect(r.status).toBe("completed");
        expect(r.result.attempts).toBe(1);
      }
    } finally {
      await fleet.stop();
    }
  }, 120_000);

  it("a group id submitted again after its tasks expired gets its own group callback, with this run's results, once they have all ended", async () => {
    // Group keys outlived their tasks (they never expired): the finished set and the cached group
    // body of the first run answered for the second.
    const fleet = await startFleet({ prefix: newPrefix("regroup"), engineUrl: engine.ready, workers: 1, workerEnv: { ROLLGATE_RESULT_TTL_S: "3", ROLLGATE_WORKER_CONCURRENCY: "1" } });
    const api = apiClient(() => fleet.url);
    const trainer = await startTrainer();
    try {
      const secret = "regroup-secret";
      const groupId = `gr-${randomUUID().slice(0, 8)}`;
      const submit = (run: number) =>
        api("/v1/tasks/batch", { body: { group_id: groupId, n: 2, task: quickTask({ metadata: { run } }), group_callback: { url: trainer.url, secret } } });
      const groupCallbacks = () => trainer.received.filter((d) => d.headers["x-rollgate-event"] === "group.completed");
      await submit(1);
      expect(await poll(async () => groupCallbacks().length, (n) => n >= 1, 60_000)).toBe(1);
      for (const k of [0, 1]) expect((await poll(() => api(`/v1/tasks/${groupId}-${k}`), (r) => r.status === 404, 20_000)).status).toBe(404);

      // The second run: its first member's end must not complete the group, nor send the first run's body.
      await submit(2);
      await terminal(api, `${groupId}-0`, 60_000);
      const second = await poll(async () => groupCallbacks(), (g) => g.length >= 2, 60_000);
      expect(second).toHaveLength(2);
      const body = JSON.parse(second[1]!.rawBody) as { tasks: ({ status: string; metadata: { run: number } } | null)[] };
      expect(body.tasks.map((t) => [t?.status, t?.metadata.run])).toEqual([
        ["completed", 2],
        ["completed", 2],
      ]);
      expect(second[1]!.headers["x-rollgate-delivery"]).not.toBe(second[0]!.headers["x-rollgate-delivery"]);
    } finally {
      await trainer.close();
      await fleet.stop();
    }
  }, 180_000);
});

describe("the gateway going away", () => {
  it("an agent whose call could not reach the gateway (restarted meanwhile) is not scored: its rollout runs again", async () => {
    // A local sandbox's agent talks to the gateway directly: a call refused while the gateway is
    // down leaves no trace the gateway could record. The agent fails, the evaluator then finds no
    // hello.txt; that must not be a completed rollout with reward 0.
    const prefix = newPrefix("gwdown");
    const fleet = await startFleet({ prefix, engineUrl: engine.ready, workers: 1 });
    const port = new URL(fleet.url).port;
    let again: StartedChild | null = null;
    const api = apiClient(() => fleet.url);
    try {
      const dir = mkdtempSync(path.join(os.tmpdir(), "rg-gwdown-"));
      try {
        // The first attempt's agent calls once the test has stopped the gateway, and ends after it is back.
        const agent = 'if [ ! -e "$MARKS/once" ]; then touch "$MARKS/once"; while [ ! -e "$MARKS/down" ]; do sleep 0.1; done; rollgate-example-agent; touch "$MARKS/called"; while [ ! -e "$MARKS/up" ]; do sleep 0.1; done; exit 1; fi; rollgate-example-agent';
        const id = (await api("/v1/tasks", {
          body: quickTask({
            instruction: 'Create hello.txt.\n#sim: [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}]}, {"text": "done"}]',
            agent: { harness: "command", command: ["bash", "-c", agent], env: { MARKS: dir } },
            evaluator: { kind: "command", command: ["bash", "-c", 'test "$(cat hello.txt)" = hello'] },
          }),
        })).body.id as string;
        await running(api, id);
        expect(await poll(async () => existsSync(path.join(dir, "once")), Boolean, 20_000)).toBe(true);
        let noticed = false;
        readline.createInterface({ input: fleet.workers[0]!.proc.stdout! }).on("line", (l) => {
          if (l.includes("gateway not ready")) noticed = true;
        });
        await stopChild(fleet.gateway.proc, 5_000);
        writeFileSync(path.join(dir, "down"), "");
        // The agent's call (with its SDK's retries) has failed, and the worker has seen the gateway gone.
        expect(await poll(async () => existsSync(path.join(dir, "called")) && noticed, Boolean, 60_000)).toBe(true);
        again = await startApp("gateway", ["--port", port], {
          ROLLGATE_KEY_PREFIX: prefix,
          ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]),
        });
        writeFileSync(path.join(dir, "up"), "");
        const r = await terminal(api, id, 60_000);
        // Not [completed, 0, 1]: the first attempt was given up unscored, the second one scored.
        expect([r.status, r.result.reward, r.result.attempts]).toEqual(["completed", 1, 2]);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    } finally {
      if (again) await stopChild(again.proc, 5_000);
      await fleet.stop();
    }
  }, 120_000);
});
