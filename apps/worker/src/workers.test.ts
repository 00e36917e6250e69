/**
 * Job payloads are read with their schemas when a worker takes them: a bad payload fails that job
 * at once, with the reason, without retries, and a rollout job's task ends `failed` saying why
 * instead of staying queued. Real Redis and BullMQ, a WorkerSet as the worker runs it.
 */
import { randomUUID } from "node:crypto";
import { Task, type AcceptedTask } from "@rollgate/protocol";
import { QueueName, callbackQueue, createRedis, queuePrefix } from "@rollgate/queue";
import { TaskStore } from "@rollgate/store";
import { Queue, UnrecoverableError, Worker, type Job } from "bullmq";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FailureCounter } from "./failure-counter.js";
import { GatewayClient } from "./gateway-client.js";
import { InvalidJob, WorkerSet, gaveUpKind, parseJob } from "./workers.js";
import { RolloutJob } from "@rollgate/queue";

const REDIS_URL = process.env.REDIS_URL || "redis://127.0.0.1:6379";
const prefix = `test-jobs-${randomUUID().slice(0, 8)}`;
const redis = createRedis(REDIS_URL, "worker");
const log = pino({ level: "silent" });
let tasks: TaskStore;
let workers: WorkerSet;
let rollouts: Queue;
let callbacks: Queue;

beforeAll(async () => {
  tasks = new TaskStore(redis, prefix);
  // Jobs added with their payloads as they are, like a producer with a bug (or of another version) would.
  rollouts = new Queue(QueueName.rollouts, { connection: redis, prefix: queuePrefix(prefix, QueueName.rollouts) });
  callbacks = new Queue(QueueName.callbacks, { connection: redis, prefix: queuePrefix(prefix, QueueName.callbacks) });
  const callbackQ = callbackQueue({ connection: redis, keyPrefix: prefix, attempts: 1, backoffMs: 100 });
  workers = new WorkerSet({
    connection: redis,
    keyPrefix: prefix,
    concurrency: 1,
    lockMs: 5_000,
    stalledIntervalMs: 5_000,
    log,
    callback: { tasks, log },
    rollout: {
      tasks,
      gateway: new GatewayClient("http://127.0.0.1:9", undefined),
      callbacks: callbackQ,
      workerName: "w-test",
      runtimes: {},
      sandboxPath: "/usr/bin:/bin",
      resultTtlSeconds: 60,
      log,
      failures: new FailureCounter(),
    },
  });
  await workers.waitUntilReady();
});

afterAll(async () => {
  await workers.close(1_000);
  for (const q of [rollouts, callbacks]) {
    await q.obliterate({ force: true });
    await q.close();
  }
  const found = [...(await redis.keys(`${prefix}:*`)), ...(await redis.keys(`{${prefix}:*`))];
  if (found.length) await redis.del(...found);
  redis.disconnect();
});

async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  let v = await read();
  while (!ok(v) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    v = await read();
  }
  return v;
}

describe("job payloads", () => {
  it("parseJob names what is wrong", () => {
    expect(parseJob(RolloutJob, "rollouts", { task_id: "t-1", extra: 1 })).toEqual({ task_id: "t-1" });
    expect(() => parseJob(RolloutJob, "rollouts", { taskId: "t-1" })).toThrow(InvalidJob);
    expect(() => parseJob(RolloutJob, "rollouts", { taskId: "t-1" })).toThrow(/^invalid rollouts job payload: task_id: /);
  });

  it("a rollout job with a bad payload fails once, and its task ends failed with the reason", async () => {
    const task = Task.parse({ id: "t-bad", instruction: "x", agent: { harness: "command", command: ["true"] } }) as AcceptedTask;
    await tasks.create(task, new Date());
    await rollouts.add("rollout", { task: "t-bad" }, { jobId: "t-bad", attempts: 3 });
    const record = await until(
      () => tasks.get("t-bad"),
      (r) => r?.result !== null,
    );
    expect(record?.status).toBe("failed");
    expect(record?.result?.error).toEqual({ kind: "invalid_job", message: expect.stringMatching(/^invalid rollouts job payload: task_id: /) });
    const job = await rollouts.getJob("t-bad");
    expect(await job?.getState()).toBe("failed");
    expect(job?.attemptsMade).toBe(1);
  });

  it("a callback job with a bad payload fails once, without retries", async () => {
    await callbacks.add("deliver", { delivery: 42 }, { jobId: "cb-bad", attempts: 5, backoff: { type: "fixed", delay: 50 } });
    const state = await until(
      async () => (await callbacks.getJob("cb-bad"))?.getState(),
      (s) => s === "failed",
    );
    expect(state).toBe("failed");
    const job = await callbacks.getJob("cb-bad");
    expect(job?.attemptsMade).toBe(1);
    expect(job?.failedReason).toMatch(/^invalid callbacks job payload: /);
  });
});

describe("why BullMQ gave up on a rollout job", () => {
  it("a job whose worker died more often than maxStalledCount reads as worker_lost, from BullMQ's typed marks; an error's text decides nothing", async () => {
    const qPrefix = `${prefix}-stall`;
    const queue = new Queue("stall", { connection: redis, prefix: qPrefix });
    const dyingConnection = createRedis(REDIS_URL, "worker");
    const opts = { prefix: qPrefix, lockDuration: 500, stalledInterval: 300, maxStalledCount: 0 };
    try {
      await queue.add("rollout", {}, { jobId: "j-stall", attempts: 3 });
      // A worker takes the job and dies: closed by force, it stops renewing the lock and never finishes.
      let taken!: () => void;
      const tookIt = new Promise<void>((r) => (taken = r));
      const dying = new Worker("stall", () => (taken(), new Promise<never>(() => {})), { ...opts, connection: dyingConnection });
      await tookIt;
      await dying.close(true);
      // The next worker's stalled check finds the job and, past maxStalledCount, BullMQ fails it.
      const next = new Worker("stall", async () => undefined, { ...opts, connection: redis });
      const [job, err] = await new Promise<[Job | undefined, Error]>((resolve) => next.on("failed", (j, e) => resolve([j, e])));
      await next.close();
      expect(err).toBeInstanceOf(UnrecoverableError);
      expect(gaveUpKind(job, err)).toBe("worker_lost");
    } finally {
      await queue.obliterate({ force: true });
      await queue.close();
      dyingConnection.disconnect();
      const left = await redis.keys(`${qPrefix}:*`);
      if (left.length) await redis.del(...left);
    }
    // What an error says decides nothing: only its type and the job's marks do.
    expect(gaveUpKind(undefined, new Error("job stalled more than allowable limit"))).toBe("infrastructure");
    expect(gaveUpKind(undefined, new InvalidJob("invalid rollouts job payload"))).toBe("invalid_job");
  }, 20_000);
});
