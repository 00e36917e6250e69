// 4. Trajectory build: prefix_merging on synthetic agent sessions of 10, 100 and 500 calls (up to
// 1M record tokens), its growth, and a naive all-pairs builder for comparison; prefix_tree (the same
// conversations as one tree of shared prefixes) beside it.
import { performance } from "node:perf_hooks";
import { seededRandom } from "@rollgate/testkit";
import { prefixMerging, prefixMergingTraces, prefixTree } from "@rollgate/trajectory";
import { naivePrefixMerging } from "./lib/naive-trajectory.mjs";
import { median, printTable, round } from "./lib/stats.mjs";

/** @typedef {import("@rollgate/protocol").CompletionRecord} CompletionRecord */

/**
 * A session of `calls` LLM calls with `totalTokens` record tokens (Σ prompt + output over records),
 * as an agent makes them: `contexts` conversations (a main agent and sub-agents) sharing a system
 * prompt, interleaved; each call's prompt is the previous prompt + the previous output + a tool
 * result; about 1% of calls are retried with the identical prompt (they become separate traces).
 * @param {{ calls: number, totalTokens: number, contexts: number, seed?: number }} shape
 */
export function syntheticSession({ calls, totalTokens, contexts, seed = 1 }) {
  const rand = seededRandom(seed); // the same sessions on every run
  const tok = () => Math.floor(rand() * 150_000);
  const toks = (/** @type {number} */ n) => Array.from({ length: n }, tok);
  const m = Math.ceil(calls / contexts);
  const p0 = Math.max(32, Math.round((0.3 * totalTokens) / calls));
  const d = Math.max(4, Math.round((0.7 * totalTokens) / contexts / ((m * (m - 1)) / 2 + 0.4 * m)));
  const out = Math.max(2, Math.round(0.4 * d));
  const tool = Math.max(1, d - out);
  const system = toks(Math.round(0.6 * p0));
  /** @type {{ prompt: number[], last: CompletionRecord | null }[]} */
  const state = Array.from({ length: contexts }, () => ({ prompt: system.concat(toks(p0 - system.length)), last: null }));
  /** @type {CompletionRecord[]} */
  const records = [];
  for (let seq = 0; seq < calls; seq++) {
    const c = state[seq % contexts];
    const retry = c.last !== null && rand() < 0.01;
    if (!retry && c.last) c.prompt = c.prompt.concat(c.last.output_ids, toks(tool));
    const output = toks(out);
    /** @type {CompletionRecord} */
    const r = {
      id: `cmpl-${seq}`,
      session_id: "s-bench",
      seq,
      created_at: "2026-01-01T00:00:00.000Z",
      protocol: "openai_chat",
      engine: "engine-sim",
      dp_rank: 0,
      weight_version: "v1",
      request: { messages: [{ role: "user", content: "…" }], sampling: {} },
      prompt_ids: c.prompt,
      output_ids: output,
      output_logprobs: output.map(() => -rand() * 5),
      finish_reason: "stop",
      message: { content: null, reasoning: null, tool_calls: [] },
      usage: { prompt_tokens: c.prompt.length, completion_tokens: out, cached_tokens: 0 },
      latency_ms: 1,
    };
    records.push(r);
    c.last = r;
  }
  const tokens = records.reduce((a, r) => a + r.prompt_ids.length + r.output_ids.length, 0);
  return { records, tokens };
}

/**
 * @template T
 * @param {() => T} fn
 * @param {number} reps
 * @param {number} warmups
 */
function timeIt(fn, reps, warmups) {
  for (let i = 0; i < warmups; i++) fn();
  /** @type {number[]} */
  const times = [];
  /** @type {T | undefined} */
  let out;
  for (let i = 0; i < reps; i++) {
    // Each timed build starts from a collected heap when node runs with --expose-gc (npm run bench
    // does), so one build does not pay for the garbage of the previous one.
    globalThis.gc?.();
    const t0 = performance.now();
    out = fn();
    times.push(performance.now() - t0);
  }
  return { ms: median(times), min: Math.min(...times), out: /** @type {T} */ (out) };
}

/**
 * @typedef {{ case: string, calls: number, record_tokens: number, traces: number, prefix_merging_ms: number, prefix_merging_min_ms: number,
 *   ns_per_token: number, core_ms: number, naive_ms: number, naive_over_prefix_merging: number, naive_over_core: number,
 *   prefix_tree_ms: number, prefix_tree_min_ms: number, tree_tokens: number, flat_tokens: number }} CaseResult
 */

/** @param {{ quick?: boolean }} [options] */
export async function run({ quick = false } = {}) {
  const cases = [
    { name: "10 calls", calls: 10, totalTokens: 20_000, contexts: 1 },
    { name: "100 calls", calls: 100, totalTokens: 200_000, contexts: 2 },
    { name: "500 calls / 125k", calls: 500, totalTokens: 125_000, contexts: 10 },
    { name: "500 calls / 250k", calls: 500, totalTokens: 250_000, contexts: 10 },
    { name: "500 calls / 500k", calls: 500, totalTokens: 500_000, contexts: 10 },
    { name: "500 calls / 1M", calls: 500, totalTokens: 1_000_000, contexts: 10 },
    { name: "500 calls / 2M", calls: 500, totalTokens: 2_000_000, contexts: 10 },
    // Beyond the sizes: where the all-pairs builder's calls² term shows.
    { name: "2000 calls / 1M", calls: 2000, totalTokens: 1_000_000, contexts: 40 },
  ];
  const reps = quick ? 3 : 7;
  const naiveReps = quick ? 1 : 3;
  /** @type {unknown[][]} */
  const rows = [];
  /** @type {CaseResult[]} */
  const results = [];
  for (const c of cases) {
    const { records, tokens } = syntheticSession(c);
    const fast = timeIt(() => prefixMerging(records), reps, 2);
    const core = timeIt(() => prefixMergingTraces(records), reps, 2);
    const naive = timeIt(() => naivePrefixMerging(records), naiveReps, 1);
    const tree = timeIt(() => prefixTree(records), reps, 2);
    const { tree_tokens, flat_tokens } = /** @type {NonNullable<typeof tree.out.tree>} */ (tree.out.tree);
    // The two builders must agree on the traces, or the comparison means nothing.
    const a = fast.out.traces.map((t) => t.response_ids.length).join(",");
    const b = naive.out.map((t) => t.response_ids.length).join(",");
    if (a !== b) throw new Error(`${c.name}: the naive builder disagrees with prefix_merging`);
    const r = {
      case: c.name,
      calls: c.calls,
      record_tokens: tokens,
      traces: fast.out.traces.length,
      prefix_merging_ms: round(fast.ms, 2),
      prefix_merging_min_ms: round(fast.min, 2),
      ns_per_token: round((fast.ms * 1e6) / tokens, 1),
      core_ms: round(core.ms, 2),
      naive_ms: round(naive.ms, 1),
      naive_over_prefix_merging: round(naive.ms / fast.ms, 2),
      naive_over_core: round(naive.ms / core.ms, 2),
      prefix_tree_ms: round(tree.ms, 2),
      prefix_tree_min_ms: round(tree.min, 2),
      tree_tokens,
      flat_tokens,
    };
    results.push(r);
    rows.push([r.case, r.calls, r.record_tokens, r.traces, r.prefix_merging_ms, r.prefix_merging_min_ms, r.ns_per_token, r.core_ms, r.naive_ms, `${r.naive_over_prefix_merging}×`, `${r.naive_over_core}×`, r.prefix_tree_ms, `${r.tree_tokens}/${r.flat_tokens}`]);
  }
  printTable(
    `4. Trajectory build (build = prefixMerging() with invariant checks + stats; merge-only = prefixMergingTraces(); prefix_tree = prefixTree(), the same plus the tree and its checks; median of ${reps})`,
    ["session", "calls", "record tokens", "traces", "build ms", "min ms", "ns/token", "merge-only ms", "naive ms", "naive/build", "naive/merge", "prefix_tree ms", "tree/flat tokens"],
    rows,
  );
  // Growth: the exponent k in time ∝ tokens^k (1 = linear), a least-squares fit on log-log of the
  // fastest run of each size (the minimum is the least disturbed by other load on a shared machine).
  /**
   * @param {CaseResult[]} rs
   * @param {"prefix_merging_ms" | "prefix_merging_min_ms" | "prefix_tree_min_ms"} key
   */
  const slope = (rs, key) => {
    const xs = rs.map((r) => Math.log(r.record_tokens));
    const ys = rs.map((r) => Math.log(r[key]));
    const mx = xs.reduce((a, b) => a + b, 0) / xs.length;
    const my = ys.reduce((a, b) => a + b, 0) / ys.length;
    return round(xs.reduce((a, x, i) => a + (x - mx) * (ys[i] - my), 0) / xs.reduce((a, x) => a + (x - mx) ** 2, 0), 2);
  };
  const by = (/** @type {string} */ name) => /** @type {CaseResult} */ (results.find((r) => r.case === name));
  const series500 = results.filter((r) => r.calls === 500);
  const [m1, m2] = [by("500 calls / 1M"), by("2000 calls / 1M")];
  const growth = {
    exponent_in_tokens_at_500_calls: slope(series500, "prefix_merging_min_ms"),
    exponent_in_tokens_at_500_calls_medians: slope(series500, "prefix_merging_ms"),
    exponent_in_tokens_10_to_500_calls: slope([by("10 calls"), by("100 calls"), m1], "prefix_merging_min_ms"),
    naive_exponent_in_calls_at_1M: round(Math.log(m2.naive_ms / m1.naive_ms) / Math.log(m2.calls / m1.calls), 2),
    prefix_merging_exponent_in_calls_at_1M: round(Math.log(m2.prefix_merging_min_ms / m1.prefix_merging_min_ms) / Math.log(m2.calls / m1.calls), 2),
  };
  console.log(`growth (time ∝ tokens^k): ${JSON.stringify(growth)}`);
  const big = m1;
  const targetsCheck = {
    build_500_calls_1M_tokens_lt_100ms: { value: big.prefix_merging_ms, met: big.prefix_merging_ms < 100 },
    linear: { value: growth.exponent_in_tokens_at_500_calls, met: growth.exponent_in_tokens_at_500_calls <= 1.15 },
    prefix_tree_500_calls_1M_tokens_lt_100ms: { value: big.prefix_tree_ms, met: big.prefix_tree_ms < 100 },
    prefix_tree_linear: { value: slope(series500, "prefix_tree_min_ms"), met: slope(series500, "prefix_tree_min_ms") <= 1.15 },
  };
  console.log(`targets: ${JSON.stringify(targetsCheck)}`);
  return { config: { reps, naive_reps: naiveReps, cases }, results, growth, targets: targetsCheck };
}
