// 7. Orchestration CPU per rollout: what the worker and the gateway spend on one rollout besides
// the agent's and evaluator's own processes. A trivial agent (`true`: no LLM call, no output), no
// evaluator, local runtime; tasks submitted in batches and run by one worker. CPU from
// /proc/<pid>/stat of the gateway, the worker and the worker's spawner helper (the long-lived child
// that forks the sandboxes' processes off the worker's event loop), per rollout; the sandboxes'
// own CPU (reaped children) is shown beside it, not counted. Also the worker's event-loop delay
// while rollouts start (what a synchronous spawn on the event loop costs the other rollouts).
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { BENCH_DIR, procCpu, startEngineSim, startGateway, startWorker, stop } from "./lib/procs.mjs";
import { dropPrefix, redisClient, uniquePrefix } from "./lib/redis.mjs";
import { api } from "./lib/rollgate.mjs";
import { median, printTable, round, sleep } from "./lib/stats.mjs";
import { newestProfile, printProfile, summarizeProfile } from "./lib/cpuprofile.mjs";
import { monitorEventLoopDelay, performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import { REPO_ROOT } from "./lib/procs.mjs";

void BENCH_DIR;
const TERMINAL = new Set(["completed", "failed", "timed_out", "cancelled"]);
const GOAL_MS = 5;

/** @param {string[]} command */
const task = (command) => ({ instruction: "nothing", agent: { harness: "command", command }, evaluator: null, limits: { timeout_s: 60 } });

/**
 * Live child processes of `pid` whose command line contains `marker` (the worker's spawner helper).
 * @param {number} pid
 * @param {string} marker
 */
function helperPids(pid, marker) {
  /** @type {number[]} */
  const out = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      if (ppid !== pid) continue;
      if (readFileSync(`/proc/${d}/cmdline`, "utf8").includes(marker)) out.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/**
 * @param {{ gateway: number, worker: number }} pids
 * @returns {Record<string, number>}
 */
function cpuOf(pids) {
  const g = procCpu(pids.gateway);
  const w = procCpu(pids.worker);
  const helpers = helperPids(pids.worker, "spawner").map((p) => procCpu(p));
  return {
    gateway: g.self,
    worker: w.self,
    spawner: helpers.reduce((a, x) => a + x.self, 0),
    // the sandboxes' processes, reaped by the worker or by its spawner
    sandboxes: w.children + helpers.reduce((a, x) => a + x.children, 0),
  };
}

/**
 * Submits `n` tasks in batches of at most 100 and waits until all are terminal.
 * @param {string} gatewayUrl
 * @param {string} prefix
 * @param {number} n
 * @param {string[]} command
 */
async function batch(gatewayUrl, prefix, n, command) {
  const redis = redisClient();
  try {
    /** @type {string[]} */
    const ids = [];
    for (let i = 0; i < n; i += 100) {
      const res = /** @type {{ tasks: { id: string }[] }} */ (
        await api(gatewayUrl, "/v1/tasks/batch", { method: "POST", body: { tasks: Array.from({ length: Math.min(100, n - i) }, () => task(command)) } })
      );
      ids.push(...res.tasks.map((t) => t.id));
    }
    const t0 = Date.now();
    const deadline = Date.now() + 300_000;
    for (;;) {
      const pipe = redis.pipeline();
      for (const id of ids) pipe.hget(`${prefix}:{t:${id}}:task`, "status");
      const rows = /** @type {[Error | null, string | null][]} */ (await pipe.exec()).map(([, v]) => v);
      if (rows.every((s) => TERMINAL.has(/** @type {string} */ (s)))) {
        /** @type {Record<string, number>} */
        const statuses = {};
        for (const s of rows) statuses[/** @type {string} */ (s)] = (statuses[/** @type {string} */ (s)] ?? 0) + 1;
        return { statuses, seconds: (Date.now() - t0) / 1000 };
      }
      if (Date.now() > deadline) throw new Error(`orchestration: tasks not terminal after 300 s`);
      await sleep(100);
    }
  } finally {
    redis.disconnect();
  }
}

/**
 * One round of one worker configuration: a fresh worker, a warm-up batch, then `tasks` rollouts;
 * CPU per rollout of each process. With `profile`, the worker runs with --cpu-prof and its top
 * functions are printed (profiled rounds are not counted). `root`: the checkout whose worker runs.
 * @param {{ gatewayUrl: string, gatewayPid: number, prefix: string, label: string, env: Record<string, string>, tasks: number, concurrency: number, command: string[], profile?: boolean, root?: string }} o
 */
async function oneRound(o) {
  const profDir = o.profile ? mkdtempSync(path.join(os.tmpdir(), "rollgate-prof-orch-")) : null;
  const t0 = Date.now();
  /** @type {import("./lib/procs.mjs").Child | null} */
  let worker = await startWorker({
    prefix: o.prefix,
    gatewayUrl: o.gatewayUrl,
    name: o.label.replace(/\W+/g, "-"),
    env: { ROLLGATE_WORKER_CONCURRENCY: String(o.concurrency), ...o.env },
    nodeArgs: profDir ? ["--cpu-prof", `--cpu-prof-dir=${profDir}`] : [],
    ...(o.root ? { root: o.root } : {}),
  });
  try {
    const pids = { gateway: o.gatewayPid, worker: /** @type {number} */ (worker.proc.pid) };
    await batch(o.gatewayUrl, o.prefix, o.concurrency * 4, o.command); // warm-up (JIT, connections, the spawner)
    const skipMs = Date.now() - t0;
    const c0 = cpuOf(pids);
    const x = await batch(o.gatewayUrl, o.prefix, o.tasks, o.command);
    const c1 = cpuOf(pids);
    if ((x.statuses.completed ?? 0) !== o.tasks) throw new Error(`${o.label}: not every rollout completed: ${JSON.stringify(x.statuses)}`);
    const per = Object.fromEntries(Object.keys(c0).map((k) => [k, (c1[k] - c0[k]) / o.tasks]));
    per.orchestration = per.gateway + per.worker + per.spawner;
    per.rollouts_per_s = o.tasks / x.seconds;
    await stop(worker);
    worker = null;
    const file = profDir ? newestProfile(profDir) : null;
    if (file) printProfile(`7b. worker --cpu-prof, ${o.label}`, summarizeProfile(file, { skipMs }), printTable);
    keepProfile(file, "worker");
    return per;
  } finally {
    await stop(worker);
    if (profDir) rmSync(profDir, { recursive: true, force: true });
  }
}

/**
 * BENCH_PROFILE_DIR=<folder>: the profiles are copied there too (for a closer look than the tables).
 * @param {string | null} file
 * @param {string} what
 */
function keepProfile(file, what) {
  const dir = process.env.BENCH_PROFILE_DIR;
  if (file && dir) copyFileSync(file, path.join(dir, `${what}-${Date.now()}.cpuprofile`));
}

/**
 * What one step's start costs the event loop that starts it: `steps` sequential `true` steps through
 * the worker's own runProcess (its built dist), forked by this process or by a spawner; the event
 * loop's delay while they run (a timer every 1 ms notices each block) and the CPU of this process
 * and of the spawner per step.
 * @param {number} steps
 */
async function stepCost(steps) {
  const { runProcess } = await import(pathToFileURL(path.join(REPO_ROOT, "apps", "worker", "dist", "sandbox", "process.js")).href);
  const { Spawner } = await import(pathToFileURL(path.join(REPO_ROOT, "apps", "worker", "dist", "sandbox", "spawner.js")).href);
  const spawner = new Spawner();
  /** @type {Record<string, Record<string, number>>} */
  const out = {};
  try {
    for (const [label, via] of /** @type {[string, unknown][]} */ ([["forked by the worker", null], ["spawner", spawner]])) {
      const base = { argv: ["true"], cwd: os.tmpdir(), env: { PATH: process.env.PATH ?? "/usr/bin:/bin" }, timeoutMs: 10_000, spawner: via };
      for (let i = 0; i < 20; i++) await runProcess(base); // warm-up (and the spawner's start)
      const spawnerPid = helperPids(process.pid, "spawner")[0];
      const h = monitorEventLoopDelay({ resolution: 1 });
      const tick = setInterval(() => {}, 1);
      const cpu0 = process.cpuUsage();
      const s0 = spawnerPid ? procCpu(spawnerPid).self : 0;
      const t0 = performance.now();
      h.enable();
      for (let i = 0; i < steps; i++) await runProcess(base);
      h.disable();
      clearInterval(tick);
      const cpu = process.cpuUsage(cpu0);
      out[label] = {
        loop_delay_max_ms: round(h.max / 1e6, 2),
        loop_delay_p99_ms: round(h.percentile(99) / 1e6, 2),
        loop_delay_mean_ms: round(h.mean / 1e6, 2),
        this_process_cpu_ms_per_step: round((cpu.user + cpu.system) / 1000 / steps, 2),
        spawner_cpu_ms_per_step: round(spawnerPid ? (procCpu(spawnerPid).self - s0) / steps : 0, 2),
        wall_ms_per_step: round((performance.now() - t0) / steps, 2),
      };
    }
  } finally {
    spawner.close();
  }
  printTable(
    `7c. One step's start, ${steps} sequential \`true\` steps through the worker's runProcess (event-loop delay seen by a 1 ms timer; CPU per step)`,
    ["started", "loop delay max ms", "p99", "mean", "CPU ms/step: this process", "spawner", "wall ms/step"],
    Object.entries(out).map(([k, s]) => [k, s.loop_delay_max_ms, s.loop_delay_p99_ms, s.loop_delay_mean_ms, s.this_process_cpu_ms_per_step, s.spawner_cpu_ms_per_step, s.wall_ms_per_step]),
  );
  return out;
}

/** @param {{ quick?: boolean, profile?: boolean }} [options] */
export async function run({ quick = false, profile = !quick } = {}) {
  const cfg = quick ? { rounds: 2, tasks: 40, concurrency: 4 } : { rounds: 5, tasks: 200, concurrency: 4 };
  // For quicker side-by-side runs (defaults unchanged): BENCH_ROUNDS=3, BENCH_TASKS=200,
  // BENCH_PROFILE=0|1, BENCH_STEPS=0 (skips 7c), and BENCH_AB_ROOT=<another checkout, built>: then
  // its gateway and worker (spawner helper) are measured against this checkout's, each with a
  // gateway of its own, round by round.
  const env = process.env;
  if (env.BENCH_ROUNDS) cfg.rounds = Number(env.BENCH_ROUNDS);
  if (env.BENCH_TASKS) cfg.tasks = Number(env.BENCH_TASKS);
  if (env.BENCH_PROFILE) profile = env.BENCH_PROFILE === "1";
  const abRoot = env.BENCH_AB_ROOT;
  const prefix = uniquePrefix("orch");
  const engine = await startEngineSim({ "random-tokens": 8 });
  const [gateway, gatewayAb] = await Promise.all([
    startGateway({ prefix, engineUrl: engine.ready }),
    abRoot ? startGateway({ prefix: `${prefix}-ab`, engineUrl: engine.ready, root: abRoot }) : null,
  ]);
  try {
    const command = ["true"];
    const here = { gatewayUrl: gateway.ready, gatewayPid: /** @type {number} */ (gateway.proc.pid), prefix };
    /** @type {[string, Record<string, string>, typeof here & { root?: string }][]} */
    const variants = gatewayAb && abRoot
      ? [
          ["A/B root (spawner helper)", { ROLLGATE_SANDBOX_SPAWNER: "on" }, { gatewayUrl: gatewayAb.ready, gatewayPid: /** @type {number} */ (gatewayAb.proc.pid), prefix: `${prefix}-ab`, root: abRoot }],
          ["this checkout (spawner helper)", { ROLLGATE_SANDBOX_SPAWNER: "on" }, here],
        ]
      : [
          ["spawn on the event loop", { ROLLGATE_SANDBOX_SPAWNER: "off" }, here],
          ["spawner helper", { ROLLGATE_SANDBOX_SPAWNER: "on" }, here],
        ];
    const common = { command, tasks: cfg.tasks, concurrency: cfg.concurrency };
    // The gateways warm up first (JIT), then the configurations alternate round by round, so
    // neither gets a colder gateway or a quieter minute of the shared machine.
    for (const [, , gw] of variants.slice(gatewayAb ? 0 : 1)) await oneRound({ ...common, ...gw, label: "gateway warm-up", env: {} });
    /** @type {Record<string, Record<string, number>[]>} */
    const rounds = Object.fromEntries(variants.map(([label]) => [label, []]));
    for (let r = 0; r < cfg.rounds; r++) {
      for (const [label, env, gw] of variants) {
        const per = await oneRound({ ...common, ...gw, label, env });
        rounds[label].push(per);
        process.stderr.write(`orchestration: ${label} round ${r + 1}: ${round(per.orchestration, 2)} ms/rollout (gateway ${round(per.gateway, 2)}, worker ${round(per.worker, 2)}, spawner ${round(per.spawner, 2)})\n`);
      }
    }
    /** @type {Record<string, Record<string, number>>} */
    const summary = Object.fromEntries(
      Object.entries(rounds).map(([label, rs]) => [label, Object.fromEntries(Object.keys(rs[0]).map((k) => [k, round(median(rs.map((x) => x[k])), 2)]))]),
    );
    if (profile) {
      for (const [label, env, gw] of variants) await oneRound({ ...common, ...gw, label, env, profile: true });
      await profileGateway({ ...common, engineUrl: engine.ready, prefix: `${prefix}-prof`, env: variants[1][1] });
    }
    const base = summary[variants[0][0]];
    printTable(
      `7. Orchestration CPU per rollout (agent \`true\`, no evaluator, local runtime, 1 worker × ${cfg.concurrency} slots; ${cfg.tasks} rollouts/round, medians of ${cfg.rounds}; ms)`,
      ["worker", "orchestration", "gateway", "worker", "spawner", "(sandboxes)", "rollouts/s", `÷ ${variants[0][0]}`],
      Object.entries(summary).map(([k, s]) => [k, s.orchestration, s.gateway, s.worker, s.spawner, s.sandboxes, round(s.rollouts_per_s, 1), round(s.orchestration / base.orchestration, 2)]),
    );
    const stepCount = env.BENCH_STEPS ? Number(env.BENCH_STEPS) : quick ? 100 : 400;
    const steps = stepCount > 0 ? await stepCost(stepCount) : null;
    const best = summary[variants[1][0]].orchestration;
    const targets = { orchestration_cpu_le_5_ms: { value: best, met: best <= GOAL_MS } };
    console.log(`targets: ${JSON.stringify(targets)}`);
    return { config: { ...cfg, agent: command, ...(abRoot ? { ab: true } : {}) }, summary, rounds, step_start: steps, targets };
  } finally {
    await stop(gateway);
    await stop(gatewayAb);
    await stop(engine);
    await dropPrefix(prefix);
    if (abRoot) await dropPrefix(`${prefix}-ab`);
  }
}

/**
 * The gateway's profile during one round: a gateway of its own with --cpu-prof (stopped to write
 * it), the warm-up round left out.
 * @param {{ engineUrl: string, prefix: string, env: Record<string, string>, tasks: number, concurrency: number, command: string[] }} o
 */
async function profileGateway(o) {
  const profDir = mkdtempSync(path.join(os.tmpdir(), "rollgate-prof-orch-gw-"));
  const t0 = Date.now();
  /** @type {import("./lib/procs.mjs").Child | null} */
  let gw = await startGateway({ prefix: o.prefix, engineUrl: o.engineUrl, nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${profDir}`] });
  try {
    const common = { ...o, gatewayUrl: gw.ready, gatewayPid: /** @type {number} */ (gw.proc.pid) };
    await oneRound({ ...common, label: "gateway warm-up (profiled)" });
    const skipMs = Date.now() - t0;
    await oneRound({ ...common, label: "gateway profiled" });
    await stop(gw);
    gw = null;
    const file = newestProfile(profDir);
    if (file) printProfile("7b. gateway --cpu-prof", summarizeProfile(file, { skipMs }), printTable);
    keepProfile(file, "gateway");
  } finally {
    await stop(gw);
    rmSync(profDir, { recursive: true, force: true });
    await dropPrefix(o.prefix);
  }
}
