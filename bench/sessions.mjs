// 8. Many agent sessions on one gateway: N concurrent agents, each in its own session (its own
// token), each looping "one chat call, then think (run its tools) for a while", against engine-sim
// with the latency model of a real deployment (time to first token 200 ms, 20 ms per token,
// 16 tokens: ~500 ms per call). The same N agents with the same think time straight to the engine
// (the request body rollgate sends it) give the baseline: added latency = rollgate's percentile −
// the direct percentile, at the same load. Memory per session from the gateway's RSS. Then (full
// mode) 10,000 sessions open on a pair of gateway replicas sharing Redis, each called once through
// the replica that did not open it.
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { Agent, request } from "undici";
import { procCpu, procMemory, startEngineSim, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { openSessions } from "./lib/rollgate.mjs";
import { openaiBody, openaiTokensBody } from "./overhead.mjs";
import { median, percentile, printTable, round, sleep } from "./lib/stats.mjs";
import { newestProfile, printProfile, summarizeProfile } from "./lib/cpuprofile.mjs";

const TTFT_MS = 200;
const TPOT_MS = 20;
const TOKENS = 16;
const P99_GOAL_MS = 50;
/**
 * What rollgate itself asks the engine (vLLM with a "keep" pause mode): the answer streamed, so
 * each token can be stamped with the weight version it came under. Sixteen chunks 20 ms apart cost
 * the engine (and the gateway) more than one whole answer: the second baseline.
 */
const streamedTokensBody = JSON.stringify({ ...JSON.parse(openaiTokensBody), stream: true, stream_options: { include_usage: true } });

/** The load generator's own client: a connection per call in flight, as N separate agents would have. */
const client = new Agent({ connections: null, pipelining: 1, keepAliveTimeout: 30_000, headersTimeout: 60_000, bodyTimeout: 60_000 });

/**
 * @param {string} url
 * @param {Record<string, string>} headers
 * @param {string} body
 * @returns {Promise<number>} the status
 */
async function call(url, headers, body) {
  const res = await request(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body, dispatcher: client });
  await res.body.dump({ limit: Infinity });
  return res.statusCode;
}

/**
 * N closed-loop agents: call, think `thinkMs` (± 50 %, so the calls do not march in step), repeat,
 * for `warmupS + measureS`; latencies of the calls that started in the measure window.
 * @param {{ n: number, thinkMs: number, warmupS: number, measureS: number, target: (i: number) => { url: string, headers: Record<string, string>, body: string } }} o
 */
export async function agents(o) {
  const t0 = performance.now();
  const measureFrom = t0 + o.warmupS * 1000;
  const end = measureFrom + o.measureS * 1000;
  /** @type {number[]} */
  const lat = [];
  /** @type {{ ok: number, bad: number, errors: number, all: number, first: string | null }} */
  const counts = { ok: 0, bad: 0, errors: 0, all: 0, first: null };
  const think = () => o.thinkMs * (0.5 + Math.random());
  await Promise.all(
    Array.from({ length: o.n }, async (_, i) => {
      const t = o.target(i);
      // Agents start spread over one think time.
      await sleep(Math.random() * o.thinkMs);
      while (performance.now() < end) {
        const s = performance.now();
        counts.all++;
        try {
          const status = await call(t.url, t.headers, t.body);
          if (s >= measureFrom) {
            if (status >= 200 && status < 300) {
              lat.push(performance.now() - s);
              counts.ok++;
            } else {
              counts.bad++;
              counts.first ??= `HTTP ${status}`;
            }
          }
        } catch (err) {
          if (s >= measureFrom) {
            counts.errors++;
            counts.first ??= /** @type {Error} */ (err).message;
          }
        }
        await sleep(think());
      }
    }),
  );
  return { lat, ...counts, calls_per_s: (counts.ok + counts.bad + counts.errors) / o.measureS };
}

/** @param {number[]} lat */
const pct = (lat) => ({ p50: percentile(lat, 50), p99: percentile(lat, 99) });

/**
 * 10,000 sessions on two gateway replicas: opened half on each, RSS per open session, then each
 * session called once through the other replica (`parallel` calls at a time).
 * @param {{ engineUrl: string, prefix: string, sessions: number, parallel: number }} o
 */
async function pair(o) {
  const gws = [await startGateway({ prefix: o.prefix, engineUrl: o.engineUrl }), await startGateway({ prefix: o.prefix, engineUrl: o.engineUrl })];
  try {
    const rss0 = gws.map((g) => procMemory(g.proc.pid).rss);
    const half = o.sessions / 2;
    const opened = await Promise.all(gws.map((g) => openSessions(g.ready, half, { parallel: 32 })));
    const rss1 = gws.map((g) => procMemory(g.proc.pid).rss);
    // Each session called once through the replica that did not open it.
    /** @type {{ url: string, token: string }[]} */
    const jobs = [];
    for (const [r, list] of opened.entries()) {
      const other = gws[1 - r].ready;
      for (const s of list) jobs.push({ url: `${other}/s/${encodeURIComponent(s.id)}/v1/chat/completions`, token: s.token });
    }
    /** @type {number[]} */
    const lat = [];
    let bad = 0;
    /** @type {string | null} */
    let first = null;
    let next = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: o.parallel }, async () => {
        while (next < jobs.length) {
          const j = jobs[next++];
          const s = performance.now();
          try {
            const status = await call(j.url, { authorization: `Bearer ${j.token}` }, openaiBody);
            if (status >= 200 && status < 300) lat.push(performance.now() - s);
            else {
              bad++;
              first ??= `HTTP ${status}`;
            }
          } catch (err) {
            bad++;
            first ??= /** @type {Error} */ (err).message;
          }
        }
      }),
    );
    const seconds = (performance.now() - t0) / 1000;
    const rss2 = gws.map((g) => procMemory(g.proc.pid).rss);
    return {
      sessions: o.sessions,
      replicas: 2,
      open_rss_kib_per_session: round((rss1[0] - rss0[0] + rss1[1] - rss0[1]) / o.sessions / 1024, 2),
      after_calls_rss_kib_per_session: round((rss2[0] - rss0[0] + rss2[1] - rss0[1]) / o.sessions / 1024, 2),
      rss_mib: rss2.map((x) => round(x / 2 ** 20, 0)),
      calls_ok: lat.length,
      calls_failed: bad,
      first_failure: first,
      calls_per_s: round(jobs.length / seconds, 0),
      p50_ms: round(percentile(lat, 50), 1),
      p99_ms: round(percentile(lat, 99), 1),
    };
  } finally {
    for (const g of gws) await stop(g);
  }
}

/** @param {{ quick?: boolean, profile?: boolean }} [options] */
export async function run({ quick = false, profile = !quick } = {}) {
  const cfg = quick
    ? { sessions: [200], thinkMs: 1_000, warmupS: 2, measureS: 5, pairSessions: 0, streamedBaseline: false }
    : { sessions: [500, 2000], thinkMs: 3_000, warmupS: 5, measureS: 20, pairSessions: 10_000, streamedBaseline: true };
  // BENCH_SESSIONS=2000[,…] / BENCH_THINK_MS / BENCH_PAIR_SESSIONS: other sizes, for development runs.
  if (process.env.BENCH_SESSIONS) cfg.sessions = process.env.BENCH_SESSIONS.split(",").map(Number);
  if (process.env.BENCH_THINK_MS) cfg.thinkMs = Number(process.env.BENCH_THINK_MS);
  if (process.env.BENCH_PAIR_SESSIONS) cfg.pairSessions = Number(process.env.BENCH_PAIR_SESSIONS);
  const prefix = uniquePrefix("sessions");
  const engine = await startEngineSim({ "ttft-ms": TTFT_MS, "tpot-ms": TPOT_MS, "random-tokens": TOKENS });
  /** @type {import("./lib/procs.mjs").Child | null} */
  let gateway = null;
  try {
    const profDir = profile ? mkdtempSync(path.join(os.tmpdir(), "rollgate-prof-sessions-")) : null;
    gateway = await startGateway({ prefix, engineUrl: engine.ready, nodeArgs: profDir ? ["--cpu-prof", `--cpu-prof-dir=${profDir}`] : [] });
    const gwPid = /** @type {number} */ (gateway.proc.pid);
    const gwUrl = gateway.ready;
    const engineUrl = `${engine.ready}/v1/chat/completions`;
    /** @type {Record<number, Record<string, unknown>>} */
    const summary = {};
    /** @type {unknown[][]} */
    const rows = [];
    const rssStart = procMemory(gwPid).rss;
    let opened = 0;
    /** @type {import("@rollgate/protocol").CreateSessionResponse[]} */
    const sessions = [];
    for (const n of cfg.sessions) {
      // Sessions accumulate: the gateway holds every one opened so far.
      sessions.push(...(await openSessions(gateway.ready, n - opened, { parallel: 32 })));
      opened = n;
      const rssOpen = procMemory(gwPid).rss;
      const direct = await agents({ n, thinkMs: cfg.thinkMs, warmupS: cfg.warmupS, measureS: cfg.measureS, target: () => ({ url: engineUrl, headers: {}, body: openaiTokensBody }) });
      const streamed = cfg.streamedBaseline
        ? await agents({ n, thinkMs: cfg.thinkMs, warmupS: cfg.warmupS, measureS: cfg.measureS, target: () => ({ url: engineUrl, headers: {}, body: streamedTokensBody }) })
        : null;
      const c0 = procCpu(gwPid).self;
      const via = await agents({
        n,
        thinkMs: cfg.thinkMs,
        warmupS: cfg.warmupS,
        measureS: cfg.measureS,
        target: (i) => ({
          url: `${gwUrl}/s/${encodeURIComponent(sessions[i].id)}/v1/chat/completions`,
          headers: { authorization: `Bearer ${sessions[i].token}` },
          body: openaiBody,
        }),
      });
      const cpuMs = procCpu(gwPid).self - c0;
      const rssBusy = procMemory(gwPid).rss;
      const d = pct(direct.lat);
      const g = pct(via.lat);
      const ds = streamed ? pct(streamed.lat) : null;
      summary[n] = {
        think_ms: cfg.thinkMs,
        calls_per_s: round(via.calls_per_s, 0),
        direct: { p50_ms: round(d.p50, 1), p99_ms: round(d.p99, 1), ok: direct.ok, failed: direct.bad + direct.errors, first_failure: direct.first },
        rollgate: { p50_ms: round(g.p50, 1), p99_ms: round(g.p99, 1), ok: via.ok, failed: via.bad + via.errors, first_failure: via.first },
        added_p50_ms: round(g.p50 - d.p50, 1),
        added_p99_ms: round(g.p99 - d.p99, 1),
        direct_streamed: ds && streamed ? { p50_ms: round(ds.p50, 1), p99_ms: round(ds.p99, 1), failed: streamed.bad + streamed.errors } : null,
        added_p99_over_streamed_ms: ds ? round(g.p99 - ds.p99, 1) : null,
        gateway_cpu_ms_per_call: round(cpuMs / Math.max(1, via.all), 2),
        rss_mib: round(rssBusy / 2 ** 20, 0),
        open_rss_kib_per_session: round((rssOpen - rssStart) / n / 1024, 2),
        busy_rss_kib_per_session: round((rssBusy - rssStart) / n / 1024, 2),
      };
      const s = /** @type {any} */ (summary[n]);
      rows.push([n, s.calls_per_s, s.direct.p50_ms, s.rollgate.p50_ms, s.added_p50_ms, s.direct.p99_ms, s.rollgate.p99_ms, s.added_p99_ms, s.direct_streamed ? `${s.direct_streamed.p50_ms} / ${s.direct_streamed.p99_ms}` : null, s.added_p99_over_streamed_ms, `${s.rollgate.failed}/${s.direct.failed}`, s.gateway_cpu_ms_per_call, s.rss_mib, s.busy_rss_kib_per_session]);
      process.stderr.write(`sessions: ${n}: added p50 ${s.added_p50_ms} ms, p99 ${s.added_p99_ms} ms, ${s.rollgate.failed} failed (${s.rollgate.first_failure ?? "none"})\n`);
    }
    printTable(
      `8. Concurrent agent sessions on one gateway (engine-sim TTFT ${TTFT_MS} ms, ${TPOT_MS} ms/token, ${TOKENS} tokens; each agent: call, think ${cfg.thinkMs} ms ± 50 %; ${cfg.measureS} s window; latencies in ms)`,
      ["sessions", "calls/s", "direct p50", "rollgate p50", "added p50", "direct p99", "rollgate p99", "added p99", "engine streamed p50 / p99", "added p99 over streamed", "failed rg/direct", "gw CPU ms/call", "gw RSS MiB", "RSS KiB/session"],
      rows,
    );
    await stop(gateway);
    gateway = null;
    if (profDir) {
      const file = newestProfile(profDir);
      if (file) printProfile("8c. gateway --cpu-prof over the whole run", summarizeProfile(file), printTable);
      rmSync(profDir, { recursive: true, force: true });
    }
    /** @type {Record<string, unknown> | null} */
    let pairResult = null;
    if (cfg.pairSessions) {
      pairResult = await pair({ engineUrl: engine.ready, prefix, sessions: cfg.pairSessions, parallel: 2000 });
      const p = /** @type {any} */ (pairResult);
      printTable(
        `8b. ${p.sessions} sessions open on a pair of gateway replicas (half opened on each; each called once through the other replica, 2000 at a time)`,
        ["sessions", "calls ok", "failed", "calls/s", "p50 ms", "p99 ms", "RSS KiB/session open", "after a call", "RSS MiB per replica"],
        [[p.sessions, p.calls_ok, p.calls_failed, p.calls_per_s, p.p50_ms, p.p99_ms, p.open_rss_kib_per_session, p.after_calls_rss_kib_per_session, p.rss_mib.join(" / ")]],
      );
    }
    const biggest = /** @type {any} */ (summary[Math.max(...cfg.sessions)]);
    const targets = {
      sessions_2000_added_p99_lt_50_ms: quick ? null : { value: biggest.added_p99_ms, failed: biggest.rollgate.failed, met: biggest.added_p99_ms < P99_GOAL_MS && biggest.rollgate.failed === 0 },
      pair_10k_sessions_all_answered: pairResult ? { value: /** @type {any} */ (pairResult).calls_ok, met: /** @type {any} */ (pairResult).calls_failed === 0 } : null,
    };
    console.log(`targets: ${JSON.stringify(targets)}`);
    void median;
    return { config: { ...cfg, ttft_ms: TTFT_MS, tpot_ms: TPOT_MS, tokens: TOKENS }, summary, pair: pairResult, targets };
  } finally {
    await stop(gateway);
    await stop(engine);
    await dropPrefix(prefix);
  }
}
