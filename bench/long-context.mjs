// Long agent conversations: what a multi-turn call costs the gateway and the engine as the
// conversation grows, against a bare proxy in front of the same engine-sim (real Qwen3 tokenizer
// and template). CONC agents each hold a conversation: a long first user message (SIZES words),
// then turns of the engine's answer echoed back and a short user message, as agents do; every
// call asks for a whole answer. Each round, every target (the proxy, this checkout's gateway and,
// with BENCH_AB_ROOT, that checkout's) runs CALLS more turns of its own copies of the
// conversations; CPU per call of the process in the middle and of the engine come from /proc.
//   node bench/long-context.mjs
//   SIZES=2000,16000 CONC=8 CALLS=8 ROUNDS=3 BENCH_AB_ROOT=<another built checkout> node bench/long-context.mjs
//   BENCH_NODE_ARGS="--cpu-prof --cpu-prof-dir=/tmp/prof" gives node flags to this checkout's gateway alone
import { performance } from "node:perf_hooks";
import { Agent, request } from "undici";
import { procCpu, startEngineSim, startFastifyProxy, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, uniquePrefix } from "./lib/redis.mjs";
import { openSessions } from "./lib/rollgate.mjs";
import { median, printTable, round } from "./lib/stats.mjs";

const env = process.env;
const SIZES = (env.SIZES ?? "2000,16000,32000").split(",").map(Number);
const CONC = Number(env.CONC ?? 8);
const CALLS = Number(env.CALLS ?? 8);
const ROUNDS = Number(env.ROUNDS ?? 3);
const MODEL = "Qwen/Qwen3-8B";
const WORDS = "the of and to in is that for it as was with be by on not this are or from at which but have an they you were there been one all we their has would when if so no will more out up into do said what about its than them can only other new some could time these two may first then any like now over such even most made after also did many before must through back years where much your way well down should because each just those people".split(" ");

/**
 * The same long text for every run (a linear congruential generator over common words).
 * @param {number} words
 */
function text(words) {
  let seed = 7;
  const out = [];
  for (let i = 0; i < words; i++) {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    out.push(WORDS[seed % WORDS.length]);
  }
  return out.join(" ");
}

const engine = await startEngineSim({ "ttft-ms": 20, "tpot-ms": 0, "random-tokens": 16 });
const roots = env.BENCH_AB_ROOT ? [undefined, env.BENCH_AB_ROOT] : [undefined];
const prefixes = roots.map((_, i) => uniquePrefix(`long-context-${i}`));
const nodeArgs = env.BENCH_NODE_ARGS ? env.BENCH_NODE_ARGS.split(" ").filter(Boolean) : [];
const gateways = await Promise.all(roots.map((root, i) => startGateway({ prefix: prefixes[i], engineUrl: engine.ready, ...(root ? { root } : { nodeArgs }) })));
const proxy = await startFastifyProxy(engine.ready);
const dispatcher = new Agent({ connections: CONC * 2, keepAliveTimeout: 30_000, headersTimeout: 120_000, bodyTimeout: 120_000 });

/** @typedef {{ role: string, content: string }} Message */
/** @typedef {{ name: string, proc: import("./lib/procs.mjs").Child, url: (k: number) => string, headers: (k: number) => Record<string, string>, convs: Message[][] }} Target */

/**
 * One call; the answer's text and its prompt tokens.
 * @param {string} url
 * @param {Record<string, string>} headers
 * @param {Message[]} messages
 */
async function call(url, headers, messages) {
  const res = await request(url, { method: "POST", dispatcher, headers: { "content-type": "application/json", ...headers }, body: JSON.stringify({ model: MODEL, messages, max_tokens: 16 }) });
  const body = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`${url} → ${res.statusCode}: ${body.slice(0, 300)}`);
  const j = JSON.parse(body);
  return { content: j.choices[0].message.content ?? "", promptTokens: j.usage?.prompt_tokens ?? NaN };
}

/** CALLS turns of each of the target's conversations, CONC at once; CPU of the middle and the engine per call. */
async function turns(/** @type {Target} */ t) {
  /** @type {number[]} */
  const prompt = [];
  const mid0 = procCpu(t.proc.proc.pid).self;
  const eng0 = procCpu(engine.proc.pid).self;
  const t0 = performance.now();
  await Promise.all(
    t.convs.map(async (conv, k) => {
      for (let i = 0; i < CALLS; i++) {
        const a = await call(t.url(k), t.headers(k), conv);
        prompt.push(a.promptTokens);
        conv.push({ role: "assistant", content: a.content }, { role: "user", content: `Next step ${conv.length}.` });
      }
    }),
  );
  const n = CONC * CALLS;
  return { middle: (procCpu(t.proc.proc.pid).self - mid0) / n, engine: (procCpu(engine.proc.pid).self - eng0) / n, wall: (performance.now() - t0) / CALLS, prompt: median(prompt) };
}

const rows = [];
try {
  for (const words of SIZES) {
    const opening = () => [{ role: "system", content: "You are a careful software engineering agent." }, { role: "user", content: text(words) }];
    /** @type {Target[]} */
    const targets = [{ name: "fastify_proxy", proc: proxy, url: () => `${proxy.ready}/v1/chat/completions`, headers: () => ({}), convs: [] }];
    for (let g = 0; g < gateways.length; g++) {
      const sessions = await openSessions(gateways[g].ready, CONC);
      targets.push({ name: g === 0 ? "rollgate" : "rollgate_ab", proc: gateways[g], url: (k) => `${sessions[k].urls.openai}/chat/completions`, headers: (k) => ({ authorization: `Bearer ${sessions[k].token}` }), convs: [] });
    }
    for (const t of targets) t.convs = Array.from({ length: CONC }, opening);
    /** @type {Record<string, Awaited<ReturnType<typeof turns>>[]>} */
    const got = Object.fromEntries(targets.map((t) => [t.name, []]));
    for (let r = 0; r <= ROUNDS; r++) {
      /** @type {string[]} */
      const line = [];
      for (const t of targets) {
        const m = await turns(t);
        if (r === 0) continue; // round 0 warms up
        got[t.name]?.push(m);
        line.push(`${t.name} ${round(m.middle, 3)} ms/call`);
      }
      if (r > 0) console.log(`long-context ${words} words round ${r}: ${line.join(", ")}`);
    }
    const proxyCpu = median(got.fastify_proxy.map((m) => m.middle));
    for (const t of targets) {
      const ms = got[t.name];
      const mid = median(ms.map((m) => m.middle));
      rows.push([words, t.name, median(ms.map((m) => m.prompt)), round(mid, 3), round(mid / proxyCpu, 2), round(median(ms.map((m) => m.engine)), 2), round(median(ms.map((m) => m.wall)), 1)]);
    }
  }
} finally {
  for (const g of gateways) await stop(g);
  await stop(proxy);
  await stop(engine);
  await dispatcher.close();
  for (const p of prefixes) await dropPrefix(p);
}
printTable(
  `Long conversations (engine-sim TTFT 20 ms, 16-token answers; ${CONC} agents × ${CALLS} calls per round, medians of ${ROUNDS} rounds)`,
  ["first message, words", "target", "prompt tokens", "CPU ms/call (process in the middle)", "×proxy", "engine CPU ms/call", "wall ms per turn"],
  rows,
);
