// Side by side at one session: the gateways of this checkout and of BENCH_AB_ROOT (another built
// checkout) in front of one engine-sim, called by turns with the engine itself, one call at a time.
// What overhead.mjs does not cover: calls with history (MULTI=1: each answer is echoed back, as
// an agent does), streamed or not (STREAM=1), OpenAI or Anthropic (ANTHROPIC=1). Per round: the
// p50 of first byte and of total time, and the first byte over the engine's own.
//   BENCH_AB_ROOT=<checkout> MULTI=1 N=120 ROUNDS=7 GW_ENV='{"ROLLGATE_CONTINUATION":"render"}' node bench/session-ab.mjs
import { performance } from "node:perf_hooks";
import { Agent, request } from "undici";
import { REPO_ROOT, startEngineSim, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { openSessions } from "./lib/rollgate.mjs";

/** @typedef {{ first: number, total: number, text: string }} Timed */
/** @typedef {{ role: string, content: string }} Message */

const env = process.env;
const N = Number(env.N ?? 100);
const ROUNDS = Number(env.ROUNDS ?? 5);
if (!env.BENCH_AB_ROOT) throw new Error("BENCH_AB_ROOT=<another built checkout> is required");
const roots = [env.BENCH_AB_ROOT, REPO_ROOT];
const names = ["base (BENCH_AB_ROOT)", "this checkout"];
const stream = env.STREAM === "1";
const multi = env.MULTI === "1";
const anthropic = env.ANTHROPIC === "1";
/** @type {Record<string, string>} */
const gatewayEnv = JSON.parse(env.GW_ENV ?? "{}");
const MODEL = "Qwen/Qwen3-8B";
const SYSTEM = "You are a careful software engineering agent. Work step by step, run the tests, and keep answers short.";

const engine = await startEngineSim({ "ttft-ms": 20, "tpot-ms": stream ? 5 : 0, "random-tokens": 16 });
const prefixes = roots.map((_, i) => uniquePrefix(`session-ab-${i}`));
const gateways = await Promise.all(roots.map((root, i) => startGateway({ prefix: prefixes[i], engineUrl: engine.ready, root, env: gatewayEnv })));
const dispatcher = new Agent({ connections: 8, keepAliveTimeout: 30_000 });
const sessions = await Promise.all(gateways.map(async (g) => (await openSessions(g.ready, 1))[0]));
/** @returns {Message[]} */
const opening = () => [{ role: "user", content: "The test suite fails. Find the cause." }];
const histories = roots.map(opening);

/**
 * @param {string} url
 * @param {Record<string, string>} headers
 * @param {Message[]} messages
 * @returns {Promise<Timed>}
 */
async function call(url, headers, messages) {
  const body = JSON.stringify(
    anthropic
      ? { model: MODEL, system: SYSTEM, messages, max_tokens: 16, temperature: 1, stream }
      : { model: MODEL, messages: [{ role: "system", content: SYSTEM }, ...messages], max_tokens: 16, temperature: 1, stream },
  );
  const t0 = performance.now();
  const res = await request(url, { method: "POST", dispatcher, headers: { "content-type": "application/json", ...headers }, body });
  let first = NaN;
  let text = "";
  for await (const chunk of res.body) {
    if (Number.isNaN(first)) first = performance.now() - t0;
    text += chunk;
  }
  if (res.statusCode !== 200) throw new Error(`${url} → ${res.statusCode}: ${text.slice(0, 200)}`);
  return { first, total: performance.now() - t0, text };
}

/**
 * The answer's text, to echo back as the assistant turn.
 * @param {string} text
 */
function answerOf(text) {
  if (!stream) {
    const j = JSON.parse(text);
    return anthropic ? j.content.filter((/** @type {{ type: string }} */ b) => b.type === "text").map((/** @type {{ text: string }} */ b) => b.text).join("") : j.choices[0].message.content;
  }
  let out = "";
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const j = JSON.parse(line.slice(6));
    out += anthropic ? (j.type === "content_block_delta" && j.delta?.type === "text_delta" ? j.delta.text : "") : (j.choices?.[0]?.delta?.content ?? "");
  }
  return out;
}

/** @param {number[]} a */
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
/** @type {{ first: number, total: number }[][]} */
const perRound = roots.map(() => []);
/** @type {{ first: number, total: number }[]} */
const direct = [];
try {
  for (let r = 0; r <= ROUNDS; r++) {
    /** @type {Timed[][]} */
    const got = roots.map(() => []);
    /** @type {Timed[]} */
    const engineOwn = [];
    for (let i = 0; i < N; i++) {
      engineOwn.push(await call(`${engine.ready}/v1/chat/completions`, {}, [{ role: "system", content: SYSTEM }, ...histories[0]]));
      for (let k = 0; k < roots.length; k++) {
        const s = sessions[k];
        const x = anthropic
          ? await call(`${s.urls.anthropic}/v1/messages`, { "x-api-key": s.token, "anthropic-version": "2023-06-01" }, histories[k])
          : await call(`${s.urls.openai}/chat/completions`, { authorization: `Bearer ${s.token}` }, histories[k]);
        got[k].push(x);
        if (multi) {
          if (histories[k].length > 12) histories[k] = opening();
          histories[k] = [...histories[k], { role: "assistant", content: answerOf(x.text) }, { role: "user", content: `next step ${i}` }];
        }
      }
    }
    if (r === 0) continue; // warm-up
    direct.push({ first: median(engineOwn.map((x) => x.first)), total: median(engineOwn.map((x) => x.total)) });
    for (let k = 0; k < roots.length; k++) perRound[k].push({ first: median(got[k].map((x) => x.first)), total: median(got[k].map((x) => x.total)) });
  }
} finally {
  for (const g of gateways) await stop(g);
  await stop(engine);
  await dispatcher.close();
  for (const p of prefixes) await dropPrefix(p);
}
const f = (/** @type {number} */ x) => x.toFixed(2);
console.log(`stream=${stream} multi=${multi} anthropic=${anthropic}, ${N} calls × ${ROUNDS} rounds; per round p50 first byte/total ms`);
console.log(`engine: ${direct.map((x) => `${f(x.first)}/${f(x.total)}`).join("  ")}`);
for (let k = 0; k < roots.length; k++) {
  const added = perRound[k].map((x, i) => x.first - direct[i].first);
  console.log(`${names[k]}: ${perRound[k].map((x) => `${f(x.first)}/${f(x.total)}`).join("  ")}`);
  console.log(`  first byte over the engine's, per round: ${added.map(f).join(" ")} (median ${f(median(added))})`);
}
