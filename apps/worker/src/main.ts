#!/usr/bin/env node
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { callbackQueue, createRedis } from "@rollgate/queue";
import { TaskStore } from "@rollgate/store";
import closeWithGrace from "close-with-grace";
import { pino } from "pino";
import { configureEgress, hostAddressDenials, infrastructureDenials, parseEgressPolicy } from "./egress.js";
import { loadWorkerEnv } from "./env.js";
import { FailureCounter } from "./failure-counter.js";
import { GatewayClient } from "./gateway-client.js";
import { GatewayReadiness } from "./readiness.js";
import { defaultSandboxPath } from "./sandbox/environment.js";
import { KubeConfig } from "@kubernetes/client-node";
import type { RolloutDeps } from "./rollout.js";
import { DockerRuntime, dockerFromHost } from "./sandbox/docker-runtime.js";
import { KubernetesRuntime } from "./sandbox/kubernetes-runtime.js";
import { describeBwrap, probeBwrap } from "./sandbox/isolation.js";
import { LocalRuntime } from "./sandbox/local-runtime.js";
import { sharedSpawner } from "./sandbox/spawner.js";
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
  ROLLGATE_SANDBOX_BINDS       more host paths bwrap sandboxes see read-only (comma list; they always see
                               the system folders, node, the folders on the sandbox PATH)
  ROLLGATE_EVALUATOR_BINDS     host paths only the evaluators of bwrap sandboxes see read-only (comma list;
                               hidden tests: the agent can read ROLLGATE_SANDBOX_BINDS)
  ROLLGATE_SANDBOX_TMPFS_MB    the most a bwrap sandbox's /tmp and /dev/shm each hold, in MiB (default 512;
                               they are the host's memory)
  ROLLGATE_SANDBOX_MAX_PROCS   the most processes (threads included) a bwrap sandbox runs at once (default
                               4096)
  ROLLGATE_SANDBOX_PROCESS_MEMORY_MB the most memory each process of a bwrap sandbox may take, in MiB
                               (default 8192; 0: no limit; RLIMIT_DATA)
  ROLLGATE_SANDBOX_DISK_MB     the most a local sandbox keeps in its folders, in MiB: they then live on a
                               tmpfs of that size the worker mounts (root only; default 0: no cap)
  ROLLGATE_SANDBOX_INODES      with ROLLGATE_SANDBOX_DISK_MB: the most files and folders (default 131072)
  ROLLGATE_SANDBOX_UID, _GID   the unprivileged user and group a root worker runs bwrap sandboxes as, so the
                               process limit binds them (default 65534, nobody / nogroup)
  ROLLGATE_SANDBOX_SPAWNER     on: local sandboxes' programs are started by a helper process, off the worker's
                               event loop (default; python3 when on the PATH, else node); off: the worker
                               forks them itself
  ROLLGATE_SANDBOX_EGRESS_DENY destinations no sealed sandbox reaches whatever runtime.egress says (CIDRs,
                               IPs, hosts, *.domain; loopback, metadata, Redis and the gateway always)
  ROLLGATE_RESULT_TTL_S        how long results are kept (default 7 days)
  ROLLGATE_CALLBACK_ATTEMPTS   callback delivery attempts (default 12)
  ROLLGATE_CALLBACK_BACKOFF_MS first callback retry delay, doubled each time (default 1000)
  ROLLGATE_SHUTDOWN_GRACE_S    on SIGTERM, how long running rollouts may finish before being cancelled (default 30)
  ROLLGATE_JOB_LOCK_MS         BullMQ job lock; a dead worker's rollout is recovered after about this (default 30000)
  ROLLGATE_STALLED_INTERVAL_MS how often workers look for stalled rollouts (default 15000)
  ROLLGATE_RUNTIMES            runtime.kinds this worker runs: comma list of local,docker,kubernetes (default local)
  DOCKER_HOST                  docker runtime: the engine (default unix:///var/run/docker.sock; tcp://host:port)
  ROLLGATE_DOCKER_NETWORK      docker runtime: network of runtime.network "host" containers (default bridge);
                               sealed ones (the default) get an internal network of their own
  ROLLGATE_DOCKER_RELAY_CONTAINER docker runtime: this worker's own container (name, id, or "self"), when it
                               runs in one: it joins each sealed sandbox's network to serve its relay
                               (default: the worker runs on the Docker host and serves it on the
                               network's gateway address)
  ROLLGATE_K8S_NAMESPACE       kubernetes runtime: namespace of sandbox pods (default rollgate-sandboxes)
  ROLLGATE_K8S_MAX_PODS        kubernetes runtime: pods at once per worker (default: the concurrency)
  ROLLGATE_K8S_START_TIMEOUT_S kubernetes runtime: how long a pod may take to run (default 300)
  ROLLGATE_CALLBACK_ALLOW      where callbacks and http evaluators may go: CIDRs, IPs, hosts, *.domain, or * (default *)
  ROLLGATE_CALLBACK_DENY       more destinations to refuse (link-local and cloud metadata are always refused)
  ROLLGATE_READINESS_POLL_MS   how often to ask the gateway's /readyz; rollouts are taken only while it is ready (default 2000; 0: always)
  LOG_LEVEL                    fatal|error|warn|info|debug|trace|silent (default info)

Prints "worker ready: <name>" once connected; it takes rollouts while the gateway's /readyz says it
can serve (until then, and whenever it cannot, the queue holds them). The retry budget of a rollout
is the gateway's ROLLGATE_ROLLOUT_ATTEMPTS. SIGTERM/SIGINT: stop taking jobs, let running rollouts
finish for ROLLGATE_SHUTDOWN_GRACE_S, then cancel them (status "cancelled" with the reason).`;

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

// Callbacks and http evaluators go only where ROLLGATE_CALLBACK_ALLOW / _DENY let them (egress.ts).
try {
  configureEgress(parseEgressPolicy(env.ROLLGATE_CALLBACK_ALLOW, env.ROLLGATE_CALLBACK_DENY));
} catch (err) {
  console.error(`rollgate-worker: invalid environment: ROLLGATE_CALLBACK_ALLOW/DENY: ${(err as Error).message}`);
  process.exit(2);
}

// Session tokens and callback secrets never reach a log line (the sandbox env holds the token).
const log = pino({ level: env.LOG_LEVEL, redact: { paths: ["token", "*.token", "secret", "*.secret", "*.*.secret", "headers.authorization", "*.headers.authorization"], censor: "[REDACTED]" } });
const name = env.ROLLGATE_WORKER_NAME ?? `${os.hostname()}-${process.pid}`;
const installRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const connection = createRedis(env.REDIS_URL, "worker");
connection.on("error", (err) => log.warn({ err: err.message }, "redis connection error"));
const tasks = new TaskStore(connection, env.ROLLGATE_KEY_PREFIX);
const sandboxPath = env.ROLLGATE_SANDBOX_PATH ?? defaultSandboxPath(installRoot);

// The sandbox runtimes this worker runs (ROLLGATE_RUNTIMES). Each first sweeps what a crashed worker
// left behind, before any job is taken: container runtimes a predecessor of the same worker name's
// sandboxes, the local runtime those of any dead worker of the same ROLLGATE_SANDBOX_ROOT.
const runtimes: RolloutDeps["runtimes"] = {};
// Never reachable from a sealed sandbox, whatever its runtime.egress: Redis and the gateway (by
// name and address), and ROLLGATE_SANDBOX_EGRESS_DENY (loopback and metadata are built in).
const sandboxEgressDeny = [
  ...(await infrastructureDenials([env.REDIS_URL, env.ROLLGATE_GATEWAY_URL])),
  // The worker's host itself, by every address it has: its services may listen on all of them.
  ...hostAddressDenials(),
  ...env.ROLLGATE_SANDBOX_EGRESS_DENY.split(",").map((r) => r.trim()).filter(Boolean),
];
if (env.ROLLGATE_RUNTIMES.includes("local")) {
  const bwrap = probeBwrap("bwrap", { uid: env.ROLLGATE_SANDBOX_UID, gid: env.ROLLGATE_SANDBOX_GID });
  console.log(describeBwrap(bwrap));
  runtimes.local = new LocalRuntime({
    root: env.ROLLGATE_SANDBOX_ROOT,
    sandboxPath,
    binds: env.ROLLGATE_SANDBOX_BINDS,
    evaluatorBinds: env.ROLLGATE_EVALUATOR_BINDS,
    bwrap,
    tmpfsBytes: env.ROLLGATE_SANDBOX_TMPFS_MB * 1024 * 1024,
    maxProcs: env.ROLLGATE_SANDBOX_MAX_PROCS,
    processMemoryBytes: env.ROLLGATE_SANDBOX_PROCESS_MEMORY_MB * 1024 * 1024,
    ...(env.ROLLGATE_SANDBOX_DISK_MB > 0 ? { diskQuota: { bytes: env.ROLLGATE_SANDBOX_DISK_MB * 1024 * 1024, inodes: env.ROLLGATE_SANDBOX_INODES } } : {}),
    egressDeny: sandboxEgressDeny,
    ...(env.ROLLGATE_SANDBOX_SPAWNER === "off" ? { spawner: null } : {}),
    log,
  });
  // Which spawner runs is decided now (a python3 probe), not on the event loop of the first step.
  if (env.ROLLGATE_SANDBOX_SPAWNER === "on") console.log(`sandbox spawner: ${sharedSpawner().kind}`);
}
if (env.ROLLGATE_RUNTIMES.includes("docker")) {
  runtimes.docker = new DockerRuntime({
    docker: dockerFromHost(env.DOCKER_HOST),
    defaultNetwork: env.ROLLGATE_DOCKER_NETWORK,
    // "self": this worker's own container, whose id Docker makes its hostname.
    ...(env.ROLLGATE_DOCKER_RELAY_CONTAINER ? { relayContainer: env.ROLLGATE_DOCKER_RELAY_CONTAINER === "self" ? os.hostname() : env.ROLLGATE_DOCKER_RELAY_CONTAINER } : {}),
    egressDeny: sandboxEgressDeny,
    workerName: name,
    workerPath: sandboxPath,
    log,
  });
}
if (env.ROLLGATE_RUNTIMES.includes("kubernetes")) {
  const kc = new KubeConfig();
  kc.loadFromDefault(); // in a pod: its service account; elsewhere: KUBECONFIG or ~/.kube/config
  runtimes.kubernetes = new KubernetesRuntime({
    kc,
    namespace: env.ROLLGATE_K8S_NAMESPACE,
    maxPods: env.ROLLGATE_K8S_MAX_PODS ?? env.ROLLGATE_WORKER_CONCURRENCY,
    startTimeoutMs: env.ROLLGATE_K8S_START_TIMEOUT_S * 1000,
    egressDeny: sandboxEgressDeny,
    workerName: name,
    workerPath: sandboxPath,
    log,
  });
}
for (const [kind, runtime] of Object.entries(runtimes)) {
  if (!runtime.sweep) continue;
  try {
    const removed = await runtime.sweep();
    if (removed > 0) log.info({ runtime: kind, removed }, "removed sandboxes a crashed worker left behind");
  } catch (err) {
    console.error(`rollgate-worker: the ${kind} runtime is enabled but unusable: ${(err as Error).message}`);
    process.exit(2);
  }
}
const callbacks = callbackQueue({
  connection,
  keyPrefix: env.ROLLGATE_KEY_PREFIX,
  attempts: env.ROLLGATE_CALLBACK_ATTEMPTS,
  backoffMs: env.ROLLGATE_CALLBACK_BACKOFF_MS,
});
const gateway = new GatewayClient(env.ROLLGATE_GATEWAY_URL.replace(/\/+$/, ""), env.ROLLGATE_API_KEY);
const readiness = env.ROLLGATE_READINESS_POLL_MS > 0 ? new GatewayReadiness(gateway, log, env.ROLLGATE_READINESS_POLL_MS) : undefined;
const failures = new FailureCounter();
const workers = new WorkerSet({
  connection,
  keyPrefix: env.ROLLGATE_KEY_PREFIX,
  concurrency: env.ROLLGATE_WORKER_CONCURRENCY,
  lockMs: env.ROLLGATE_JOB_LOCK_MS,
  stalledIntervalMs: env.ROLLGATE_STALLED_INTERVAL_MS,
  log,
  callback: { tasks, log },
  ...(readiness ? { readiness } : {}),
  rollout: {
    tasks,
    gateway,
    failures,
    callbacks,
    workerName: name,
    runtimes,
    sandboxPath,
    resultTtlSeconds: env.ROLLGATE_RESULT_TTL_S,
    log,
    ...(readiness ? { gatewayUnanswered: () => readiness.unanswered } : {}),
  },
});

// close-with-grace's own delay is a last resort above our grace, for a stop that hangs.
closeWithGrace({ delay: env.ROLLGATE_SHUTDOWN_GRACE_S * 1000 + 30_000 }, async ({ signal, err }) => {
  if (err) log.error({ err }, "shutting down after an error");
  log.info({ signal, grace_s: env.ROLLGATE_SHUTDOWN_GRACE_S }, "stopping: no new rollouts; running ones may finish");
  await workers.close(env.ROLLGATE_SHUTDOWN_GRACE_S * 1000);
  await callbacks.close();
  connection.disconnect();
  log.info({ failures: failures.totals() }, "stopped");
});
await workers.waitUntilReady();
await workers.listenForCancels(tasks.cancelChannel());
// Asks the gateway now: the rollout worker starts taking jobs on the first "ready".
await readiness?.start();
console.log(`worker ready: ${name}`);
