// Child processes of the benchmarks: every app runs as its own process (as in production), is
// tracked here, and is stopped at the end of its benchmark, or at exit and on failure. Starting and
// stopping one is @rollgate/testkit's, as for the tests and the cluster.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { DEFAULT_REDIS_URL, freePort, startChild, stopChild } from "@rollgate/testkit";

export const BENCH_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
export const REPO_ROOT = path.resolve(BENCH_DIR, "..");
export const REDIS_URL = process.env.REDIS_URL ?? DEFAULT_REDIS_URL;

/** @typedef {import("@rollgate/testkit").StartedChild} Child a process started here */

/** @type {Set<import("node:child_process").ChildProcess>} */
const live = new Set();
const verbose = process.env.BENCH_VERBOSE === "1";

/**
 * Starts a node process and waits for its ready line on stdout (the first capture group, or the
 * line, is returned as `ready`). Its output goes to our stderr only with BENCH_VERBOSE=1; the error
 * of a failed start carries its last lines.
 * @param {string} name
 * @param {string[]} args
 * @param {{ env?: Record<string, string>, ready: RegExp, timeoutMs?: number, nodeArgs?: string[] }} options
 * @returns {Promise<Child>}
 */
export function start(name, args, { env = {}, ready, timeoutMs = 60_000, nodeArgs = [] }) {
  return startChild(name, process.execPath, [...nodeArgs, ...args], {
    env: { ...process.env, LOG_LEVEL: "warn", ...env },
    ready,
    timeoutMs,
    onSpawn: (proc) => {
      live.add(proc);
      proc.once("exit", () => live.delete(proc));
    },
    onLine: (line) => {
      if (verbose) process.stderr.write(`[${name}] ${line}\n`);
    },
  });
}

/**
 * SIGTERM, then SIGKILL after `graceMs`.
 * @param {Child | null | undefined} child
 * @returns {Promise<void>}
 */
export function stop(child, graceMs = 10_000) {
  return child ? stopChild(child.proc, graceMs) : Promise.resolve();
}

export async function stopAll() {
  await Promise.all([...live].map((proc) => stopChild(proc, 5_000)));
}

/** Last resort: whatever is still running when we exit is killed (by its own pid only). */
process.once("exit", () => {
  for (const proc of live) proc.kill("SIGKILL");
});
/** Called on SIGINT/SIGTERM after the children are stopped (redis.mjs drops its key prefixes). */
/** @type {(() => Promise<unknown>)[]} */
const onInterrupt = [];
/** @param {() => Promise<unknown>} fn */
export function atInterrupt(fn) {
  onInterrupt.push(fn);
}
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.once(sig, () => {
    process.stderr.write(`\nbench: ${sig}, stopping ${live.size} child process(es) and removing their Redis keys\n`);
    void stopAll()
      .then(() => Promise.all(onInterrupt.map((fn) => fn().catch(() => {}))))
      .finally(() => process.exit(130));
  });
}

const app = (/** @type {string} */ name, root = REPO_ROOT) => path.join(root, "apps", name, "dist", "main.js");

/**
 * engine-sim: `opts` are its CLI flags, e.g. {dp: 4, "ttft-ms": 20}.
 * @param {Record<string, string | number | boolean>} opts
 */
export function startEngineSim(opts = {}) {
  const flags = Object.entries({ port: 0, "log-level": "warn", ...opts }).flatMap(([k, v]) => [`--${k}`, String(v)]);
  return start("engine-sim", [app("engine-sim"), ...flags], { ready: /^engine-sim ready: (\S+)/ });
}

/**
 * `root`: the checkout whose built gateway runs (another worktree, for side-by-side A/B runs).
 * @param {{ prefix: string, engineUrl: string, kind?: "vllm" | "sglang", dp?: number, env?: Record<string, string>, nodeArgs?: string[], root?: string }} options
 */
export function startGateway({ prefix, engineUrl, kind = "vllm", dp = 1, env = {}, nodeArgs = [], root = REPO_ROOT }) {
  return start("gateway", [app("gateway", root), "--port", "0"], {
    nodeArgs,
    ready: /^gateway ready: (\S+)/,
    env: {
      REDIS_URL,
      ROLLGATE_KEY_PREFIX: prefix,
      // engine-sim serves Qwen3: its profile, as in production.
      ROLLGATE_ENGINES: JSON.stringify([{ kind, url: engineUrl, dp_size: dp, profile: "qwen3" }]),
      ...env,
    },
  });
}

/**
 * `root`: the checkout whose built worker runs (another worktree, for side-by-side A/B runs).
 * @param {{ prefix: string, gatewayUrl: string, name: string, env?: Record<string, string>, nodeArgs?: string[], root?: string }} options
 */
export function startWorker({ prefix, gatewayUrl, name, env = {}, nodeArgs = [], root = REPO_ROOT }) {
  return start(`worker-${name}`, [app("worker", root)], {
    nodeArgs,
    ready: /^worker ready: (\S+)/,
    env: { REDIS_URL, ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_GATEWAY_URL: gatewayUrl, ROLLGATE_WORKER_NAME: name, ...env },
  });
}

/**
 * The bare @fastify/http-proxy pass-through (bench/servers/fastify-proxy.mjs).
 * @param {string} upstream
 */
export function startFastifyProxy(upstream) {
  return start("fastify-proxy", [path.join(BENCH_DIR, "servers", "fastify-proxy.mjs")], {
    ready: /^proxy ready: (\S+)/,
    env: { UPSTREAM: upstream },
  });
}

/** The Portkey gateway from npm (`@portkey-ai/gateway`), headless, on a free port. */
export async function startPortkey() {
  const port = await freePort();
  const entry = path.join(REPO_ROOT, "node_modules", "@portkey-ai", "gateway", "build", "start-server.js");
  const child = await start("portkey", [entry, `--port=${port}`, "--headless"], {
    ready: /Ready for connections/,
    env: { NODE_ENV: "production" },
  });
  child.ready = `http://127.0.0.1:${port}`;
  return child;
}

/**
 * Resident set size of a process, from /proc/<pid>/status (kB → bytes).
 * @param {number | undefined} pid
 */
export function procMemory(pid) {
  if (pid === undefined) throw new Error("procMemory: the process has no pid (it never started)");
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (/** @type {string} */ key) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN) * 1024;
  return { rss: kb("VmRSS"), hwm: kb("VmHWM") };
}

/**
 * CPU time of a process from /proc/<pid>/stat, in ms: its own and that of its reaped children.
 * @param {number | undefined} pid
 */
export function procCpu(pid) {
  if (pid === undefined) throw new Error("procCpu: the process has no pid (it never started)");
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // Fields after the name: state(3) … utime(14) stime(15) cutime(16) cstime(17), 1-based from pid.
  const tick = 10; // ms per clock tick (USER_HZ = 100 on Linux)
  return { self: (Number(f[11]) + Number(f[12])) * tick, children: (Number(f[13]) + Number(f[14])) * tick };
}
