// 3. Task throughput: trivial tasks (a command agent making one LLM call) submitted in bulk through
// POST /v1/tasks/batch, run by 1, 2 and 4 worker processes, versus raw BullMQ add → process of
// empty jobs (same Redis, same number of worker processes, same per-process concurrency).
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import { performance } from "node:perf_hooks";
import path from "node:path";
import { Queue } from "bullmq";
import { BENCH_DIR, REDIS_URL, procCpu, start, startEngineSim, startGateway, startWorker, stop } from "./lib/procs.mjs";
import { dropPrefix, redisClient, uniquePrefix } from "./lib/redis.mjs";
import { api } from "./lib/rollgate.mjs";
import { newestProfile, printProfile, summarizeProfile } from "./lib/cpuprofile.mjs";
import { median, printTable, round, sleep } from "./lib/stats.mjs";

const CONCURRENCY = 4;
const TERMINAL = new Set(["completed", "failed", "timed_out", "cancelled"]);

/** The trivial agent: one OpenAI chat call with curl, through the session's base URL. */
const AGENT = [
  "sh",
  "-c",
  `curl -sS -f -o /dev/null -H "authorization: Bearer $OPENAI_API_KEY" -H "content-type: application/json" ` +
    `-d '{"model":"m","messages":[{"role":"user","content":"Say done."}],"max_tokens":8}' "$OPENAI_BASE_URL/chat/completions"`,
];
const task = () => ({ instruction: "Say done.", agent: { harness: "command", command: AGENT }, evaluator: null, limits: { timeout_s: 60 } });

/**
 * @typedef {{ tasks: number, seconds: number, tasks_per_s: number, statuses: Record<string, number>,
 *   median_timings_ms: Record<string, number>, cpu_ms_per_task?: Record<string, number> }} BatchResult
 */

/**
 * Submits `n` tasks in one batch and waits until all are terminal; tasks/s from submit to the last finished_at.
 * @param {string} gatewayUrl
 * @param {string} prefix
 * @param {number} n
 * @param {string} label
 * @returns {Promise<BatchResult>}
 */
async function rollgateBatch(gatewayUrl, prefix, n, label) {
  const redis = redisClient();
  try {
    const t0 = Date.now();
    const res = /** @type {{ tasks: { id: string }[] }} */ (await api(gatewayUrl, "/v1/tasks/batch", { method: "POST", body: { tasks: Array.from({ length: n }, () => task()) } }));
    const ids = res.tasks.map((t) => t.id);
    const deadline = Date.now() + 180_000;
    for (;;) {
      const pipe = redis.pipeline();
      for (const id of ids) pipe.hmget(`${prefix}:{t:${id}}:task`, "status", "finished_at");
      const rows = /** @type {[Error | null, (string | null)[]][]} */ (await pipe.exec()).map(([, v]) => v);
      const done = rows.filter(([s]) => TERMINAL.has(/** @type {string} */ (s)));
      if (done.length === ids.length) {
        const last = Math.max(...rows.map(([, f]) => Date.parse(/** @type {string} */ (f))));
        /** @type {Record<string, number>} */
        const statuses = {};
        for (const [s] of rows) statuses[/** @type {string} */ (s)] = (statuses[/** @type {string} */ (s)] ?? 0) + 1;
        // Where a task's time goes, from its own result.timings.
        const pipe2 = redis.pipeline();
        for (const id of ids) pipe2.hget(`${prefix}:{t:${id}}:task`, "result");
        /** @type {Record<string, unknown>[]} */
        const timings = /** @type {[Error | null, string][]} */ (await pipe2.exec()).map(([, v]) => JSON.parse(v)?.timings ?? {});
        const med = (/** @type {string} */ k) => round(median(timings.map((t) => t[k]).filter((x) => typeof x === "number")), 1);
        return {
          tasks: n,
          seconds: (last - t0) / 1000,
          tasks_per_s: n / ((last - t0) / 1000),
          statuses,
          median_timings_ms: { queued: med("queued_ms"), run: med("run_ms"), eval: med("eval_ms"), total: med("total_ms") },
        };
      }
      if (Date.now() > deadline) throw new Error(`${label}: ${done.length}/${ids.length} tasks terminal after 180 s`);
      await sleep(50);
    }
  } finally {
    redis.disconnect();
  }
}

/**
 * CPU ms so far of the gateway, the engine, the worker processes and the sandboxes they reaped.
 * @param {{ gateway: number | undefined, engine: number | undefined, workers: (number | undefined)[] }} pids
 * @returns {Record<string, number>}
 */
function cpuOf(pids) {
  const g = procCpu(pids.gateway);
  const e = procCpu(pids.engine);
  const w = pids.workers.map((pid) => procCpu(pid));
  return { gateway: g.self, engine: e.self, workers: w.reduce((a, x) => a + x.self, 0), sandboxes: w.reduce((a, x) => a + x.children, 0) };
}

/**
 * @param {Queue} queue
 * @param {number} n
 */
async function rawBatch(queue, n) {
  const before = await queue.getCompletedCount();
  const t0 = performance.now();
  await queue.addBulk(Array.from({ length: n }, (_, i) => ({ name: "empty", data: { i } })));
  const deadline = Date.now() + 120_000;
  for (;;) {
    const c = (await queue.getCompletedCount()) - before;
    if (c >= n) break;
    if (Date.now() > deadline) throw new Error(`raw BullMQ: ${c}/${n} after 120 s`);
    await sleep(5);
  }
  const s = (performance.now() - t0) / 1000;
  return { jobs: n, seconds: s, tasks_per_s: n / s };
}

/**
 * One batch through a gateway and one worker both started with --cpu-prof: where a task's CPU goes.
 * @param {string} engineUrl
 * @param {number} tasks
 */
async function profileTasks(engineUrl, tasks) {
  const prefix = uniquePrefix("tasks-prof");
  const gdir = mkdtempSync(path.join(os.tmpdir(), "rollgate-prof-gw-"));
  const wdir = mkdtempSync(path.join(os.tmpdir(), "rollgate-prof-wk-"));
  /** @type {import("./lib/procs.mjs").Child | null} */
  let gateway = null;
  /** @type {import("./lib/procs.mjs").Child | null} */
  let worker = null;
  try {
    const t0 = Date.now();
    gateway = await startGateway({ prefix, engineUrl, nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${gdir}`] });
    worker = await startWorker({ prefix, gatewayUrl: gateway.ready, name: "prof", env: { ROLLGATE_WORKER_CONCURRENCY: String(CONCURRENCY) }, nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${wdir}`] });
    await rollgateBatch(gateway.ready, prefix, CONCURRENCY * 2, "profile warm-up");
    const skipMs = Date.now() - t0;
    const x = await rollgateBatch(gateway.ready, prefix, tasks, "profile");
    await stop(worker);
    worker = null;
    await stop(gateway);
    gateway = null;
    /** @type {Record<string, import("./lib/cpuprofile.mjs").ProfileSummary>} */
    const out = {};
    for (const [name, dir] of [["worker", wdir], ["gateway", gdir]]) {
      const file = newestProfile(dir);
      if (!file) continue;
      out[name] = summarizeProfile(file, { skipMs });
      printProfile(`3b. ${name} --cpu-prof over ${tasks} tasks (${round(x.tasks_per_s, 1)} tasks/s)`, out[name], printTable);
    }
    return out;
  } finally {
    await stop(worker);
    await stop(gateway);
    await dropPrefix(prefix);
    rmSync(gdir, { recursive: true, force: true });
    rmSync(wdir, { recursive: true, force: true });
  }
}

/** @param {{ quick?: boolean, profile?: boolean }} [options] */
export async function run({ quick = false, profile = !quick } = {}) {
  const cfg = quick ? { workers: [1, 2], rounds: 3, tasks: 16, rawJobs: 500 } : { workers: [1, 2, 4], rounds: 3, tasks: 60, rawJobs: 3000 };
  const prefix = uniquePrefix("tasks");
  const rawPrefix = `{${uniquePrefix("tasks-raw")}}`;
  /** @type {import("./lib/procs.mjs").Child[]} */
  const procs = [];
  /** @type {Record<number, { rollgate: Required<BatchResult>[], raw: { jobs: number, seconds: number, tasks_per_s: number }[] }>} */
  const results = {};
  /** @type {Queue | null} */
  let queue = null;
  /** @type {import("ioredis").Redis | null} */
  let queueConn = null;
  try {
    const engine = await startEngineSim({ "random-tokens": 8 });
    procs.push(engine);
    const gateway = await startGateway({ prefix, engineUrl: engine.ready });
    procs.push(gateway);
    queueConn = redisClient();
    queue = new Queue("raw", { connection: queueConn, prefix: rawPrefix });

    for (const n of cfg.workers) {
      results[n] = { rollgate: [], raw: [] };
      // rollgate workers
      const workers = await Promise.all(
        Array.from({ length: n }, (_, i) => startWorker({ prefix, gatewayUrl: gateway.ready, name: `w${i}`, env: { ROLLGATE_WORKER_CONCURRENCY: String(CONCURRENCY) } })),
      );
      await rollgateBatch(gateway.ready, prefix, n * CONCURRENCY, "warm-up");
      /** @type {import("./lib/procs.mjs").Child[]} */
      const raws = [];
      try {
        for (let r = 0; r < cfg.rounds; r++) {
          const pids = { gateway: gateway.proc.pid, engine: engine.proc.pid, workers: workers.map((w) => w.proc.pid) };
          const cpu0 = cpuOf(pids);
          const x = await rollgateBatch(gateway.ready, prefix, cfg.tasks, `${n} workers`);
          const cpu1 = cpuOf(pids);
          x.cpu_ms_per_task = Object.fromEntries(Object.keys(cpu0).map((k) => [k, round((cpu1[k] - cpu0[k]) / cfg.tasks, 2)]));
          if ((x.statuses.completed ?? 0) !== cfg.tasks) throw new Error(`${n} workers: not every task completed: ${JSON.stringify(x.statuses)}`);
          results[n].rollgate.push(/** @type {Required<BatchResult>} */ (x));
          process.stderr.write(`tasks: ${n} workers round ${r + 1}: ${round(x.tasks_per_s, 1)} tasks/s\n`);
        }
      } finally {
        await Promise.all(workers.map((w) => stop(w)));
      }
      // raw BullMQ workers, same count and concurrency
      for (let i = 0; i < n; i++) {
        raws.push(
          await start(`raw-worker-${i}`, [path.join(BENCH_DIR, "servers", "raw-bullmq-worker.mjs")], {
            ready: /^raw worker ready/,
            env: { REDIS_URL, QUEUE_PREFIX: rawPrefix, QUEUE_NAME: "raw", CONCURRENCY: String(CONCURRENCY) },
          }),
        );
      }
      try {
        await rawBatch(queue, Math.min(200, cfg.rawJobs));
        for (let r = 0; r < cfg.rounds; r++) {
          const x = await rawBatch(queue, cfg.rawJobs);
          results[n].raw.push(x);
          process.stderr.write(`tasks: raw BullMQ ${n} workers round ${r + 1}: ${round(x.tasks_per_s, 0)} jobs/s\n`);
        }
      } finally {
        await Promise.all(raws.map((w) => stop(w)));
      }
    }
    /** @type {Record<number, { rollgate_tasks_per_s: number, raw_bullmq_jobs_per_s: number, ratio: number, cpu_ms_per_task: Record<string, number>, median_task_timings_ms: Record<string, number> }>} */
    const summary = {};
    /** @type {unknown[][]} */
    const rows = [];
    for (const n of cfg.workers) {
      const rg = round(median(results[n].rollgate.map((x) => x.tasks_per_s)), 2);
      const raw = round(median(results[n].raw.map((x) => x.tasks_per_s)), 1);
      const runs = results[n].rollgate;
      const cpu = Object.fromEntries(Object.keys(runs[0].cpu_ms_per_task).map((k) => [k, round(median(runs.map((x) => x.cpu_ms_per_task[k])), 1)]));
      const timing = Object.fromEntries(Object.keys(runs[0].median_timings_ms).map((k) => [k, round(median(runs.map((x) => x.median_timings_ms[k])), 1)]));
      summary[n] = { rollgate_tasks_per_s: rg, raw_bullmq_jobs_per_s: raw, ratio: round(rg / raw, 4), cpu_ms_per_task: cpu, median_task_timings_ms: timing };
      rows.push([n, n * CONCURRENCY, rg, raw, summary[n].ratio, timing.total, cpu.gateway, cpu.workers, cpu.sandboxes, cpu.engine]);
    }
    printTable(
      `3. Task throughput (curl agent, 1 LLM call, no evaluator; ${cfg.tasks} tasks/batch vs ${cfg.rawJobs} empty jobs; medians of ${cfg.rounds})`,
      ["workers", "slots", "rollgate tasks/s", "raw BullMQ jobs/s", "ratio", "task total ms", "CPU ms/task: gateway", "workers", "sandbox", "engine"],
      rows,
    );
    const prof = profile ? await profileTasks(engine.ready, cfg.tasks) : null;
    const worst = Math.min(...Object.values(summary).map((s) => s.ratio));
    const targetsCheck = { ratio_ge_0_5_of_raw_bullmq: { value: worst, met: worst >= 0.5 } };
    console.log(`targets: ${JSON.stringify(targetsCheck)}`);
    return { config: { ...cfg, concurrency_per_worker: CONCURRENCY, agent: AGENT }, summary, targets: targetsCheck, raw: results, profile: prof };
  } finally {
    await queue?.close();
    queueConn?.disconnect();
    for (const p of procs.reverse()) await stop(p);
    await dropPrefix(prefix);
    await dropPrefix(rawPrefix.slice(1, -1));
  }
}
