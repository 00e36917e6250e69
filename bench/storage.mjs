// 5. Storage: Redis bytes per recorded token after real calls through the gateway, and gateway RSS
// with 10k open sessions.
import { procMemory, startEngineSim, startGateway, stop } from "./lib/procs.mjs";
import { dropPrefix, redisClient, uniquePrefix } from "./lib/redis.mjs";
import { api, openSessions } from "./lib/rollgate.mjs";
import { printTable, round, sleep } from "./lib/stats.mjs";

const OUTPUT_TOKENS = 64;

/** @typedef {import("@rollgate/protocol").CompletionRecord} CompletionRecord */

/**
 * One agent-like session: `turns` calls, each prompt = the whole conversation so far.
 * @param {import("@rollgate/protocol").CreateSessionResponse} session
 * @param {number} turns
 */
async function converse(session, turns) {
  const messages = [
    { role: "system", content: "You are a coding agent. Use short answers." },
    { role: "user", content: "Read repo/README.md and tell me what the project does, then list the failing tests." },
  ];
  for (let t = 0; t < turns; t++) {
    const res = await fetch(`${session.urls.openai}/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${session.token}` },
      body: JSON.stringify({ model: "m", messages, max_tokens: OUTPUT_TOKENS }),
    });
    if (!res.ok) throw new Error(`call ${t} → ${res.status}: ${await res.text()}`);
    const body = /** @type {{ choices: { message: { content: string } }[] }} */ (await res.json());
    messages.push({ role: "assistant", content: body.choices[0].message.content });
    messages.push({ role: "user", content: `Tool output ${t}: 3 passed, 1 failed (test_parse_dates). Continue.` });
  }
}

/** @param {{ quick?: boolean }} [options] */
export async function run({ quick = false } = {}) {
  const cfg = quick ? { sessions: 5, turns: 5, openSessions: 1000 } : { sessions: 20, turns: 10, openSessions: 10_000 };
  const prefix = uniquePrefix("storage");
  const prefix2 = uniquePrefix("storage-rss");
  /** @type {import("./lib/procs.mjs").Child[]} */
  const procs = [];
  const redis = redisClient();
  try {
    const engine = await startEngineSim({ "random-tokens": OUTPUT_TOKENS });
    procs.push(engine);
    const gateway = await startGateway({ prefix, engineUrl: engine.ready });
    procs.push(gateway);

    // Bytes per recorded token.
    const sessions = await openSessions(gateway.ready, cfg.sessions);
    await Promise.all(sessions.map((s) => converse(s, cfg.turns)));
    let bytes = 0;
    let headsBytes = 0;
    let promptTokens = 0;
    let outputTokens = 0;
    let uniqueTokens = 0;
    let records = 0;
    /** @type {Record<"prompt_ids" | "output_ids" | "output_logprobs" | "request" | "message" | "other" | "total", number>} */
    const json = { prompt_ids: 0, output_ids: 0, output_logprobs: 0, request: 0, message: 0, other: 0, total: 0 };
    for (const s of sessions) {
      const key = `${prefix}:{s:${s.id}}:records`;
      bytes += Number(await redis.call("MEMORY", "USAGE", key, "SAMPLES", "0"));
      // The records' heads (what each call reads of the earlier ones): beside the goal's figure, not in it.
      headsBytes += Number(await redis.call("MEMORY", "USAGE", `${prefix}:{s:${s.id}}:heads`, "SAMPLES", "0"));
      const { completions } = /** @type {{ completions: CompletionRecord[] }} */ (await api(gateway.ready, `/v1/sessions/${s.id}/completions`));
      for (const r of completions) {
        records++;
        promptTokens += r.prompt_ids.length;
        outputTokens += r.output_ids.length;
        const whole = JSON.stringify(r).length;
        let parts = 0;
        for (const k of /** @type {const} */ (["prompt_ids", "output_ids", "output_logprobs", "request", "message"])) {
          const n = JSON.stringify(r[k]).length;
          json[k] += n;
          parts += n;
        }
        json.other += whole - parts;
        json.total += whole;
      }
      const last = /** @type {CompletionRecord} */ (completions.at(-1));
      uniqueTokens += last.prompt_ids.length + last.output_ids.length;
    }
    const recorded = promptTokens + outputTokens;
    const perToken = {
      records,
      redis_bytes: bytes,
      recorded_tokens: recorded,
      prompt_tokens: promptTokens,
      output_tokens: outputTokens,
      unique_session_tokens: uniqueTokens,
      bytes_per_recorded_token: round(bytes / recorded, 2),
      bytes_per_output_token: round(bytes / outputTokens, 1),
      bytes_per_unique_session_token: round(bytes / uniqueTokens, 1),
      heads_bytes: headsBytes,
      heads_bytes_per_recorded_token: round(headsBytes / recorded, 2),
      json_share_pct: Object.fromEntries(Object.entries(json).filter(([k]) => k !== "total").map(([k, v]) => [k, round((100 * v) / json.total, 1)])),
      /** @type {Record<string, number>} */
      json_bytes_per_token: {
        prompt_ids: round(json.prompt_ids / promptTokens, 2),
        output_ids: round(json.output_ids / outputTokens, 2),
        output_logprobs: round(json.output_logprobs / outputTokens, 2),
      },
    };
    printTable(
      `5a. Redis bytes per recorded token (${cfg.sessions} sessions × ${cfg.turns} calls, ${OUTPUT_TOKENS} output tokens each; MEMORY USAGE of the records hashes)`,
      ["records", "Redis bytes", "recorded tokens (prompt+output)", "bytes/recorded token", "bytes/output token", "bytes/unique session token", "+ heads bytes/recorded token"],
      [[records, bytes, recorded, perToken.bytes_per_recorded_token, perToken.bytes_per_output_token, perToken.bytes_per_unique_session_token, perToken.heads_bytes_per_recorded_token]],
    );
    printTable(
      "5b. What a record holds as the API returns it (share of its JSON; JSON bytes per token; Redis holds it packed, docs/operations.md)",
      ["part", "% of record JSON", "JSON bytes/token"],
      Object.entries(perToken.json_share_pct).map(([k, v]) => [k, v, perToken.json_bytes_per_token[k] ?? null]),
    );
    await stop(gateway);
    procs.pop();

    // Gateway RSS with N open sessions (a fresh gateway; sessions created through the API).
    const gw2 = await startGateway({ prefix: prefix2, engineUrl: engine.ready });
    procs.push(gw2);
    await openSessions(gw2.ready, 50, { parallel: 8 }); // warm-up: JIT, pools
    await sleep(500);
    const before = procMemory(gw2.proc.pid);
    const t0 = Date.now();
    await openSessions(gw2.ready, cfg.openSessions, { parallel: 32 });
    const createS = (Date.now() - t0) / 1000;
    await sleep(1000);
    const after = procMemory(gw2.proc.pid);
    const loads = await redis.zrange(`${prefix2}:{routing}:load`, 0, "-1", "WITHSCORES");
    const open = loads.filter((_, i) => i % 2 === 1).reduce((a, x) => a + Number(x), 0);
    const mib = (/** @type {number} */ b) => round(b / 2 ** 20, 1);
    const rss = {
      open_sessions: open,
      create_per_s: round(cfg.openSessions / createS, 0),
      rss_before_mib: mib(before.rss),
      rss_after_mib: mib(after.rss),
      rss_hwm_mib: mib(after.hwm),
      rss_growth_bytes_per_session: round((after.rss - before.rss) / cfg.openSessions, 0),
    };
    printTable(
      `5c. Gateway RSS with ${cfg.openSessions} open sessions (/proc/<pid>/status)`,
      ["open sessions", "created/s", "RSS before MiB", "RSS after MiB", "peak (VmHWM) MiB", "growth bytes/session"],
      [[rss.open_sessions, rss.create_per_s, rss.rss_before_mib, rss.rss_after_mib, rss.rss_hwm_mib, rss.rss_growth_bytes_per_session]],
    );
    const targetsCheck = {
      bytes_per_token_le_8: { value: perToken.bytes_per_recorded_token, met: perToken.bytes_per_recorded_token <= 8 },
      rss_10k_sessions_lt_1gib: { value: rss.rss_after_mib, met: after.rss < 2 ** 30, sessions: cfg.openSessions },
    };
    console.log(`targets: ${JSON.stringify(targetsCheck)}`);
    return { config: { ...cfg, output_tokens: OUTPUT_TOKENS }, bytes_per_token: perToken, rss, targets: targetsCheck };
  } finally {
    redis.disconnect();
    for (const p of procs.reverse()) await stop(p);
    await dropPrefix(prefix);
    await dropPrefix(prefix2);
  }
}
