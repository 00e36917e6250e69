#!/usr/bin/env node
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { callbackQueue, createRedis } from "@rollgate/queue";
import { TaskStore } from "@rollgate/store";
import closeWithGrace from "close-with-grace";
import { pino } from "pino";
import { loadWorkerEnv } from "./env.js";
import { GatewayClient } from "./gateway-client.js";
import { defaultSandboxPath } from "./sandbox/environment.js";
import { LocalRuntime } from "./sandbox/local-runtime.js";
import { WorkerSet } from "./workers.js";

const HELP = `rollgate-worker: runs rollouts (BullMQ "rollouts" queue) and delivers callbacks

Usage: rollgate-worker [--concurrency N]

Options:
  --concurrency N   rollouts run at once (env ROLLGATE_WORKER_CONCURRENCY, default 4)
  -h, --help        this text

Environment:
  REDIS_URL                    redis://host:port[/db] (default redis://127.0.0.1:6379)
  ROLLGATE_GATEWAY_URL         where the gateway's session API is (default http://127.0.0.1:8080)
  ROLLGATE_API_KEY             the gateway's API key, if it has one
  ROLLGATE_KEY_PREFIX          prefix of every Redis key and queue (default rg)
  ROLLGATE_WORKER_NAME         name in task results (default: hostname-pid)
  ROLLGATE_SANDBOX_ROOT        parent of per-rollout working directories (default: OS temp dir)
  ROLLGATE_SANDBOX_PATH        PATH given to agents (default: node's folder, rollgate's bins, system bins)
  ROLLGATE_RESULT_TTL_S        how long results are kept (default 7 days)
  ROLLGATE_CALLBACK_ATTEMPTS   callback delivery attempts (default 12)
  ROLLGATE_CALLBACK_BACKOFF_MS first callback retry delay, doubled each time (default 1000)
  ROLLGATE_SHUTDOWN_GRACE_S    on SIGTERM, how long running rollouts may finish before being cancelled (default 30)
  ROLLGATE_JOB_LOCK_MS         BullMQ job lock; a dead worker's rollout is recovered after about this (default 30000)
  ROLLGATE_STALLED_INTERVAL_MS how often workers look for stalled rollouts (default 15000)
  LOG_LEVEL                    fatal|error|warn|info|debug|trace|silent (default info)

Prints "worker ready: <name>" once it takes jobs. SIGTERM/SIGINT: stop taking jobs, let running
rollouts finish for ROLLGATE_SHUTDOWN_GRACE_S, then cancel them (status "cancelled" with the reason).`;

const { values } = parseArgs({ options: { concurrency: { type: "string" }, help: { type: "boolean", short: "h" } } });
if (values.help) {
  console.log(HELP);
  process.exit(0);
}
let env;
try {
  env = loadWorkerEnv({ ...process.env, ...(values.concurrency ? { ROLLGATE_WORKER_CONCURRENCY: values.concurrency } : {}) });
} catch (err) {
  console.error(`rollgate-worker: ${(err as Error).message}`);
  process.exit(2);
}

const log = pino({ level: env.LOG_LEVEL });
const name = env.ROLLGATE_WORKER_NAME ?? `${os.hostname()}-${process.pid}`;
const installRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const connection = createRedis(env.REDIS_URL, "worker");
connection.on("error", (err) => log.warn({ err: err.message }, "redis connection error"));
const tasks = new TaskStore(connection, env.ROLLGATE_KEY_PREFIX);
const callbacks = callbackQueue({
  connection,
  keyPrefix: env.ROLLGATE_KEY_PREFIX,
  attempts: env.ROLLGATE_CALLBACK_ATTEMPTS,
  backoffMs: env.ROLLGATE_CALLBACK_BACKOFF_MS,
});
const workers = new WorkerSet({
  connection,
  keyPrefix: env.ROLLGATE_KEY_PREFIX,
  concurrency: env.ROLLGATE_WORKER_CONCURRENCY,
  lockMs: env.ROLLGATE_JOB_LOCK_MS,
  stalledIntervalMs: env.ROLLGATE_STALLED_INTERVAL_MS,
  log,
  callback: { tasks, log },
  rollout: {
    tasks,
    gateway: new GatewayClient(env.ROLLGATE_GATEWAY_URL.replace(/\/+$/, ""), env.ROLLGATE_API_KEY),
    callbacks,
    workerName: name,
    runtimes: { local: new LocalRuntime(env.ROLLGATE_SANDBOX_ROOT) },
    sandboxPath: env.ROLLGATE_SANDBOX_PATH ?? defaultSandboxPath(installRoot),
    resultTtlSeconds: env.ROLLGATE_RESULT_TTL_S,
    log,
  },
});

// close-with-grace's own delay is a last resort above our grace, for a stop that hangs.
closeWithGrace({ delay: env.ROLLGATE_SHUTDOWN_GRACE_S * 1000 + 30_000 }, async ({ signal, err }) => {
  if (err) log.error({ err }, "shutting down after an error");
  log.info({ signal, grace_s: env.ROLLGATE_SHUTDOWN_GRACE_S }, "stopping: no new rollouts; running ones may finish");
  await workers.close(env.ROLLGATE_SHUTDOWN_GRACE_S * 1000);
  await callbacks.close();
  connection.disconnect();
});
await workers.waitUntilReady();
await workers.listenForCancels(tasks.cancelChannel());
console.log(`worker ready: ${name}`);
