#!/usr/bin/env node
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import type { ChildProcess } from "node:child_process";
import { startChild, stopChild } from "@rollgate/testkit";
import { watchParent } from "./parent.js";
import { watchReadiness, type ReadinessWatch } from "./readiness.js";
import { resolveRedis } from "./redis.js";
import { loadClusterEnv, type ClusterEnv } from "./env.js";

const HELP = `rollgate cluster: the all-in-one local cluster (docs/operations.md) in one process tree:
engine-sim (unless ROLLGATE_ENGINES names real engines), the gateway and a worker, on a Redis
(REDIS_URL, or the local default, or a private redis-server it starts itself).

Usage: npm start            (from the repository root)
       rollgate-cluster [--help]

Environment:
  PORT                        gateway port (default 8080; 0 picks a free one)
  HOST                        gateway listen address (default 127.0.0.1)
  REDIS_URL                   Redis to use (default redis://127.0.0.1:6379, else a private one)
  ROLLGATE_ENGINES            JSON list of real engines; unset starts engine-sim
  ROLLGATE_SIM_DP_SIZE        engine-sim data-parallel ranks (default 2)
  ROLLGATE_SIM_PORT           engine-sim port (default: a free one)
  ROLLGATE_WORKER_CONCURRENCY rollouts at once (default 4)
  ROLLGATE_API_KEY            require this key on trainer/admin routes
  ROLLGATE_PUBLIC_URL         how sandboxes reach the gateway
  ROLLGATE_KEY_PREFIX         Redis key prefix (default rg)
  LOG_LEVEL                   app log level (default info)

Prints each engine's state on stdout (a WARNING naming the engine while one cannot serve, repeated
while it lasts) and "rollgate ready: <gateway url>" once every part is up and every engine can
serve (the gateway's /readyz); app logs go to stderr. SIGTERM or SIGINT stops every part.`;

const { values } = parseArgs({ options: { help: { type: "boolean", short: "h" } } });
if (values.help) {
  console.log(HELP);
  process.exit(0);
}
const say = (msg: string) => process.stderr.write(`[cluster] ${msg}\n`);

let env: ClusterEnv;
try {
  env = loadClusterEnv(process.env);
} catch (err) {
  console.error(`rollgate: ${(err as Error).message}`);
  process.exit(2);
}

const appsDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const appMain = (app: string) => path.join(appsDir, app, "dist", "main.js");
/** Every app process, in start order, from the moment it is spawned (a stop during start-up reaches it too). */
const children: { name: string; proc: ChildProcess; graceMs: number }[] = [];
let stopRedis: (() => Promise<void>) | undefined;
let readiness: ReadinessWatch | undefined;
let stopping = false;

async function shutdown(code: number) {
  if (stopping) return;
  stopping = true;
  readiness?.stop();
  // Worker first (it finishes its rollouts), then the gateway, then the engines and Redis.
  for (const child of [...children].reverse()) await stopChild(child.proc, child.graceMs);
  await stopRedis?.();
  process.exit(code);
}
// The worker may let running rollouts finish for its shutdown grace before it cancels them.
const workerGraceMs = (Number(process.env.ROLLGATE_SHUTDOWN_GRACE_S ?? 30) || 30) * 1000 + 15_000;
const track = (name: string, graceMs = 10_000) => (proc: ChildProcess) => {
  children.push({ name, proc, graceMs });
  proc.on("exit", (code, sig) => {
    if (stopping) return;
    say(`${name} exited (${code ?? sig}); stopping the cluster`);
    void shutdown(1);
  });
};
process.on("SIGINT", () => void shutdown(0));
process.on("SIGTERM", () => void shutdown(0));
process.on("SIGHUP", () => void shutdown(0));
watchParent(() => {
  say("the process that started the cluster is gone: stopping");
  void shutdown(0);
});

try {
  const redis = await resolveRedis(env.REDIS_URL, say, (stop) => (stopRedis = stop));
  const base = { ...process.env, REDIS_URL: redis.url, LOG_LEVEL: env.LOG_LEVEL, ROLLGATE_KEY_PREFIX: env.ROLLGATE_KEY_PREFIX };

  let engines = env.ROLLGATE_ENGINES;
  if (!engines) {
    const sim = await startChild(
      "engine-sim",
      process.execPath,
      [appMain("engine-sim"), "--port", String(env.ROLLGATE_SIM_PORT), "--dp", String(env.ROLLGATE_SIM_DP_SIZE)],
      { env: base, ready: /^engine-sim ready: (\S+)/, onSpawn: track("engine-sim") },
    );
    engines = JSON.stringify([{ kind: "vllm", url: sim.ready, dp_size: env.ROLLGATE_SIM_DP_SIZE, profile: "qwen3" }]);
  }
  const gateway = await startChild(
    "gateway",
    process.execPath,
    [appMain("gateway")],
    { env: { ...base, PORT: String(env.PORT), HOST: env.HOST, ROLLGATE_ENGINES: engines }, ready: /^gateway ready: (\S+)/, onSpawn: track("gateway") },
  );
  await startChild(
    "worker",
    process.execPath,
    [appMain("worker")],
    {
      env: { ...base, ROLLGATE_GATEWAY_URL: gateway.ready, ROLLGATE_WORKER_CONCURRENCY: String(env.ROLLGATE_WORKER_CONCURRENCY) },
      ready: /^worker ready: (\S+)/,
      onSpawn: track("worker", workerGraceMs),
    },
  );
  // "ready" only once the gateway can serve: until then, each engine's state and why it is not ready.
  let announced = false;
  readiness = watchReadiness({
    gatewayUrl: gateway.ready,
    print: (line) => console.log(line),
    onReady: () => {
      if (!announced) console.log(`rollgate ready: ${gateway.ready}`);
      announced = true;
    },
  });
} catch (err) {
  say((err as Error).message);
  await shutdown(1);
}
