import { readFile, readdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TrajectoryBuilderName, type CompletionRecord, type Session, type TaskRecord } from "@rollgate/protocol";
import { parseRankMember } from "@rollgate/store";
import { TrajectoryInvariantError, buildTrajectory } from "@rollgate/trajectory";
import type { FastifyPluginAsync, FastifyReply } from "fastify";
import { request } from "undici";
import { z } from "zod";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { errorBody, trainerErrorHandler, validationError } from "../errors.js";
import { EngineError } from "../engines/errors.js";
import { trajectoryOptions } from "../trajectory-options.js";
import { decodeTrajectory, type TokenDecoder } from "./dashboard-decode.js";

/**
 * The web dashboard (`GET /dashboard`: plain HTML/CSS/JS from `apps/gateway/dashboard/`, no build
 * step, nothing fetched from elsewhere) and the small read-only JSON it needs beyond the task API:
 *
 *   GET /v1/stats/overview               task counts by status, mean reward, usage, weight version
 *   GET /v1/stats/groups                 per-group reward distribution
 *   GET /v1/stats/timeseries             LLM calls and tokens/s per time bucket
 *   GET /v1/stats/ranks                  per (engine, dp_rank): open sessions and engine health
 *   GET /v1/sessions/:id/trajectory/decoded   the trajectory as text (decoded by the engine's own
 *                                             /detokenize, cached), trainable runs marked
 *
 * Aggregates scan the newest tasks (bounded by `scan`), which is what a dashboard of a running
 * experiment wants, and costs nothing when nobody looks. The page itself needs no key; the JSON
 * does (the page asks for the key and sends it as a Bearer token).
 */

const STATIC_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../dashboard");
const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
};

const ScanQuery = z.object({ scan: z.coerce.number().int().min(1).max(5000).default(1000) });
const GroupsQuery = ScanQuery.extend({ limit: z.coerce.number().int().min(1).max(500).default(50), bins: z.coerce.number().int().min(2).max(50).default(10) });
const SeriesQuery = z.object({
  minutes: z.coerce.number().min(1).max(24 * 60).default(15),
  bucket_s: z.coerce.number().int().min(1).max(3600).default(10),
  scan: z.coerce.number().int().min(1).max(2000).default(300),
});
const DecodedQuery = z.object({ builder: TrajectoryBuilderName.default("prefix_merging") });
const IdParams = z.object({ id: z.string().min(1).max(256) });


/** The engine whose tokenizer decodes a session's tokens: the one its records came from, else its assignment. */
function engineOf(ctx: GatewayContext, session: Session, records: readonly CompletionRecord[]): number {
  const fromRecords = records.length > 0 ? ctx.registry.indexOf(records[0]!.engine) : -1;
  return fromRecords >= 0 ? fromRecords : records.length === 0 ? (session.assignment?.engine ?? -1) : -1;
}

function mean(xs: number[]): number | null {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
}

function std(xs: number[]): number | null {
  const m = mean(xs);
  if (m === null) return null;
  return Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / xs.length);
}

export function dashboardRoutes(ctx: GatewayContext): FastifyPluginAsync {
  async function recentTasks(scan: number): Promise<TaskRecord[]> {
    const out: TaskRecord[] = [];
    let cursor: string | undefined;
    while (out.length < scan) {
      const page = await ctx.tasks.list({ limit: Math.min(1000, scan - out.length), ...(cursor ? { cursor } : {}) });
      out.push(...page.tasks);
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
    }
    return out;
  }

  return async (app) => {
    // ── the page and its static files (no key: the page asks for one) ──
    const files = new Set(await readdir(STATIC_DIR).catch(() => [] as string[]));
    async function sendStatic(name: string, reply: FastifyReply) {
      if (!files.has(name) || !CONTENT_TYPES[path.extname(name)]) return reply.code(404).send(errorBody("not_found", `no dashboard file ${name}`));
      const body = await readFile(path.join(STATIC_DIR, name));
      return reply.type(CONTENT_TYPES[path.extname(name)]!).header("cache-control", "no-cache").send(body);
    }
    app.get("/dashboard", (_req, reply) => sendStatic("index.html", reply));
    app.get("/dashboard/", (_req, reply) => sendStatic("index.html", reply));
    app.get("/dashboard/:file", (req, reply) => sendStatic((req.params as { file: string }).file, reply));

    // ── read-only JSON (API key like every trainer route) ──
    await app.register(async (api) => {
      api.setErrorHandler(trainerErrorHandler);
      api.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));

      api.get("/v1/stats/overview", async (req, reply) => {
        const q = ScanQuery.safeParse(req.query);
        if (!q.success) return reply.code(400).send(validationError(q.error));
        const tasks = await recentTasks(q.data.scan);
        const byStatus: Record<string, number> = { queued: 0, running: 0, completed: 0, failed: 0, timed_out: 0, cancelled: 0 };
        const rewards: number[] = [];
        const usage = { llm_calls: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0 };
        for (const t of tasks) {
          byStatus[t.status] = (byStatus[t.status] ?? 0) + 1;
          const r = t.result;
          if (r?.reward !== null && r?.reward !== undefined && r.status === "completed") rewards.push(r.reward);
          if (r) for (const k of Object.keys(usage) as (keyof typeof usage)[]) usage[k] += r.usage[k];
        }
        return {
          scanned: tasks.length,
          by_status: byStatus,
          reward: { mean: mean(rewards), count: rewards.length },
          usage,
          weight_version: await ctx.weights.get(),
          engines: ctx.registry.engines.map((e) => ({ kind: e.kind, url: e.url, dp_size: e.dp_size })),
        };
      });

      api.get("/v1/stats/groups", async (req, reply) => {
        const q = GroupsQuery.safeParse(req.query);
        if (!q.success) return reply.code(400).send(validationError(q.error));
        const groups = new Map<string, { tasks: number; ended: number; rewards: number[]; newest: string }>();
        for (const t of await recentTasks(q.data.scan)) {
          if (!t.group_id) continue;
          const g = groups.get(t.group_id) ?? { tasks: 0, ended: 0, rewards: [], newest: t.created_at };
          g.tasks++;
          if (t.result) g.ended++;
          if (t.result?.reward !== null && t.result?.reward !== undefined) g.rewards.push(t.result.reward);
          groups.set(t.group_id, g);
        }
        const all = [...groups.values()].flatMap((g) => g.rewards);
        const lo = all.length ? Math.min(0, ...all) : 0;
        const hi = all.length ? Math.max(1, ...all) : 1;
        const width = (hi - lo) / q.data.bins || 1;
        return {
          range: { min: lo, max: hi, bins: q.data.bins },
          groups: [...groups.entries()].slice(0, q.data.limit).map(([group_id, g]) => {
            const histogram = new Array<number>(q.data.bins).fill(0);
            for (const r of g.rewards) histogram[Math.min(q.data.bins - 1, Math.floor((r - lo) / width))]!++;
            return {
              group_id,
              tasks: g.tasks,
              ended: g.ended,
              rewards: g.rewards,
              mean: mean(g.rewards),
              std: std(g.rewards),
              min: g.rewards.length ? Math.min(...g.rewards) : null,
              max: g.rewards.length ? Math.max(...g.rewards) : null,
              histogram,
              created_at: g.newest,
            };
          }),
        };
      });

      api.get("/v1/stats/timeseries", async (req, reply) => {
        const q = SeriesQuery.safeParse(req.query);
        if (!q.success) return reply.code(400).send(validationError(q.error));
        const bucketMs = q.data.bucket_s * 1000;
        const now = Date.now();
        const end = Math.floor(now / bucketMs) * bucketMs + bucketMs;
        const start = end - Math.ceil((q.data.minutes * 60_000) / bucketMs) * bucketMs;
        const n = Math.round((end - start) / bucketMs);
        const buckets = Array.from({ length: n }, (_, i) => ({ t: new Date(start + i * bucketMs).toISOString(), llm_calls: 0, completion_tokens: 0, prompt_tokens: 0, tasks_ended: 0 }));
        for (const t of await recentTasks(q.data.scan)) {
          if (t.finished_at && Date.parse(t.finished_at) < start) continue;
          // Stream ids are "<ms>-<seq>": start reading at the window's first millisecond.
          for (const e of await ctx.tasks.events(t.id, `${start - 1}-99999`, 2000)) {
            const at = Date.parse(e.at);
            if (at < start || at >= end) continue;
            const b = buckets[Math.floor((at - start) / bucketMs)]!;
            if (e.type === "llm_call") {
              b.llm_calls++;
              b.completion_tokens += Number(e.data.completion_tokens ?? 0);
              b.prompt_tokens += Number(e.data.prompt_tokens ?? 0);
            } else if (e.type === "terminal") b.tasks_ended++;
          }
        }
        return {
          bucket_s: q.data.bucket_s,
          buckets: buckets.map((b) => ({ ...b, tokens_per_s: b.completion_tokens / q.data.bucket_s })),
        };
      });

      api.get("/v1/stats/ranks", async () => {
        const loads = await ctx.router.loads();
        const health = await Promise.all(
          ctx.registry.engines.map(async (e) => {
            const t0 = Date.now();
            try {
              const res = await request(`${e.url}/health`, { dispatcher: ctx.registry.dispatcher, headersTimeout: 2_000, bodyTimeout: 2_000 });
              await res.body.dump();
              return { healthy: res.statusCode < 400, status: res.statusCode, latency_ms: Date.now() - t0 };
            } catch (err) {
              return { healthy: false, status: null, latency_ms: Date.now() - t0, error: (err as Error).message };
            }
          }),
        );
        // Each engine's preflight: never waited for (a first view starts the full one; "…" until it is done).
        const preflight = await ctx.preflight.all({ full: true, waitMs: 0 });
        return {
          engines: ctx.registry.engines.map((e, index) => ({ index, kind: e.kind, url: e.url, profile: ctx.registry.profiles[index]!.name, preflight: preflight[index] ?? null })),
          ranks: ctx.registry.members().map((member) => {
            const { engine, dpRank } = parseRankMember(member);
            const e = ctx.registry.engines[engine]!;
            return { rank: member, engine, dp_rank: dpRank, kind: e.kind, url: e.url, sessions: loads[member] ?? 0, ...health[engine]! };
          }),
        };
      });

      api.get("/v1/sessions/:id/trajectory/decoded", async (req, reply) => {
        const { id } = IdParams.parse(req.params);
        const q = DecodedQuery.safeParse(req.query);
        if (!q.success) return reply.code(400).send(validationError(q.error));
        const session = await ctx.sessions.get(id);
        if (!session) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
        const records = await ctx.sessions.records(id);
        let trajectory;
        try {
          trajectory = buildTrajectory(records, q.data.builder, trajectoryOptions(ctx.registry, session, records));
        } catch (err) {
          if (err instanceof TrajectoryInvariantError) {
            return reply.code(422).send(errorBody("trajectory_invalid", err.message, { record_id: err.record_id }));
          }
          throw err;
        }
        // Decoded by the engine that produced the tokens: only its tokenizer knows what they say.
        const engine = engineOf(ctx, session, records);
        if (engine < 0) return reply.code(409).send(errorBody("no_engine", `session ${id} ran on an engine that is no longer configured: its tokens cannot be decoded`));
        const decoder: TokenDecoder = { decode: (ids) => ctx.registry.decode(engine, ids) };
        try {
          return { session_id: id, engine: ctx.registry.engines[engine]!.url, ...(await decodeTrajectory(trajectory, decoder)) };
        } catch (err) {
          if (err instanceof EngineError) return reply.code(502).send(errorBody("engine_unavailable", `cannot decode through the engine: ${err.message}`));
          throw err;
        }
      });
    });
  };
}
