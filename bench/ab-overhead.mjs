// A paired A/B of the per-call overhead: two gateway builds (this checkout's and the one at
// BENCH_AB_BASE, another checkout of the repo with its own build) on one engine-sim, measured in
// alternating short rounds, so load from outside the benchmark falls on both alike. Reports, per
// concurrency, the median over rounds of each build's p50 and of the paired difference (this − base).
//   BENCH_AB_BASE=../other-checkout node bench/ab-overhead.mjs [rounds] [seconds] [concurrency...]
// With BENCH_AB_INTERLEAVED=1, `rounds` is calls per agent instead, each agent alternating the builds call by call.
import path from "node:path";
import { performance } from "node:perf_hooks";
import { load } from "./lib/load.mjs";
import { startEngineSim, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { openSessions } from "./lib/rollgate.mjs";
import { median, percentile, round } from "./lib/stats.mjs";
import { TTFT_MS, openaiBody } from "./overhead.mjs";

const base = process.env.BENCH_AB_BASE;
if (!base) throw new Error("BENCH_AB_BASE: the other checkout (built) to compare with");
const [rounds = 10, seconds = 2, ...concs] = process.argv.slice(2).map(Number);
const conc = concs.length > 0 ? concs : [1, 16];
const { startGateway: startBase } = await import(path.resolve(base, "bench/lib/procs.mjs"));

/** @type {import("./lib/procs.mjs").Child[]} */
const procs = [];
const prefixes = [uniquePrefix("ab-this"), uniquePrefix("ab-base")];
try {
  const engine = await startEngineSim({ "ttft-ms": TTFT_MS, "tpot-ms": 0, "random-tokens": 16 });
  procs.push(engine);
  const builds = { this: await startGateway({ prefix: prefixes[0], engineUrl: engine.ready }), base: await startBase({ prefix: prefixes[1], engineUrl: engine.ready }) };
  procs.push(builds.this, builds.base);
  const max = Math.max(...conc);
  /** @typedef {(i: number) => { url: string, headers: Record<string, string>, body: string }} Target */
  /** @type {Record<string, Target>} */
  const targets = {};
  for (const [name, gw] of Object.entries(builds)) {
    const sessions = await openSessions(gw.ready, max);
    targets[name] = (i) => ({ url: `${sessions[i].urls.openai}/chat/completions`, headers: { authorization: `Bearer ${sessions[i].token}` }, body: openaiBody });
  }
  targets.direct = () => ({ url: `${engine.ready}/v1/chat/completions`, headers: {}, body: openaiBody });
  // Interleaved calls: each of `c` agents calls this build, then the base, then the engine (the
  // order turning each time), so every pair of calls meets the same load from outside.
  if (process.env.BENCH_AB_INTERLEAVED) {
    const n = rounds;
    for (const c of conc) {
      /** @type {Record<string, number[]>} */
      const lat = { this: [], base: [], direct: [] };
      const one = async (/** @type {string} */ name, /** @type {number} */ i) => {
        const t = /** @type {Target} */ (targets[name])(i);
        const t0 = performance.now();
        const res = await fetch(t.url, { method: "POST", headers: { "content-type": "application/json", ...t.headers }, body: t.body });
        await res.arrayBuffer();
        if (!res.ok) throw new Error(`${name}: HTTP ${res.status}`);
        return performance.now() - t0;
      };
      const agent = async (/** @type {number} */ i) => {
        for (let k = 0; k < n; k++) {
          const order = k % 2 === 0 ? ["this", "base", "direct"] : ["base", "this", "direct"];
          /** @type {Record<string, number>} */
          const got = {};
          for (const name of order) got[name] = await one(name, i);
          if (k >= 5) for (const name of order) lat[name]?.push(got[name] ?? NaN);
        }
      };
      await Promise.all(Array.from({ length: c }, (_, i) => agent(i)));
      const diff = lat.this.map((x, i) => x - (lat.base[i] ?? NaN));
      console.log(
        `c=${c} interleaved, ${lat.this.length} calls each: p50 this ${round(median(lat.this), 3)} ms, base ${round(median(lat.base), 3)} ms, engine ${round(median(lat.direct), 3)} ms; ` +
          `added p50 this ${round(median(lat.this) - median(lat.direct), 3)}, base ${round(median(lat.base) - median(lat.direct), 3)}; paired this − base: median ${round(median(diff), 3)} ms`,
      );
    }
  }
  for (const c of process.env.BENCH_AB_INTERLEAVED ? [] : conc) {
    /** @type {Record<string, number[]>} */
    const p50 = { this: [], base: [], direct: [] };
    for (const name of Object.keys(p50)) await load(Array.from({ length: c }, (_, i) => /** @type {Target} */ (targets[name])(i)), 1);
    for (let r = 0; r < rounds; r++) {
      // Alternating order, so neither build always runs right after the other.
      const order = r % 2 === 0 ? ["this", "base", "direct"] : ["base", "this", "direct"];
      for (const name of order) {
        const res = await load(Array.from({ length: c }, (_, i) => /** @type {Target} */ (targets[name])(i)), seconds);
        if (res.non2xx + res.errors > 0) throw new Error(`${name}: ${res.non2xx} non-2xx, ${res.errors} errors`);
        p50[name]?.push(percentile(res.latencies, 50));
      }
    }
    const diff = p50.this.map((x, i) => x - (p50.base[i] ?? NaN));
    console.log(
      `c=${c}: p50 this ${round(median(p50.this), 3)} ms, base ${round(median(p50.base), 3)} ms, engine ${round(median(p50.direct), 3)} ms; ` +
        `paired this − base: median ${round(median(diff), 3)} ms (rounds: ${diff.map((d) => round(d, 2)).join(" ")})`,
    );
  }
} finally {
  for (const p of procs.reverse()) await stop(p);
  for (const p of prefixes) await dropPrefix(p);
}
