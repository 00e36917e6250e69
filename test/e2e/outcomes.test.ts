/**
 * Honest outcomes, with real processes on real Redis (engine-sim, a gateway, a worker): a rollout
 * that lost an LLM call to infrastructure is never scored. It is retried within the budget
 * (ROLLGATE_ROLLOUT_ATTEMPTS) and ends `failed` with `error.kind: "infrastructure"` and
 * `reward: null` once the budget is spent; a GRPO group says which member that was. A worker
 * holds tasks while the gateway is not ready. An agent that exits non-zero after its calls
 * succeeded is still scored.
 */
import { randomUUID } from "node:crypto";
import { freePort, type StartedChild } from "@rollgate/testkit";
import type { GroupResult, Readiness, TaskEvent, TaskRecord } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll, terminalTask } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

/** The example agent writes hello.txt with its shell tool, then answers; the evaluator checks the file. */
const helloTask = (extra: Record<string, unknown> = {}) => ({
  instruction: `Create hello.txt containing the word hello.\n#sim: [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}]}, {"text": "done"}]`,
  agent: { harness: "command", command: ["rollgate-example-agent"] },
  evaluator: { kind: "command", command: ["bash", "-c", 'test "$(cat hello.txt)" = hello'] },
  limits: { timeout_s: 60 },
  ...extra,
});

type Api = ReturnType<typeof apiClient> & { base: () => string };

const terminal = (api: Api, id: string, timeoutMs = 90_000) => terminalTask(api, id, timeoutMs);

/** The task's events so far: its event stream, read until it ends (the task ended) or goes quiet. */
async function events(api: Api, id: string, quietMs = 600): Promise<TaskEvent[]> {
  const abort = new AbortController();
  const res = await fetch(`${api.base()}/v1/tasks/${id}/events`, { signal: abort.signal });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  for (;;) {
    const timer = setTimeout(() => abort.abort(), quietMs);
    const chunk = await reader.read().catch(() => ({ done: true, value: undefined }));
    clearTimeout(timer);
    if (chunk.done) break;
    text += decoder.decode(chunk.value, { stream: true });
  }
  abort.abort();
  return text
    .split("\n")
    .filter((l) => l.startsWith("data: "))
    .map((l) => JSON.parse(l.slice(6)) as TaskEvent);
}

const fault = (engineUrl: string, body: Record<string, unknown>) =>
  fetch(`${engineUrl}/sim/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });

/** A gateway and a worker on their own prefix, against `engineUrl`. */
async function startPair(name: string, engineUrl: string, gatewayEnv: Record<string, string>, workerEnv: Record<string, string> = {}) {
  const prefix = uniquePrefix(name);
  const gateway = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engineUrl, dp_size: 2 }]),
    ...gatewayEnv,
  });
  const worker = await startApp("worker", [], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_GATEWAY_URL: gateway.ready,
    ROLLGATE_WORKER_NAME: `w-${name}`,
    ROLLGATE_WORKER_CONCURRENCY: "2",
    ROLLGATE_READINESS_POLL_MS: "300",
    ROLLGATE_CALLBACK_BACKOFF_MS: "100",
    ...workerEnv,
  });
  const base = gateway.ready;
  // With an API key on the gateway, the test's own requests carry it.
  const api = Object.assign(apiClient(() => base, gatewayEnv.ROLLGATE_API_KEY), { base: () => base });
  return {
    api,
    stop: async () => {
      await stopChild(worker.proc, 5_000);
      await stopChild(gateway.proc, 5_000);
      await dropPrefix(prefix);
    },
  };
}

describe("a rollout that loses LLM calls, within and beyond the retry budget", () => {
  let engine: StartedChild;
  let pair: Awaited<ReturnType<typeof startPair>>;
  beforeAll(async () => {
    engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
    // Periodic probes off: the engine fails between health checks, so the gateway stays ready and
    // the worker keeps taking the task (with probes on, it would hold it: see below).
    pair = await startPair("lost", engine.ready, { ROLLGATE_HEALTH_INTERVAL_S: "0", ROLLGATE_ROLLOUT_ATTEMPTS: "2", ROLLGATE_ROLLOUT_BACKOFF_MS: "3000" });
    expect((await pair.api("/readyz")).status).toBe(200);
  }, 60_000);
  afterAll(async () => {
    await pair?.stop();
    await stopChild(engine.proc);
  });

  it("an engine that answers 503 to every generation: failed, infrastructure, reward null, after every attempt", async () => {
    await fault(engine.ready, { mode: "down" });
    try {
      const { id } = (await pair.api("/v1/tasks", { body: helloTask() })).body as { id: string };
      const t = await terminal(pair.api, id);
      expect(t.status).toBe("failed");
      expect(t.result).toMatchObject({ status: "failed", reward: null, evaluation: null, trajectory: null, attempts: 2 });
      expect(t.result!.error!.kind).toBe("infrastructure");
      expect(t.result!.error!.message).toMatch(/^an LLM call was lost to infrastructure: engine http:\/\/127\.0\.0\.1:\d+ answered 503/);
      const retries = (await events(pair.api, id)).filter((e) => e.type === "retrying");
      expect(retries).toHaveLength(1);
      expect(retries[0]!.data).toMatchObject({ reason: "lost_call", attempt: 1, cause: expect.stringMatching(/503/) });
      // The lost session is closed and says why.
      const session = (await pair.api(`/v1/sessions/${t.result!.session_id}`)).body as { state: string; lost_calls: { count: number; first: { status: number } } };
      expect(session.state).toBe("closed");
      expect(session.lost_calls.count).toBeGreaterThan(0);
    } finally {
      await fault(engine.ready, { mode: "none" });
    }
  }, 120_000);

  it("an engine that comes back within the budget: the retry runs in a fresh session and is scored", async () => {
    await fault(engine.ready, { mode: "down" });
    const { id } = (await pair.api("/v1/tasks", { body: helloTask() })).body as { id: string };
    try {
      // Given up for a retry: back to `queued` after its first attempt (the backoff leaves time to act).
      const retried = await poll(
        async () => (await pair.api(`/v1/tasks/${id}`)).body as TaskRecord,
        (r) => r.status === "queued" && r.attempts === 1,
        60_000,
        25,
      );
      expect(retried).toMatchObject({ status: "queued", attempts: 1, result: null });
    } finally {
      await fault(engine.ready, { mode: "none" });
    }
    const t = await terminal(pair.api, id);
    expect(t.result).toMatchObject({ status: "completed", reward: 1, attempts: 2, error: null });
    const started = (await events(pair.api, id)).filter((e) => e.type === "started");
    expect(started).toHaveLength(2);
    expect(started[0]!.data.session_id).not.toBe(started[1]!.data.session_id);
    expect(t.result!.session_id).toBe(started[1]!.data.session_id);
  }, 120_000);

  it("a task waiting for its retry can be cancelled: it ends cancelled, and says it ran once", async () => {
    await fault(engine.ready, { mode: "down" });
    try {
      const { id } = (await pair.api("/v1/tasks", { body: helloTask() })).body as { id: string };
      await poll(
        async () => (await pair.api(`/v1/tasks/${id}`)).body as TaskRecord,
        (r) => r.status === "queued" && r.attempts === 1,
        60_000,
        25,
      );
      const cancel = await pair.api(`/v1/tasks/${id}`, { method: "DELETE" });
      expect(cancel.body).toEqual({ id, status: "cancelled" });
      const t = await terminal(pair.api, id);
      expect(t.result).toMatchObject({ status: "cancelled", attempts: 1, reward: null, error: { kind: "cancelled" } });
      // It never runs again.
      await new Promise((r) => setTimeout(r, 3_500));
      expect((await events(pair.api, id)).filter((e) => e.type === "started")).toHaveLength(1);
    } finally {
      await fault(engine.ready, { mode: "none" });
    }
  }, 90_000);

  it("an agent that exits non-zero after its calls succeeded is completed and scored, its exit code on the result", async () => {
    const { id } = (await pair.api("/v1/tasks", { body: helloTask({ agent: { harness: "command", command: ["bash", "-c", "rollgate-example-agent && exit 3"] } }) })).body as { id: string };
    const t = await terminal(pair.api, id);
    expect(t.result).toMatchObject({ status: "completed", reward: 1, attempts: 1, error: null, agent: { exit_code: 3 } });
    expect(t.result!.usage.llm_calls).toBe(2);
  }, 60_000);
});

describe("with no retry budget left: an engine that refuses connections, and a GRPO group with a lost member", () => {
  let engine: StartedChild;
  let pair: Awaited<ReturnType<typeof startPair>>;
  beforeAll(async () => {
    engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
    // One attempt, and sessions taking the two ranks in turn: a group of two has one member on each.
    pair = await startPair("nobudget", engine.ready, { ROLLGATE_HEALTH_INTERVAL_S: "0", ROLLGATE_ROLLOUT_ATTEMPTS: "1", ROLLGATE_ROUTING: "round_robin" });
    expect((await pair.api("/readyz")).status).toBe(200);
  }, 60_000);
  afterAll(async () => {
    await pair?.stop();
    await stopChild(engine.proc);
  });

  it("a group whose member lost its calls says so in the group callback: which member, and why it has no reward", async () => {
    const trainer = await startTrainer();
    try {
      // An engine error of its own (500): a rank that is down (503) would have the call made again on the other rank.
      await fault(engine.ready, { rank: 1, mode: "error" });
      const groupId = `g-lost-${randomUUID().slice(0, 8)}`;
      const secret = "group-secret";
      const res = await pair.api("/v1/tasks/batch", { body: { group_id: groupId, n: 2, task: helloTask(), group_callback: { url: trainer.url, secret } } });
      expect(res.status).toBe(202);
      const [delivery] = await trainer.waitFor(1, 90_000);
      expect(delivery!.headers["x-rollgate-event"]).toBe("group.completed");
      const body = JSON.parse(delivery!.rawBody) as GroupResult;
      expect(body.group_id).toBe(groupId);
      expect(body.summary).toMatchObject({ size: 2, statuses: { completed: 1, failed: 1 }, scored: 1 });
      expect(body.summary.unscored).toEqual([{ id: expect.stringMatching(new RegExp(`^${groupId}-[01]$`)), status: "failed", error: { kind: "infrastructure", message: expect.stringMatching(/500/) } }]);
      const lost = body.tasks.find((t) => t?.id === body.summary.unscored[0]!.id)!;
      expect(lost).toMatchObject({ status: "failed", reward: null, error: { kind: "infrastructure" } });
      const scored = body.tasks.find((t) => t?.id !== lost.id)!;
      expect(scored).toMatchObject({ status: "completed", reward: 1 });
    } finally {
      await fault(engine.ready, { mode: "none" });
      await trainer.close();
    }
  }, 120_000);

  it("an engine that refuses connections: failed, infrastructure, reward null; never completed", async () => {
    // The engine dies after the gateway found it ready; with probes off nothing notices before the agent does.
    await stopChild(engine.proc);
    const { id } = (await pair.api("/v1/tasks", { body: helloTask() })).body as { id: string };
    const t = await terminal(pair.api, id);
    expect(t.result).toMatchObject({ status: "failed", reward: null, attempts: 1, error: { kind: "infrastructure" } });
    expect(t.result!.error!.message).toMatch(/unreachable: .*ECONNREFUSED/);
  }, 90_000);
});

describe("a worker while the engine is not ready", () => {
  let pair: Awaited<ReturnType<typeof startPair>>;
  let engine: StartedChild | null = null;
  let port = 0;
  beforeAll(async () => {
    port = await freePort();
    pair = await startPair("hold", `http://127.0.0.1:${port}`, { ROLLGATE_HEALTH_INTERVAL_S: "1" });
  }, 60_000);
  afterAll(async () => {
    await pair?.stop();
    if (engine) await stopChild(engine.proc);
  });

  it("holds the task in the queue (nothing fails), and runs it once the engine answers", async () => {
    const ready = await pair.api("/readyz");
    expect(ready.status).toBe(503);
    expect((ready.body as Readiness).reason).toContain(`engine 0 (vllm http://127.0.0.1:${port}): no rank answers`);

    const { id } = (await pair.api("/v1/tasks", { body: helloTask() })).body as { id: string };
    // Several readiness polls of the worker go by: the task stays queued and never starts.
    await new Promise((r) => setTimeout(r, 3_000));
    const held = (await pair.api(`/v1/tasks/${id}`)).body as TaskRecord;
    expect(held).toMatchObject({ status: "queued", attempts: 0, result: null });
    expect((await events(pair.api, id)).map((e) => e.type)).toEqual(["queued"]);

    engine = await startApp("engine-sim", ["--port", String(port), "--dp", "2"], {});
    const t = await terminal(pair.api, id);
    expect(t.result).toMatchObject({ status: "completed", reward: 1, attempts: 1 });
    expect((await pair.api("/readyz")).status).toBe(200);
  }, 90_000);
});

describe("a worker the gateway refuses", () => {
  let engine: StartedChild;
  let pair: Awaited<ReturnType<typeof startPair>>;
  beforeAll(async () => {
    engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
    pair = await startPair("refused", engine.ready, { ROLLGATE_API_KEY: "the-key", ROLLGATE_ROLLOUT_ATTEMPTS: "3" }, { ROLLGATE_API_KEY: "not-the-key" });
  }, 60_000);
  afterAll(async () => {
    await pair?.stop();
    await stopChild(engine.proc);
  });

  it("a wrong API key fails the task at once with the gateway's answer, without spending the retry budget", async () => {
    const { id } = (await pair.api("/v1/tasks", { body: helloTask() })).body as { id: string };
    const t = await terminal(pair.api, id);
    expect(t.result).toMatchObject({ status: "failed", reward: null, attempts: 1, error: { kind: "gateway_refused" } });
    expect(t.result!.error!.message).toMatch(/^POST \/v1\/sessions answered 401 \(unauthorized: /);
  }, 60_000);
});
