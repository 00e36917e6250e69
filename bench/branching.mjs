// 7. Branching: N more samples of a recorded rollout's second half, by branching it at its midpoint
// (POST /v1/tasks/:id/branches, docs/data-model.md#branches) versus re-running the whole rollout N
// times from scratch. The example ReAct agent in worker sandboxes, engine-sim with a latency model
// (time to first token, time per output token) and every answer `tokens` long. Per useful sample
// (one sample of the decision region: calls k…K-1): wall time, engine calls, and the engine's
// tokens prefilled (prompt − prefix-cache hits) and generated, from the records' usage (replayed
// answers never reach the engine and are left out).
import { api } from "./lib/rollgate.mjs";
import { startEngineSim, startGateway, startWorker, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { median, printTable, round, sleep } from "./lib/stats.mjs";

/** @typedef {import("@rollgate/protocol").CompletionRecord} CompletionRecord */
/** @typedef {{ id: string, status: string, session_id: string | null, result: { status: string, reward: number | null } | null }} Task */

/**
 * The rollout: K calls, the first K-1 a shell command each, the last the answer; every answer is
 * `tokens` tokens long (engine-sim pads the step). The evaluator counts the commands' lines.
 * @param {number} calls
 * @param {number} tokens
 */
function rollout(calls, tokens) {
  const steps = Array.from({ length: calls }, (_, i) =>
    i < calls - 1 ? { tokens, tool_calls: [{ name: "shell", arguments: { command: `echo step-${i} >> log.txt` } }] } : { tokens, text: "done" },
  );
  return {
    instruction: `Write the log.\n#sim: ${JSON.stringify(steps)}`,
    agent: { harness: "command", command: ["rollgate-example-agent"], env: { AGENT_MAX_STEPS: String(calls) } },
    evaluator: { kind: "command", command: ["bash", "-c", `test "$(wc -l < log.txt)" -eq ${calls - 1}`] },
    sampling: { max_tokens: tokens + 16 },
    limits: { timeout_s: 120 },
  };
}

/**
 * Waits until every task has a result; resolves to the tasks and the wall time from `t0` to the last.
 * @param {string} url
 * @param {string[]} ids
 * @param {number} t0
 */
async function waitAll(url, ids, t0) {
  const deadline = Date.now() + 300_000;
  /** @type {Map<string, Task>} */
  const done = new Map();
  let last = t0;
  while (done.size < ids.length) {
    if (Date.now() > deadline) throw new Error(`branching: ${done.size}/${ids.length} tasks ended after 300 s`);
    for (const id of ids) {
      if (done.has(id)) continue;
      const t = /** @type {Task} */ (await api(url, `/v1/tasks/${id}`));
      if (t.result) {
        done.set(id, t);
        last = Date.now();
      }
    }
    await sleep(25);
  }
  const tasks = ids.map((id) => /** @type {Task} */ (done.get(id)));
  const bad = tasks.filter((t) => t.result?.status !== "completed" || t.result?.reward !== 1);
  if (bad.length) {
    const why = bad.map((t) => {
      const r = /** @type {{ status: string, reward: number | null, error?: unknown, agent?: { log_tail?: string } }} */ (t.result);
      return { id: t.id, status: r.status, reward: r.reward, error: r.error, log: r.agent?.log_tail?.slice(-300) };
    });
    throw new Error(`branching: ${bad.length} task(s) did not complete with reward 1: ${JSON.stringify(why)}`);
  }
  return { tasks, wall_ms: last - t0 };
}

/**
 * The engine's work for a group of samples: calls that reached it and their tokens.
 * @param {string} url
 * @param {Task[]} tasks
 */
async function engineWork(url, tasks) {
  let calls = 0;
  let replayed = 0;
  let prompt = 0;
  let cached = 0;
  let generated = 0;
  for (const t of tasks) {
    const { completions } = /** @type {{ completions: CompletionRecord[] }} */ (await api(url, `/v1/sessions/${t.session_id}/completions`));
    for (const r of completions) {
      if (r.replayed_from) {
        replayed++;
        continue;
      }
      calls++;
      prompt += r.usage.prompt_tokens;
      cached += r.usage.cached_tokens;
      generated += r.usage.completion_tokens;
    }
  }
  return { calls, replayed, prompt, cached, prefilled: prompt - cached, generated };
}

/**
 * @param {string} url
 * @param {ReturnType<typeof rollout>} task
 * @param {number} n
 */
async function fromScratch(url, task, n) {
  const t0 = Date.now();
  const res = /** @type {{ tasks: { id: string }[] }} */ (await api(url, "/v1/tasks/batch", { body: { tasks: Array.from({ length: n }, () => task) } }));
  return waitAll(
    url,
    res.tasks.map((t) => t.id),
    t0,
  );
}

/**
 * @param {string} url
 * @param {string} sourceId
 * @param {number} atCall
 * @param {number} n
 */
async function branched(url, sourceId, atCall, n) {
  const t0 = Date.now();
  const res = /** @type {{ task_ids: string[] }} */ (await api(url, `/v1/tasks/${sourceId}/branches`, { body: { at_call: atCall, n } }));
  return waitAll(url, res.task_ids, t0);
}

/** @param {{ quick?: boolean }} [options] */
export async function run({ quick = false } = {}) {
  const cfg = quick
    ? { calls: 8, n: 4, tokens: 48, ttft_ms: 30, tpot_ms: 2, rounds: 1, concurrency: 4 }
    : { calls: 16, n: 8, tokens: 96, ttft_ms: 50, tpot_ms: 4, rounds: 3, concurrency: 4 };
  const atCall = cfg.calls / 2;
  const prefix = uniquePrefix("branching");
  /** @type {import("./lib/procs.mjs").Child[]} */
  const procs = [];
  try {
    const engine = await startEngineSim({ dp: 2, "ttft-ms": cfg.ttft_ms, "tpot-ms": cfg.tpot_ms });
    procs.push(engine);
    const gateway = await startGateway({ prefix, engineUrl: engine.ready, dp: 2 });
    procs.push(gateway);
    const worker = await startWorker({ prefix, gatewayUrl: gateway.ready, name: "b0", env: { ROLLGATE_WORKER_CONCURRENCY: String(cfg.concurrency) } });
    procs.push(worker);
    const url = gateway.ready;
    const task = rollout(cfg.calls, cfg.tokens);

    // The recorded rollout every round branches (it ran anyway: its cost is not a branch's).
    const source = await fromScratch(url, task, 1);
    const sourceId = source.tasks[0].id;
    await fromScratch(url, task, 2); // warm-up: sandboxes, connections, the engine's prefix caches

    /** @type {{ scratch: { wall_ms: number, work: Awaited<ReturnType<typeof engineWork>> }[], branch: { wall_ms: number, work: Awaited<ReturnType<typeof engineWork>> }[] }} */
    const runs = { scratch: [], branch: [] };
    for (let r = 0; r < cfg.rounds; r++) {
      // Side by side, alternating which goes first, so the machine's load falls on both alike.
      const order = r % 2 === 0 ? /** @type {const} */ (["scratch", "branch"]) : /** @type {const} */ (["branch", "scratch"]);
      for (const way of order) {
        const x = way === "scratch" ? await fromScratch(url, task, cfg.n) : await branched(url, sourceId, atCall, cfg.n);
        runs[way].push({ wall_ms: x.wall_ms, work: await engineWork(url, x.tasks) });
        process.stderr.write(`branching: round ${r + 1} ${way}: ${x.wall_ms} ms for ${cfg.n} samples\n`);
      }
    }

    /** @param {"scratch" | "branch"} way */
    const perSample = (way) => {
      const xs = runs[way];
      /** @param {(x: (typeof xs)[number]) => number} f */
      const med = (f) => round(median(xs.map(f)) / cfg.n, 1);
      return {
        wall_ms: med((x) => x.wall_ms),
        engine_calls: med((x) => x.work.calls),
        replayed_calls: med((x) => x.work.replayed),
        prompt_tokens: med((x) => x.work.prompt),
        cached_tokens: med((x) => x.work.cached),
        prefilled_tokens: med((x) => x.work.prefilled),
        generated_tokens: med((x) => x.work.generated),
      };
    };
    const scratch = perSample("scratch");
    const branch = perSample("branch");
    /** @param {keyof typeof scratch} k */
    const ratio = (k) => (k !== "replayed_calls" && branch[k] > 0 ? round(scratch[k] / branch[k], 2) : null);
    const keys = /** @type {(keyof typeof scratch)[]} */ (["wall_ms", "engine_calls", "replayed_calls", "prompt_tokens", "cached_tokens", "prefilled_tokens", "generated_tokens"]);
    printTable(
      `7. Branching at call ${atCall} of a ${cfg.calls}-call rollout vs re-running it (example agent, engine-sim ttft ${cfg.ttft_ms} ms, tpot ${cfg.tpot_ms} ms, ${cfg.tokens}-token answers, ${cfg.n} samples, ${cfg.concurrency} at a time; per useful sample, median of ${cfg.rounds})`,
      ["per sample", "from scratch", "branched", "scratch/branched"],
      keys.map((k) => [k, scratch[k], branch[k], ratio(k) === null ? "—" : `${ratio(k)}×`]),
    );
    return {
      config: { ...cfg, at_call: atCall },
      per_sample: { scratch, branch },
      ratios: Object.fromEntries(keys.map((k) => [k, ratio(k)])),
      runs,
      targets: {
        branch_generates_less: { value: ratio("generated_tokens"), met: (ratio("generated_tokens") ?? 0) > 1 },
        branch_faster: { value: ratio("wall_ms"), met: (ratio("wall_ms") ?? 0) > 1 },
      },
    };
  } finally {
    for (const p of procs.reverse()) await stop(p);
    await dropPrefix(prefix);
  }
}
