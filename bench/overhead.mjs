// 1. Per-call overhead: the same chat calls straight to engine-sim, through a bare
// @fastify/http-proxy, through the Portkey gateway, and through rollgate (recording on).
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { newestProfile, printProfile, summarizeProfile } from "./lib/cpuprofile.mjs";
import { load } from "./lib/load.mjs";
import { procCpu, startEngineSim, startFastifyProxy, startGateway, startPortkey, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { openSessions } from "./lib/rollgate.mjs";
import { median, percentile, printTable, round } from "./lib/stats.mjs";

export const TTFT_MS = 20;
const MODEL = "Qwen/Qwen3-8B";
const SYSTEM = "You are a careful software engineering agent. Work step by step, run the tests, and keep answers short.";
const USER = "The test suite in repo/ fails on test_parse_dates with a timezone error. Find the cause and describe the fix in two sentences.";

/** Tokens generated per call: 16, or BENCH_TOKENS (with BENCH_TPOT_MS, what a longer streamed answer costs). */
export const OUTPUT_TOKENS = Number(process.env.BENCH_TOKENS ?? 16);
/** BENCH_STREAM=1: every target is asked for a streamed answer (what agent CLIs ask), not a whole one. */
const STREAM = process.env.BENCH_STREAM === "1";

export const openaiBody = JSON.stringify({
  model: MODEL,
  messages: [
    { role: "system", content: SYSTEM },
    { role: "user", content: USER },
  ],
  max_tokens: OUTPUT_TOKENS,
  temperature: 1,
  ...(STREAM ? { stream: true } : {}),
});
/** What rollgate asks the engine for the same call: token ids and logprobs (vLLM extensions). */
export const openaiTokensBody = JSON.stringify({ ...JSON.parse(openaiBody), logprobs: true, top_logprobs: 0, return_token_ids: true });
const streamedTokensBody = JSON.stringify({ ...JSON.parse(openaiTokensBody), stream: true, stream_options: { include_usage: true } });
export const anthropicBody = JSON.stringify({
  model: MODEL,
  system: SYSTEM,
  messages: [{ role: "user", content: USER }],
  max_tokens: OUTPUT_TOKENS,
  temperature: 1,
  ...(STREAM ? { stream: true } : {}),
});

/**
 * @param {string} name
 * @param {string} url
 * @param {Record<string, string>} headers
 * @param {string} body
 */
async function probe(name, url, headers, body) {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });
  const text = await res.text();
  return { name, ok: res.ok, status: res.status, text: text.slice(0, 240) };
}

/** @typedef {{ middle_cpu_ms_per_call: number, engine_cpu_ms_per_call: number, rps: number, p50: number, p99: number, ok: number, non2xx: number, errors: number, first_bad_status: number | null }} Round */
/**
 * @typedef {{ rps: number, p50_ms: number, p99_ms: number, non2xx: number, errors: number, middle_cpu_ms_per_call: number, engine_cpu_ms_per_call: number,
 *   added_p50_ms: number, added_p99_ms: number, added_p50_vs_tokens_ms: number, rps_vs_fastify_proxy: number, rps_vs_portkey: number }} TargetSummary
 */

/** @param {{ quick?: boolean, profile?: boolean }} [options] */
export async function run({ quick = false, profile = !quick } = {}) {
  const cfg = quick
    ? { conc: [1, 16, 64], rounds: 3, durationS: 1, warmupS: 1 }
    : { conc: [1, 16, 64, 256], rounds: 3, durationS: 3, warmupS: 2 };
  // For quicker side-by-side runs (defaults unchanged): BENCH_CONC=16,64, BENCH_ROUNDS=6,
  // BENCH_DURATION_S=3, BENCH_TARGETS=fastify_proxy,rollgate (the names below), and BENCH_AB_ROOT=<another
  // checkout, built>, whose gateway is measured too as rollgate_ab and rollgate_anthropic_ab.
  const env = process.env;
  if (env.BENCH_CONC) cfg.conc = env.BENCH_CONC.split(",").map(Number);
  if (env.BENCH_ROUNDS) cfg.rounds = Number(env.BENCH_ROUNDS);
  if (env.BENCH_DURATION_S) cfg.durationS = Number(env.BENCH_DURATION_S);
  const only = env.BENCH_TARGETS ? new Set(env.BENCH_TARGETS.split(",")) : null;
  const abRoot = env.BENCH_AB_ROOT;
  const together = Boolean(abRoot) && env.BENCH_AB_TOGETHER === "1";
  // BENCH_RATE=<req/s>: every target gets the same total request rate instead of as many as it
  // answers (an A/B at equal load: CPU per call falls as load rises, each wake-up serving more calls).
  const rate = env.BENCH_RATE ? Number(env.BENCH_RATE) : 0;
  // BENCH_TPOT_MS=<ms>: the engine streams its tokens this far apart (default 0: all at once), so
  // each token reaches the gateway as its own chunk, as from a real engine.
  const tpotMs = env.BENCH_TPOT_MS ? Number(env.BENCH_TPOT_MS) : 0;
  // BENCH_NODE_ARGS="<flags>": node flags for this checkout's gateway only, not the _ab one (a V8
  // flag measured side by side: BENCH_AB_ROOT=<this checkout> runs the same build without it).
  const nodeArgs = env.BENCH_NODE_ARGS ? env.BENCH_NODE_ARGS.split(/\s+/).filter(Boolean) : [];
  const maxConc = Math.max(...cfg.conc);
  const prefix = uniquePrefix("overhead");
  /** @type {import("./lib/procs.mjs").Child[]} */
  const procs = [];
  /** @type {string[]} */
  const notes = [];
  try {
    const engine = await startEngineSim({ "ttft-ms": TTFT_MS, "tpot-ms": tpotMs, "random-tokens": OUTPUT_TOKENS });
    procs.push(engine);
    const [proxy, portkey, gateway, gatewayAb] = await Promise.all([
      startFastifyProxy(engine.ready),
      startPortkey(),
      startGateway({ prefix, engineUrl: engine.ready, nodeArgs }),
      abRoot ? startGateway({ prefix: `${prefix}-ab`, engineUrl: engine.ready, root: abRoot }) : null,
    ]);
    procs.push(proxy, portkey, gateway);
    if (gatewayAb) procs.push(gatewayAb);
    const oa = await openSessions(gateway.ready, maxConc);
    const an = await openSessions(gateway.ready, maxConc);
    const oaAb = gatewayAb ? await openSessions(gatewayAb.ready, maxConc) : [];
    const anAb = gatewayAb ? await openSessions(gatewayAb.ready, maxConc) : [];
    const portkeyHeaders = { "x-portkey-provider": "openai", "x-portkey-custom-host": `${engine.ready}/v1`, authorization: "Bearer sk-bench" };

    // Each target: a function of the connection index → {url, headers, body}.
    /** @type {Record<string, (i: number) => import("./lib/load.mjs").Target & { headers: Record<string, string>, body: string }>} */
    const targets = {
      direct: () => ({ url: `${engine.ready}/v1/chat/completions`, headers: {}, body: openaiBody }),
      // The engine request rollgate makes for the same call (token ids + logprobs): engine-side cost.
      direct_tokens: () => ({ url: `${engine.ready}/v1/chat/completions`, headers: {}, body: openaiTokensBody }),
      // The same, streamed: what rollgate asks an engine whose pause mode stamps each token with its
      // weight version (engine-sim's does). Measured when the tokens come apart (BENCH_TPOT_MS).
      ...(tpotMs > 0 ? { direct_streamed_tokens: () => ({ url: `${engine.ready}/v1/chat/completions`, headers: {}, body: streamedTokensBody }) } : {}),
      fastify_proxy: () => ({ url: `${proxy.ready}/v1/chat/completions`, headers: {}, body: openaiBody }),
      portkey: () => ({ url: `${portkey.ready}/v1/chat/completions`, headers: portkeyHeaders, body: openaiBody }),
      rollgate: (i) => ({ url: `${oa[i].urls.openai}/chat/completions`, headers: { authorization: `Bearer ${oa[i].token}` }, body: openaiBody }),
      rollgate_anthropic: (i) => ({
        url: `${an[i].urls.anthropic}/v1/messages`,
        headers: { "x-api-key": an[i].token, "anthropic-version": "2023-06-01" },
        body: anthropicBody,
      }),
    };
    if (gatewayAb) {
      targets.rollgate_ab = (i) => ({ url: `${oaAb[i].urls.openai}/chat/completions`, headers: { authorization: `Bearer ${oaAb[i].token}` }, body: openaiBody });
      targets.rollgate_anthropic_ab = (i) => ({
        url: `${anAb[i].urls.anthropic}/v1/messages`,
        headers: { "x-api-key": anAb[i].token, "anthropic-version": "2023-06-01" },
        body: anthropicBody,
      });
    }
    if (only) for (const name of Object.keys(targets)) if (!only.has(name) && !name.endsWith("_ab")) delete targets[name];
    // One call each before any load: every target must answer 200, or the run says why.
    const probes = await Promise.all([
      ...Object.entries(targets).map(([name, t]) => {
        const x = t(0);
        return probe(name, x.url, x.headers, x.body);
      }),
      probe("portkey_anthropic", `${portkey.ready}/v1/messages`, { ...portkeyHeaders, "anthropic-version": "2023-06-01" }, anthropicBody),
      probe("direct_anthropic", `${engine.ready}/v1/messages`, {}, anthropicBody),
    ]);
    for (const p of probes) {
      if (!p.ok) {
        if (!p.name.endsWith("_anthropic") || p.name === "rollgate_anthropic") throw new Error(`${p.name} probe failed: ${p.status} ${p.text}`);
        notes.push(`${p.name}: not measurable, HTTP ${p.status} ${p.text}`);
      }
    }

    // CPU per call of the process in the middle (proxy, Portkey, gateway) and of the engine.
    /** @type {Record<string, import("./lib/procs.mjs").Child | null>} */
    const middle = { direct: null, direct_tokens: null, direct_streamed_tokens: null, fastify_proxy: proxy, portkey, rollgate: gateway, rollgate_anthropic: gateway, rollgate_ab: gatewayAb, rollgate_anthropic_ab: gatewayAb };
    const cpu = (/** @type {string} */ name) => ({ middle: middle[name] ? procCpu(middle[name].proc.pid).self : 0, engine: procCpu(engine.proc.pid).self });
    /** @type {Record<number, Record<string, Round[]>>} */
    const raw = {}; // raw[c][target] = [{rps, p50, p99, ok, non2xx, errors, cpu}]
    for (const c of cfg.conc) {
      raw[c] = {};
      for (const [name, t] of Object.entries(targets)) {
        raw[c][name] = [];
        const conns = Array.from({ length: c }, (_, i) => t(i));
        await load(conns, cfg.warmupS);
      }
      for (let r = 0; r < cfg.rounds; r++) {
        for (const name of Object.keys(targets)) {
          // BENCH_AB_TOGETHER=1: a gateway and its _ab twin are loaded at the same time (c connections
          // each), so whatever else runs on the machine weighs on both alike; the engine's CPU per
          // call is then that of both together.
          if (together && name.endsWith("_ab")) continue;
          const names = together && targets[`${name}_ab`] ? [name, `${name}_ab`] : [name];
          const conns = names.map((n) => Array.from({ length: c }, (_, i) => (rate ? { ...targets[n](i), rate: rate / c } : targets[n](i))));
          const cpu0 = names.map(cpu);
          const results = await Promise.all(conns.map((cs) => load(cs, cfg.durationS)));
          const cpu1 = names.map(cpu);
          const okAll = results.reduce((a, x) => a + x.ok, 0);
          names.forEach((n, k) => {
            const res = results[k];
            raw[c][n].push({
              middle_cpu_ms_per_call: (cpu1[k].middle - cpu0[k].middle) / Math.max(1, res.ok),
              engine_cpu_ms_per_call: (cpu1[k].engine - cpu0[k].engine) / Math.max(1, okAll),
              rps: res.rps,
              p50: percentile(res.latencies, 50),
              p99: percentile(res.latencies, 99),
              ok: res.ok,
              non2xx: res.non2xx,
              errors: res.errors,
              first_bad_status: res.firstBadStatus,
            });
            process.stderr.write(`overhead c=${c} ${n} round ${r + 1}: ${round(res.rps, 0)} req/s p50 ${round(percentile(res.latencies, 50))} ms\n`);
          });
        }
      }
    }

    /** @type {Record<number, Record<string, TargetSummary>>} */
    const summary = {};
    /** @type {unknown[][]} */
    const rows = [];
    for (const c of cfg.conc) {
      summary[c] = {};
      for (const name of Object.keys(targets)) {
        const runs = raw[c][name];
        // The ratios (added_*, rps_vs_*) are filled in below, once every target has its medians.
        summary[c][name] = /** @type {TargetSummary} */ ({
          rps: round(median(runs.map((x) => x.rps)), 1),
          p50_ms: round(median(runs.map((x) => x.p50)), 3),
          p99_ms: round(median(runs.map((x) => x.p99)), 3),
          non2xx: runs.reduce((a, x) => a + x.non2xx, 0),
          errors: runs.reduce((a, x) => a + x.errors, 0),
          middle_cpu_ms_per_call: round(median(runs.map((x) => x.middle_cpu_ms_per_call)), 3),
          engine_cpu_ms_per_call: round(median(runs.map((x) => x.engine_cpu_ms_per_call)), 3),
        });
      }
      const s = summary[c];
      // A target left out by BENCH_TARGETS gives NaN ratios.
      const none = { p50_ms: NaN, rps: NaN, middle_cpu_ms_per_call: NaN };
      const d = s.direct ?? none;
      for (const name of Object.keys(targets)) {
        const x = s[name];
        x.added_p50_ms = round(x.p50_ms - d.p50_ms, 3);
        x.added_p99_ms = round(x.p99_ms - (s.direct?.p99_ms ?? NaN), 3);
        // Versus the engine doing the same work rollgate asks of it (ids + logprobs).
        x.added_p50_vs_tokens_ms = round(x.p50_ms - (s.direct_tokens ?? none).p50_ms, 3);
        x.rps_vs_fastify_proxy = round(x.rps / (s.fastify_proxy ?? none).rps, 3);
        x.rps_vs_portkey = round(x.rps / (s.portkey ?? none).rps, 3);
        const base = name.startsWith("direct");
        const cpuVsProxy = base ? null : round(x.middle_cpu_ms_per_call / (s.fastify_proxy ?? none).middle_cpu_ms_per_call, 2);
        rows.push([c, name, x.rps, x.p50_ms, x.p99_ms, name === "direct" ? null : x.added_p50_ms, name === "direct" ? null : x.added_p99_ms, base ? null : x.added_p50_vs_tokens_ms, x.rps_vs_fastify_proxy, x.rps_vs_portkey, base ? null : x.middle_cpu_ms_per_call, cpuVsProxy, x.engine_cpu_ms_per_call, x.non2xx + x.errors]);
      }
    }
    printTable(
      `1. Per-call overhead (engine-sim TTFT ${TTFT_MS} ms, ${tpotMs ? `${tpotMs} ms per token, ` : ""}${OUTPUT_TOKENS} tokens${STREAM ? ", streamed answers" : ""}; medians of ${cfg.rounds} runs × ${cfg.durationS} s)`,
      ["conc", "target", "req/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "+p50 vs tok", "×fastify", "×portkey", "proxy CPU ms/call", "CPU ×fastify", "engine CPU ms/call", "errors"],
      rows,
    );
    for (const n of notes) console.log(`note: ${n}`);

    const targetsCheck = goals(summary);
    printTable(
      "1c. Goals (issue 21): each a ratio against the bare proxy or Portkey measured in this run",
      ["goal", "target", "value", "met"],
      Object.entries(targetsCheck).map(([goal, g]) => [goal, g.target, g.value, g.met ? "yes" : "NO"]),
    );
    console.log(`targets: ${JSON.stringify(targetsCheck)}`);

    let prof = null;
    if (profile) prof = await profileGateway(engine.ready, cfg);
    return {
      config: { engine: { ttft_ms: TTFT_MS, tpot_ms: tpotMs, output_tokens: OUTPUT_TOKENS, dp: 1 }, ...cfg },
      summary,
      targets: targetsCheck,
      notes,
      raw,
      profile: prof,
    };
  } finally {
    for (const p of procs.reverse()) await stop(p);
    await dropPrefix(prefix);
    // The side-by-side gateway's keys live under a prefix of their own.
    if (abRoot) await dropPrefix(`${prefix}-ab`);
  }
}

/**
 * The goals, each from this run's medians: gateway CPU per recorded call ≤ 1.5× the bare proxy's
 * at 16 and 64 sessions; throughput ≥ 0.9× the bare proxy and ≥ 2× Portkey at 64; added p50 (over
 * the engine straight) ≤ the bare proxy's added p50 + 1 ms at 1 and 16. OpenAI and Anthropic paths
 * (the bare proxy and Portkey are measured on the OpenAI path). Goals at a concurrency the run did
 * not measure are left out.
 * @param {Record<number, Record<string, TargetSummary>>} summary
 * @returns {Record<string, { target: string, value: number, met: boolean }>}
 */
export function goals(summary) {
  /** @type {Record<string, { target: string, value: number, met: boolean }>} */
  const out = {};
  const paths = /** @type {const} */ ([["openai", "rollgate"], ["anthropic", "rollgate_anthropic"]]);
  for (const c of [16, 64]) {
    const s = summary[c];
    if (!s?.fastify_proxy) continue;
    for (const [path, name] of paths) {
      if (!s[name]) continue;
      const ratio = round(s[name].middle_cpu_ms_per_call / s.fastify_proxy.middle_cpu_ms_per_call, 3);
      out[`cpu_per_call_vs_proxy_${path}_at_${c}`] = { target: "≤ 1.5×", value: ratio, met: ratio <= 1.5 };
    }
  }
  const s64 = summary[64];
  if (s64) {
    for (const [path, name] of paths) {
      if (!s64[name]) continue;
      out[`rps_vs_proxy_${path}_at_64`] = { target: "≥ 0.9×", value: s64[name].rps_vs_fastify_proxy, met: s64[name].rps_vs_fastify_proxy >= 0.9 };
      out[`rps_vs_portkey_${path}_at_64`] = { target: "≥ 2×", value: s64[name].rps_vs_portkey, met: s64[name].rps_vs_portkey >= 2 };
    }
  }
  for (const c of [1, 16]) {
    const s = summary[c];
    if (!s?.fastify_proxy) continue;
    for (const [path, name] of paths) {
      if (!s[name]) continue;
      const over = round(s[name].added_p50_ms - s.fastify_proxy.added_p50_ms, 3);
      out[`added_p50_over_proxy_ms_${path}_at_${c}`] = { target: "≤ 1 ms", value: over, met: over <= 1 };
    }
  }
  return out;
}

/**
 * One c=64 run through a gateway started with --cpu-prof: where the gateway's CPU goes.
 * @param {string} engineUrl
 * @param {{ warmupS: number, durationS: number }} cfg
 */
async function profileGateway(engineUrl, cfg) {
  const prefix = uniquePrefix("overhead-prof");
  const dir = mkdtempSync(path.join(os.tmpdir(), "rollgate-prof-"));
  let gateway = null;
  try {
    const spawned = Date.now();
    gateway = await startGateway({ prefix, engineUrl, nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${dir}`] });
    const ss = await openSessions(gateway.ready, 64);
    const conns = ss.map((s) => ({ url: `${s.urls.openai}/chat/completions`, headers: { authorization: `Bearer ${s.token}` }, body: openaiBody }));
    await load(conns, cfg.warmupS);
    // Start-up, session creation and warm-up are left out of the summary.
    const skipMs = Date.now() - spawned;
    const cpu0 = procCpu(gateway.proc.pid).self;
    const res = await load(conns, cfg.durationS * 2);
    const cpuMs = procCpu(gateway.proc.pid).self - cpu0;
    await stop(gateway);
    gateway = null;
    const file = newestProfile(dir);
    // BENCH_PROFILE_OUT=<file>: keep the raw .cpuprofile (for a closer look in DevTools).
    if (file && process.env.BENCH_PROFILE_OUT) copyFileSync(file, process.env.BENCH_PROFILE_OUT);
    const summary = file ? summarizeProfile(file, { skipMs }) : null;
    const cpuPerCall = round(cpuMs / Math.max(1, res.ok), 3);
    if (summary) {
      // Sample times are wall-clock stacks (a descheduled thread still gets samples), so the shares
      // matter, not the absolute ms; the CPU per call comes from /proc.
      printProfile(`1b. Gateway --cpu-prof at 64 sessions, measured window (${round(res.rps, 0)} req/s, ${cpuPerCall} ms CPU/call from /proc)`, summary, printTable);
    }
    return summary && { rps: round(res.rps, 1), calls: res.ok, cpu_ms_per_call: cpuPerCall, ...summary };
  } finally {
    await stop(gateway);
    await dropPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  }
}
