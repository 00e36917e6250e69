// Syscalls and CPU per call of the process in the middle (the bare proxy, rollgate's gateway) under
// the overhead bench's load (engine-sim TTFT 20 ms, 16 tokens, one session per connection). What a
// --cpu-prof does not show: how many reads, writes, event-loop wakeups and thread wake-ups a call
// costs, and how its CPU splits between user and kernel time. Not part of `npm run bench`.
//   node bench/syscalls.mjs                     (BENCH_CONC=16,64, BENCH_DURATION_S=5)
// Two passes per target: one untraced (user/system CPU per call from /proc; strace slows the
// process several-fold), then one under `strace -c -f` (every thread of the process).
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { load } from "./lib/load.mjs";
import { startEngineSim, startFastifyProxy, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { openSessions } from "./lib/rollgate.mjs";
import { printTable, round, sleep } from "./lib/stats.mjs";
import { anthropicBody, openaiBody, TTFT_MS } from "./overhead.mjs";

const env = process.env;
const concs = (env.BENCH_CONC ?? "16,64").split(",").map(Number);
const durationS = Number(env.BENCH_DURATION_S ?? 5);
if (spawnSync("strace", ["-V"], { stdio: "ignore" }).status !== 0) throw new Error("strace is required");

/**
 * User and system CPU of a process in ms (/proc/<pid>/stat, clock ticks of 10 ms).
 * @param {number} pid
 */
function cpuSplit(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { user: Number(f[11]) * 10, sys: Number(f[12]) * 10 };
}

/**
 * `strace -c` output → calls per syscall.
 * @param {string} text
 */
function parseStraceSummary(text) {
  /** @type {Record<string, number>} */
  const out = {};
  for (const line of text.split("\n")) {
    // % time, seconds, usecs/call, calls, [errors], syscall
    const m = /^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?([a-z_0-9]+)\s*$/.exec(line);
    if (m && m[2] !== "total") out[m[2]] = Number(m[1]);
  }
  return out;
}

const prefix = uniquePrefix("syscalls");
const dir = mkdtempSync(path.join(os.tmpdir(), "rollgate-strace-"));
/** @type {import("./lib/procs.mjs").Child[]} */
const procs = [];
try {
  const engine = await startEngineSim({ "ttft-ms": TTFT_MS, "random-tokens": 16 });
  procs.push(engine);
  const [proxy, gateway] = await Promise.all([startFastifyProxy(engine.ready), startGateway({ prefix, engineUrl: engine.ready })]);
  procs.push(proxy, gateway);
  const maxConc = Math.max(...concs);
  const oa = await openSessions(gateway.ready, maxConc);
  const an = await openSessions(gateway.ready, maxConc);
  /** @type {Record<string, { proc: import("./lib/procs.mjs").Child, conn: (i: number) => import("./lib/load.mjs").Target }>} */
  const targets = {
    fastify_proxy: { proc: proxy, conn: () => ({ url: `${proxy.ready}/v1/chat/completions`, body: openaiBody }) },
    rollgate: { proc: gateway, conn: (i) => ({ url: `${oa[i].urls.openai}/chat/completions`, headers: { authorization: `Bearer ${oa[i].token}` }, body: openaiBody }) },
    rollgate_anthropic: {
      proc: gateway,
      conn: (i) => ({ url: `${an[i].urls.anthropic}/v1/messages`, headers: { "x-api-key": an[i].token, "anthropic-version": "2023-06-01" }, body: anthropicBody }),
    },
  };
  /** @type {unknown[][]} */
  const rows = [];
  const names = ["read", "write", "writev", "epoll_pwait", "futex"];
  for (const c of concs) {
    for (const [name, t] of Object.entries(targets)) {
      const conns = Array.from({ length: c }, (_, i) => t.conn(i));
      const pid = /** @type {number} */ (t.proc.proc.pid);
      await load(conns, 2);
      const a = cpuSplit(pid);
      const plain = await load(conns, durationS);
      const b = cpuSplit(pid);
      const file = path.join(dir, `${name}-${c}.txt`);
      const tracer = spawn("strace", ["-c", "-f", "-o", file, "-p", String(pid)], { stdio: "ignore" });
      await sleep(500); // attached to every thread before the load starts
      const traced = await load(conns, durationS);
      tracer.kill("SIGINT");
      await new Promise((r) => tracer.once("exit", r));
      const counts = parseStraceSummary(readFileSync(file, "utf8"));
      const per = (/** @type {number} */ n) => round(n / Math.max(1, traced.ok), 2);
      const total = Object.values(counts).reduce((x, y) => x + y, 0);
      const rest = total - names.reduce((x, n) => x + (counts[n] ?? 0), 0);
      rows.push([
        c,
        name,
        round(plain.rps, 0),
        round((b.user - a.user) / Math.max(1, plain.ok), 3),
        round((b.sys - a.sys) / Math.max(1, plain.ok), 3),
        ...names.map((n) => per(counts[n] ?? 0)),
        per(rest),
        per(total),
      ]);
    }
  }
  printTable(
    `Syscalls per call of the process in the middle (strace -c -f; CPU from an untraced pass of ${durationS} s)`,
    ["conc", "target", "req/s", "user ms/call", "sys ms/call", ...names, "other", "total"],
    rows,
  );
} finally {
  for (const p of procs.reverse()) await stop(p);
  await dropPrefix(prefix);
  rmSync(dir, { recursive: true, force: true });
}
