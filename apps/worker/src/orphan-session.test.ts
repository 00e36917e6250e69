/**
 * A task whose last attempt's worker went away (died, or stalled past its job lock) with its
 * session open, and that ends without running again (cancelled, or given up on), has that
 * session closed by the worker that ends it: the orphaned agent can write no more into it. The
 * real gateway (its built app, as a process), real Redis and BullMQ; the lost attempt is written
 * with the store's own calls, as its worker wrote it.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import type { AcceptedTask } from "@rollgate/protocol";
import { callbackQueue, createRedis, type CallbackJob, type RolloutJob } from "@rollgate/queue";
import { TaskStore } from "@rollgate/store";
import type { Job, Queue } from "bullmq";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FailureCounter } from "./failure-counter.js";
import { GatewayClient } from "./gateway-client.js";
import { onRolloutExhausted, runRollout, type RolloutDeps } from "./rollout.js";

const REDIS_URL = process.env.REDIS_URL || "redis://127.0.0.1:6379";
const GATEWAY_MAIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../gateway/dist/main.js");
const prefix = `test-orphan-${randomUUID().slice(0, 8)}`;
const redis = createRedis(REDIS_URL, "worker");
const queueRedis = createRedis(REDIS_URL, "worker");
let proc: ChildProcess;
let gateway: GatewayClient;
let gatewayUrl = "";
let tasks: TaskStore;
let callbacks: Queue<CallbackJob>;

beforeAll(async () => {
  // No call reaches the engine here: sessions only open and close (no health rounds to drain it).
  proc = spawn(process.execPath, [GATEWAY_MAIN, "--port", "0"], {
    env: {
      ...process.env,
      REDIS_URL,
      LOG_LEVEL: "warn",
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1, model: "m" }]),
      ROLLGATE_HEALTH_INTERVAL_S: "0",
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    readline.createInterface({ input: proc.stdout! }).on("line", (l) => {
      const m = /^gateway ready: (\S+)/.exec(l);
      if (m) resolve(m[1]!);
    });
    proc.once("exit", (code) => reject(new Error(`gateway exited (${code})`)));
  });
  gatewayUrl = url;
  gateway = new GatewayClient(url, undefined);
  tasks = new TaskStore(redis, prefix);
  callbacks = callbackQueue({ connection: queueRedis, keyPrefix: prefix, attempts: 1, backoffMs: 100 });
}, 30_000);

afterAll(async () => {
  await callbacks?.obliterate({ force: true });
  await callbacks?.close();
  await new Promise<void>((resolve) => {
    if (!proc || proc.exitCode !== null) return resolve();
    proc.once("exit", () => resolve());
    proc.kill("SIGTERM");
  });
  const keys = [...(await redis.keys(`${prefix}:*`)), ...(await redis.keys(`{${prefix}:*`))];
  if (keys.length) await redis.del(...keys);
  redis.disconnect();
  queueRedis.disconnect();
});

const task = (id: string): AcceptedTask => ({ id, instruction: "x", agent: { harness: "command", command: ["true"] }, evaluator: { kind: "none" } }) as AcceptedTask;
const deps = () =>
  ({ tasks, gateway, callbacks, runtimes: {}, log: pino({ level: "silent" }), workerName: "w-next", resultTtlSeconds: 600, failures: new FailureCounter() }) as unknown as RolloutDeps;
const job = (taskId: string) => ({ id: taskId, data: { task_id: taskId }, attemptsMade: 1, opts: { attempts: 3 } }) as Job<RolloutJob>;

/** The session's state as the session API answers it. */
async function sessionState(id: string): Promise<string> {
  return ((await (await fetch(`${gatewayUrl}/v1/sessions/${id}`)).json()) as { state: string }).state;
}

/** A task whose attempt 1 opened a session and was marked running, then its worker went away. */
async function orphanedAttempt(id: string): Promise<string> {
  await tasks.create(task(id), new Date());
  const session = await gateway.openSession({ metadata: { task_id: id, attempt: 1 } });
  expect(await tasks.markRunning(id, { worker: "w-gone", attempt: 1, sessionId: session.id, now: new Date() })).toBe(true);
  expect(await sessionState(session.id)).toBe("open");
  return session.id;
}

describe("the session an attempt left open", () => {
  it("is closed when the task, cancelled meanwhile, is picked up by the next worker (which ends it cancelled)", async () => {
    const sid = await orphanedAttempt("cancelled-orphan");
    await tasks.requestCancel("cancelled-orphan", "cancelled by the test", new Date());
    await runRollout(deps(), job("cancelled-orphan"));
    expect((await tasks.get("cancelled-orphan"))?.status).toBe("cancelled");
    expect(await sessionState(sid)).toBe("closed");
  });

  it("is closed when BullMQ gives up on the task (stalled once too often) and it ends failed", async () => {
    const sid = await orphanedAttempt("given-up");
    await onRolloutExhausted(deps(), "given-up", new Error("job stalled more than allowable limit"), "worker_lost");
    expect((await tasks.get("given-up"))?.result?.error?.kind).toBe("worker_lost");
    expect(await sessionState(sid)).toBe("closed");
  });
});
