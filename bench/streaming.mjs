// 2. Streaming: time to first content token and total time, through rollgate vs straight to the engine.
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { Agent, request } from "undici";
import { startEngineSim, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { openSessions } from "./lib/rollgate.mjs";
import { newestProfile, printProfile, summarizeProfile } from "./lib/cpuprofile.mjs";
import { median, percentile, printTable, round } from "./lib/stats.mjs";

const TTFT_MS = 50;
const TPOT_MS = 5;
const TOKENS = 32;
const MODEL = "Qwen/Qwen3-8B";
const USER = "Summarise what a rollout gateway does in one paragraph.";

const openaiStream = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: USER }], max_tokens: TOKENS, stream: true });
const anthropicStream = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: USER }], max_tokens: TOKENS, stream: true });

/**
 * True when an SSE data payload carries generated text (OpenAI delta.content or Anthropic text_delta).
 * @param {string} data
 */
function hasContent(data) {
  if (data === "[DONE]") return false;
  try {
    const j = JSON.parse(data);
    return Boolean(j.choices?.[0]?.delta?.content) || (j.type === "content_block_delta" && Boolean(j.delta?.text));
  } catch {
    return false;
  }
}

/** @typedef {[url: string, headers: Record<string, string>, body: string]} StreamCall */

/**
 * One streamed call: ms to the first content chunk, ms to the end of the stream.
 * @param {import("undici").Dispatcher} dispatcher
 * @param {StreamCall[0]} url
 * @param {StreamCall[1]} headers
 * @param {StreamCall[2]} body
 */
async function timedStream(dispatcher, url, headers, body) {
  const t0 = performance.now();
  const res = await request(url, { method: "POST", dispatcher, headers: { "content-type": "application/json", ...headers }, body });
  if (res.statusCode !== 200) throw new Error(`${url} → ${res.statusCode}: ${(await res.body.text()).slice(0, 200)}`);
  let ttft = NaN;
  let buf = "";
  for await (const chunk of res.body) {
    if (!Number.isNaN(ttft)) continue; // drain
    buf += chunk.toString("utf8");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trim())
        .join("\n");
      if (Number.isNaN(ttft) && hasContent(data)) ttft = performance.now() - t0;
    }
  }
  return { ttft, total: performance.now() - t0 };
}

/**
 * 16 concurrent streams through a gateway started with --cpu-prof.
 * @param {string} engineUrl
 * @param {import("undici").Dispatcher} dispatcher
 * @param {number} calls
 */
async function profileStreams(engineUrl, dispatcher, calls) {
  const prefix = uniquePrefix("streaming-prof");
  const dir = mkdtempSync(path.join(os.tmpdir(), "rollgate-prof-st-"));
  let gateway = null;
  try {
    const t0 = Date.now();
    gateway = await startGateway({ prefix, engineUrl, nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${dir}`] });
    const ss = await openSessions(gateway.ready, 16);
    const one = (/** @type {import("@rollgate/protocol").CreateSessionResponse} */ s) => timedStream(dispatcher, `${s.urls.openai}/chat/completions`, { authorization: `Bearer ${s.token}` }, openaiStream);
    await Promise.all(ss.map(one));
    const skipMs = Date.now() - t0;
    await Promise.all(ss.map(async (s) => {
      for (let k = 0; k < calls; k++) await one(s);
    }));
    await stop(gateway);
    gateway = null;
    const file = newestProfile(dir);
    if (!file) return null;
    const summary = summarizeProfile(file, { skipMs });
    printProfile(`2b. gateway --cpu-prof, 16 concurrent streams × ${calls} calls`, summary, printTable);
    return summary;
  } finally {
    await stop(gateway);
    await dropPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** @typedef {{ calls: number, ttft_p50_ms: number, ttft_p99_ms: number, total_p50_ms: number, total_p99_ms: number, added_ttft_p50_ms: number, added_ttft_p99_ms: number, added_total_p50_ms: number }} TargetSummary */

/** @typedef {"vllm" | "sglang"} Kind */
const KINDS = /** @type {const} */ (["vllm", "sglang"]);
/** The goals: time to first token within this many ms of the engine's own, by concurrency. */
const TTFT_GOAL_MS = { 1: 1, 16: 3 };

/** @param {{ quick?: boolean, profile?: boolean }} [options] */
export async function run({ quick = false, profile = !quick } = {}) {
  /** @type {{ conc: number[], rounds: number, callsPerConn: Record<number, number> }} */
  const cfg = quick ? { conc: [1, 16], rounds: 3, callsPerConn: { 1: 6, 16: 2 } } : { conc: [1, 16], rounds: 3, callsPerConn: { 1: 20, 16: 5 } };
  /** @type {Record<string, Record<number, Record<string, TargetSummary>>>} */
  const summary = {};
  /** @type {Record<string, { value: number, goal_ms: number, met: boolean }>} */
  const targetsCheck = {};
  let prof = null;
  for (const kind of KINDS) {
    const r = await runKind(kind, cfg, profile && kind === "vllm");
    summary[kind] = r.summary;
    if (r.profile) prof = r.profile;
    for (const c of cfg.conc) {
      for (const name of ["rollgate", "rollgate_anthropic"]) {
        const v = r.summary[c][name].added_ttft_p50_ms;
        const goal = TTFT_GOAL_MS[/** @type {1 | 16} */ (c)] ?? 3;
        targetsCheck[`${kind}_${name}_ttft_within_${goal}ms_at_${c}`] = { value: v, goal_ms: goal, met: v <= goal };
      }
    }
  }
  console.log(`targets (added TTFT p50 over the engine's own, ms): ${JSON.stringify(targetsCheck)}`);
  return { profile: prof, config: { engine: { ttft_ms: TTFT_MS, tpot_ms: TPOT_MS, output_tokens: TOKENS }, kinds: KINDS, ...cfg }, summary, targets: targetsCheck };
}

/**
 * One engine kind: engine-sim imitating it, a gateway in front, streams straight and through.
 * @param {Kind} kind
 * @param {{ conc: number[], rounds: number, callsPerConn: Record<number, number> }} cfg
 * @param {boolean} profile
 */
async function runKind(kind, cfg, profile) {
  const prefix = uniquePrefix(`streaming-${kind}`);
  /** @type {import("./lib/procs.mjs").Child[]} */
  const procs = [];
  const dispatcher = new Agent({ connections: 64, keepAliveTimeout: 30_000 });
  try {
    const engine = await startEngineSim({ kind, "ttft-ms": TTFT_MS, "tpot-ms": TPOT_MS, "random-tokens": TOKENS });
    procs.push(engine);
    const gateway = await startGateway({ prefix, engineUrl: engine.ready, kind });
    procs.push(gateway);
    const oa = await openSessions(gateway.ready, 16);
    const an = await openSessions(gateway.ready, 16);
    /** @type {Record<string, (i: number) => StreamCall>} */
    const targets = {
      direct: () => [`${engine.ready}/v1/chat/completions`, {}, openaiStream],
      rollgate: (i) => [`${oa[i].urls.openai}/chat/completions`, { authorization: `Bearer ${oa[i].token}` }, openaiStream],
      rollgate_anthropic: (i) => [`${an[i].urls.anthropic}/v1/messages`, { "x-api-key": an[i].token, "anthropic-version": "2023-06-01" }, anthropicStream],
    };
    /** @type {Record<number, Record<string, { ttft: number[], total: number[], rounds: { ttft_p50: number, total_p50: number }[] }>>} */
    const samples = {};
    for (const c of cfg.conc) {
      samples[c] = {};
      for (const [name, t] of Object.entries(targets)) {
        samples[c][name] = { ttft: [], total: [], rounds: [] };
        await Promise.all(Array.from({ length: c }, (_, i) => timedStream(dispatcher, ...t(i)))); // warm-up
      }
      for (let r = 0; r < cfg.rounds; r++) {
        for (const [name, t] of Object.entries(targets)) {
          /** @type {{ ttft: number[], total: number[] }} */
          const got = { ttft: [], total: [] };
          await Promise.all(
            Array.from({ length: c }, async (_, i) => {
              for (let k = 0; k < cfg.callsPerConn[c]; k++) {
                const x = await timedStream(dispatcher, ...t(i));
                got.ttft.push(x.ttft);
                got.total.push(x.total);
              }
            }),
          );
          samples[c][name].ttft.push(...got.ttft);
          samples[c][name].total.push(...got.total);
          samples[c][name].rounds.push({ ttft_p50: percentile(got.ttft, 50), total_p50: percentile(got.total, 50) });
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
        const s = samples[c][name];
        // The added_* differences are filled in below, once the direct target has its figures.
        summary[c][name] = /** @type {TargetSummary} */ ({
          calls: s.ttft.length,
          ttft_p50_ms: round(median(s.rounds.map((x) => x.ttft_p50)), 3),
          ttft_p99_ms: round(percentile(s.ttft, 99), 3),
          total_p50_ms: round(median(s.rounds.map((x) => x.total_p50)), 3),
          total_p99_ms: round(percentile(s.total, 99), 3),
        });
      }
      const d = summary[c].direct;
      for (const name of Object.keys(targets)) {
        const x = summary[c][name];
        x.added_ttft_p50_ms = round(x.ttft_p50_ms - d.ttft_p50_ms, 3);
        x.added_ttft_p99_ms = round(x.ttft_p99_ms - d.ttft_p99_ms, 3);
        x.added_total_p50_ms = round(x.total_p50_ms - d.total_p50_ms, 3);
        rows.push([c, name, x.calls, x.ttft_p50_ms, x.ttft_p99_ms, x.total_p50_ms, x.total_p99_ms, name === "direct" ? null : x.added_ttft_p50_ms, name === "direct" ? null : x.added_total_p50_ms]);
      }
    }
    printTable(
      `2. Streaming, ${kind} (engine-sim TTFT ${TTFT_MS} ms, TPOT ${TPOT_MS} ms, ${TOKENS} tokens; p50 = median of ${cfg.rounds} rounds' p50, p99 over all calls)`,
      ["conc", "target", "calls", "TTFT p50", "TTFT p99", "total p50", "total p99", "+TTFT p50", "+total p50"],
      rows,
    );
    const prof = profile ? await profileStreams(engine.ready, dispatcher, cfg.callsPerConn[16]) : null;
    return { profile: prof, summary };
  } finally {
    await dispatcher.close();
    for (const p of procs.reverse()) await stop(p);
    await dropPrefix(prefix);
  }
}
