// 6. Routing: a GRPO-shaped workload (groups of n sessions sharing a long prompt) on engine-sim with
// 4 DP ranks, under each ROLLGATE_ROUTING policy: prefix-cache hit rate and engine latency, versus
// the ideal hit rate (every group's calls on one rank with an unbounded cache).
import { startEngineSim, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { api } from "./lib/rollgate.mjs";
import { mean, percentile, printTable, round } from "./lib/stats.mjs";

const POLICIES = ["least_loaded", "affinity", "round_robin"];
const DP = 4;
const BLOCK = 16; // engine-sim's (vLLM's) block size
const ENGINE = { dp: DP, "ttft-ms": 30, "tpot-ms": 2, "random-tokens": 24, "max-running": 4 };
/** @typedef {import("@rollgate/protocol").CreateSessionResponse} Session */
/** @typedef {import("@rollgate/protocol").CompletionRecord} CompletionRecord */
/** @typedef {{ ranks: { served: number }[] }} SimStats engine-sim's /sim/stats, the part read here */

const WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud paper engine table window garden signal".split(" ");

/**
 * A long task prompt unique to a group (deterministic).
 * @param {number} g
 * @param {number} words
 */
function groupPrompt(g, words) {
  let x = (g + 1) * 2654435761;
  const out = [`Problem ${g}. Read the repository description below and fix the failing test.`];
  for (let i = 0; i < words; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    out.push(WORDS[x % WORDS.length] + (i % 17 === 16 ? "." : ""));
  }
  return out.join(" ");
}

/**
 * @param {Session} s
 * @param {{ role: string, content: string }[]} messages
 */
async function call(s, messages) {
  const res = await fetch(`${s.urls.openai}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${s.token}` },
    body: JSON.stringify({ model: "m", messages, max_tokens: 24 }),
  });
  if (!res.ok) throw new Error(`${res.status}: ${await res.text()}`);
  return /** @type {Promise<{ choices: { message: { content: string } }[] }>} */ (res.json());
}

/**
 * One GRPO sample: open a session on the group's affinity key, two turns, close.
 * @param {string} base
 * @param {number} group
 * @param {string} prompt
 */
async function sample(base, group, prompt) {
  const s = /** @type {Session} */ (await api(base, "/v1/sessions", { method: "POST", body: { affinity_key: `g-${group}` } }));
  const messages = [{ role: "user", content: prompt }];
  const a = await call(s, messages);
  messages.push({ role: "assistant", content: a.choices[0].message.content }, { role: "user", content: "The tests still fail with a KeyError. Try again." });
  await call(s, messages);
  await api(base, `/v1/sessions/${s.id}/close`, { method: "POST", body: {} });
  return s.id;
}

/**
 * Block-chain keys of a token sequence (as engine-sim and vLLM hash full blocks).
 * @param {readonly number[]} ids
 * @param {number} nBlocks
 */
function blockKeys(ids, nBlocks) {
  /** @type {string[]} */
  const keys = [];
  let h1 = 0x811c9dc5;
  let h2 = 0x9e3779b9;
  for (let b = 0; b < nBlocks; b++) {
    for (let i = b * BLOCK; i < (b + 1) * BLOCK; i++) {
      h1 = Math.imul(h1 ^ ids[i], 16777619) >>> 0;
      h2 = Math.imul(h2 ^ ids[i], 2246822519) >>> 0;
    }
    keys.push(`${h1}:${h2}`);
  }
  return keys;
}

/**
 * The ideal: replay every call in start order against one unbounded cache (all on one rank).
 * @param {readonly CompletionRecord[]} records
 */
function idealCached(records) {
  /** @type {Set<string>} */
  const cache = new Set();
  let cached = 0;
  for (const r of [...records].sort((a, b) => Date.parse(a.created_at) - Date.parse(b.created_at) || a.seq - b.seq)) {
    const p = r.prompt_ids;
    let hit = 0;
    for (const k of blockKeys(p, Math.floor(Math.max(0, p.length - 1) / BLOCK))) {
      if (!cache.has(k)) break;
      hit++;
    }
    cached += hit * BLOCK;
    const all = p.concat(r.output_ids);
    for (const k of blockKeys(all, Math.floor(all.length / BLOCK))) cache.add(k);
  }
  return cached;
}

/** @param {{ quick?: boolean }} [options] */
export async function run({ quick = false } = {}) {
  const cfg = quick ? { groups: 8, n: 8, parallelGroups: 4, promptWords: 800 } : { groups: 24, n: 8, parallelGroups: 4, promptWords: 1500 };
  /**
   * @type {Record<string, { calls: number, prompt_tokens: number, cached_tokens: number, hit_rate: number, ideal_hit_rate: number, of_ideal: number,
   *   mean_engine_latency_ms: number, p99_engine_latency_ms: number, calls_per_rank: number[], wall_s: number }>}
   */
  const results = {};
  const engine = await startEngineSim(ENGINE);
  try {
    for (const policy of POLICIES) {
      const prefix = uniquePrefix(`routing-${policy}`);
      /** @type {import("./lib/procs.mjs").Child | null} */
      let gateway = null;
      try {
        await fetch(`${engine.ready}/reset_prefix_cache`, { method: "POST" });
        const before = /** @type {SimStats} */ (await (await fetch(`${engine.ready}/sim/stats`)).json());
        gateway = await startGateway({ prefix, engineUrl: engine.ready, dp: DP, env: { ROLLGATE_ROUTING: policy } });
        const t0 = Date.now();
        /** @type {string[]} */
        const ids = [];
        let next = 0;
        await Promise.all(
          Array.from({ length: cfg.parallelGroups }, async () => {
            while (next < cfg.groups) {
              const g = next++;
              const prompt = groupPrompt(g, cfg.promptWords);
              ids.push(...(await Promise.all(Array.from({ length: cfg.n }, () => sample(/** @type {import("./lib/procs.mjs").Child} */ (gateway).ready, g, prompt)))));
            }
          }),
        );
        const wallS = (Date.now() - t0) / 1000;
        const after = /** @type {SimStats} */ (await (await fetch(`${engine.ready}/sim/stats`)).json());
        /** @type {CompletionRecord[]} */
        const records = [];
        for (const id of ids) records.push(.../** @type {{ completions: CompletionRecord[] }} */ (await api(gateway.ready, `/v1/sessions/${id}/completions`)).completions);
        const prompt = records.reduce((a, r) => a + r.usage.prompt_tokens, 0);
        const cached = records.reduce((a, r) => a + r.usage.cached_tokens, 0);
        const ideal = idealCached(records);
        const lat = records.map((r) => r.latency_ms);
        const perRank = after.ranks.map((r, i) => r.served - before.ranks[i].served);
        results[policy] = {
          calls: records.length,
          prompt_tokens: prompt,
          cached_tokens: cached,
          hit_rate: round(cached / prompt, 4),
          ideal_hit_rate: round(ideal / prompt, 4),
          of_ideal: round(cached / ideal, 4),
          mean_engine_latency_ms: round(mean(lat), 1),
          p99_engine_latency_ms: round(percentile(lat, 99), 1),
          calls_per_rank: perRank,
          wall_s: round(wallS, 2),
        };
        process.stderr.write(`routing ${policy}: hit ${results[policy].hit_rate} (ideal ${results[policy].ideal_hit_rate})\n`);
      } finally {
        await stop(gateway);
        await dropPrefix(prefix);
      }
    }
  } finally {
    await stop(engine);
  }
  printTable(
    `6. Routing (${cfg.groups} GRPO groups × n=${cfg.n}, ~${cfg.promptWords}-word shared prompt, 2 calls per sample, ${cfg.parallelGroups} groups at a time; engine-sim dp=${DP}, max-running ${ENGINE["max-running"]}/rank, TTFT ${ENGINE["ttft-ms"]} ms)`,
    ["policy", "calls", "hit rate", "ideal", "of ideal", "mean engine ms", "p99 engine ms", "calls per rank", "wall s"],
    POLICIES.map((p) => {
      const r = results[p];
      return [p, r.calls, r.hit_rate, r.ideal_hit_rate, r.of_ideal, r.mean_engine_latency_ms, r.p99_engine_latency_ms, r.calls_per_rank.join("/"), r.wall_s];
    }),
  );
  const a = results.affinity;
  const targetsCheck = { affinity_within_5pct_of_ideal: { value: a.of_ideal, met: a.of_ideal >= 0.95 } };
  console.log(`targets: ${JSON.stringify(targetsCheck)}`);
  return { config: { ...cfg, engine: ENGINE }, results, targets: targetsCheck };
}
