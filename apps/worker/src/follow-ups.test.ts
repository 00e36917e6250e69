/**
 * What follows a terminal result is never lost: a worker that died after storing a result (the
 * pending callback is stored with it) leaves a job that runs again, and that run queues the
 * callback and counts the task in its group, once, however often it runs. Real Redis and BullMQ.
 */
import { randomUUID } from "node:crypto";
import type { AcceptedTask, TaskResult } from "@rollgate/protocol";
import { callbackQueue, createRedis, type CallbackJob, type RolloutJob } from "@rollgate/queue";
import { TaskStore } from "@rollgate/store";
import type { Job, Queue } from "bullmq";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runRollout, type RolloutDeps } from "./rollout.js";

const REDIS_URL = process.env.REDIS_URL || "redis://127.0.0.1:6379";
const prefix = `test-followups-${randomUUID().slice(0, 8)}`;
const redis = createRedis(REDIS_URL, "worker");
const queueRedis = createRedis(REDIS_URL, "worker");
let tasks: TaskStore;
let callbacks: Queue<CallbackJob>;

const task = (id: string, group?: string): AcceptedTask =>
  ({
    id,
    instruction: "x",
    agent: { harness: "command", command: ["true"] },
    evaluator: { kind: "none" },
    callback: { url: "http://trainer.invalid/cb", secret: "s" },
    ...(group ? { group_id: group } : {}),
  }) as AcceptedTask;

const result = (id: string): TaskResult =>
  ({
    id,
    group_id: null,
    status: "completed",
    reward: 1,
    evaluation: null,
    error: null,
    session_id: null,
    trajectory: null,
    usage: { llm_calls: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0 },
    timings: { queued_ms: 0, run_ms: 0, eval_ms: 0, total_ms: 0 },
    attempts: 1,
    worker: "w-dead",
    agent: { exit_code: 0, signal: null, log_tail: "" },
    metadata: {},
  }) as TaskResult;

// Only what a run of an ended task touches: the task store and the callbacks queue.
const deps = () => ({ tasks, callbacks, log: pino({ level: "silent" }), workerName: "w-next", resultTtlSeconds: 600 }) as unknown as RolloutDeps;
const job = (taskId: string) => ({ id: taskId, data: { task_id: taskId }, attemptsMade: 1 }) as Job<RolloutJob>;
const pending = (deliveryId: string) => ({ state: "pending" as const, delivery_id: deliveryId, attempts: 0, last_error: null, delivered_at: null });

beforeAll(() => {
  tasks = new TaskStore(redis, prefix);
  callbacks = callbackQueue({ connection: queueRedis, keyPrefix: prefix, attempts: 1, backoffMs: 100 });
});

afterAll(async () => {
  await callbacks.obliterate({ force: true });
  await callbacks.close();
  const keys = [...(await redis.keys(`${prefix}:*`)), ...(await redis.keys(`{${prefix}:*`))];
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
  queueRedis.disconnect();
});

describe("follow-ups of a stored result", () => {
  it("a run after the worker died between result and callback queues the callback, once", async () => {
    await tasks.create(task("t-1"), new Date());
    // The dead worker got this far: result and pending callback stored, no delivery job queued.
    await tasks.finish("t-1", result("t-1"), new Date(), 600, pending("d-1"));
    expect(await callbacks.getJob("d-1")).toBeUndefined();

    await runRollout(deps(), job("t-1"));
    const queued = await callbacks.getJob("d-1");
    expect(queued?.data).toEqual({ task_id: "t-1", delivery_id: "d-1" });
    // Run again (stalled twice): still one delivery job.
    await runRollout(deps(), job("t-1"));
    expect(await callbacks.getJobCounts("waiting", "delayed", "active")).toMatchObject({ waiting: 1 });
  });

  it("a delivered callback is not queued again", async () => {
    await tasks.create(task("t-2"), new Date());
    await tasks.finish("t-2", result("t-2"), new Date(), 600, pending("d-2"));
    await tasks.setCallback("t-2", { ...pending("d-2"), state: "delivered", delivered_at: new Date().toISOString() });
    await runRollout(deps(), job("t-2"));
    expect(await callbacks.getJob("d-2")).toBeUndefined();
  });

  it("a group completes once every task is counted, even when a task's job runs twice", async () => {
    const g = `g-${randomUUID().slice(0, 6)}`;
    await tasks.defineGroup(g, 2, { url: "http://trainer.invalid/group", secret: "s" });
    for (const id of ["ga", "gb"]) await tasks.create(task(id, g), new Date());
    await tasks.finish("ga", result("ga"), new Date(), 600, pending("d-ga"));
    await runRollout(deps(), job("ga"));
    await runRollout(deps(), job("ga"));
    const groupJobs = async () => (await callbacks.getJobs(["waiting", "delayed"])).filter((j) => "group_id" in j.data && j.data.group_id === g);
    expect(await groupJobs()).toHaveLength(0);
    await tasks.finish("gb", result("gb"), new Date(), 600, pending("d-gb"));
    await runRollout(deps(), job("gb"));
    await runRollout(deps(), job("gb"));
    expect(await groupJobs()).toHaveLength(1);
  });
});
