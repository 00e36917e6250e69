// npm run bench [-- <name>...] [--quick] [--no-profile]: runs the benchmarks (all, or the named
// ones), prints a table for each and writes bench/results/<name>.json.
import { writeFileSync, mkdirSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { BENCH_DIR, stopAll } from "./lib/procs.mjs";

const ALL = ["overhead", "streaming", "tasks", "trajectory", "storage", "routing", "orchestration", "sessions", "branching"];
const args = process.argv.slice(2);
const quick = args.includes("--quick");
const profile = args.includes("--no-profile") ? false : undefined;
const names = args.filter((a) => !a.startsWith("--"));
for (const n of names) if (!ALL.includes(n)) throw new Error(`unknown benchmark "${n}" (one of ${ALL.join(", ")})`);

function machine() {
  const cpu = /^model name\s*:\s*(.+)$/m.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? os.cpus()[0]?.model;
  return { nproc: os.availableParallelism(), cpu, node: process.version, loadavg_at_start: os.loadavg().map((x) => Math.round(x * 100) / 100), mem_gib: Math.round(os.totalmem() / 2 ** 30) };
}

const resultsDir = path.join(BENCH_DIR, "results");
mkdirSync(resultsDir, { recursive: true });
const started = Date.now();
let failed = 0;
for (const name of names.length ? names : ALL) {
  const m = machine();
  console.log(`\n# ${name}${quick ? " (quick)" : ""} — ${m.nproc} × ${m.cpu}, Node ${m.node}, loadavg ${m.loadavg_at_start.join(" ")}`);
  const t0 = Date.now();
  try {
    const mod = await import(`./${name}.mjs`);
    const result = await mod.run({ quick, ...(profile === false ? { profile } : {}) });
    const doc = { benchmark: name, date: new Date().toISOString(), quick, machine: { ...m, loadavg_at_end: os.loadavg().map((x) => Math.round(x * 100) / 100) }, duration_s: Math.round((Date.now() - t0) / 1000), ...result };
    writeFileSync(path.join(resultsDir, `${name}${quick ? ".quick" : ""}.json`), `${JSON.stringify(doc, null, 1)}\n`);
  } catch (err) {
    failed++;
    console.error(`\n${name} FAILED: ${err instanceof Error ? err.stack : err}`);
  } finally {
    await stopAll();
  }
}
console.log(`\nbench: done in ${Math.round((Date.now() - started) / 1000)} s${failed ? `, ${failed} failed` : ""}`);
process.exit(failed ? 1 : 0);
