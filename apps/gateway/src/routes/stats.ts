import type { TaskRecord } from "@rollgate/protocol";
import { parseRankMember } from "@rollgate/store";
import type { FastifyPluginAsync } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import { request } from "undici";
import { z } from "zod";
import type { GatewayContext } from "../context.js";
import { TRAINER_SECURITY, errorResponses } from "./schemas.js";

/**
 * Read-only aggregates the dashboard shows, beyond the task API:
 *
 *   GET /v1/stats/overview     task counts by status, mean reward, usage, weight version
 *   GET /v1/stats/groups       per-group reward distribution
 *   GET /v1/stats/timeseries   LLM calls and tokens/s per time bucket
 *   GET /v1/stats/ranks        per (engine, dp_rank): open sessions and engine health
 *
 * Aggregates scan the newest tasks (bounded by `scan`), which is what a dashboard of a running
 * experiment wants, and costs nothing when nobody looks.
 */

const ScanQuery = z.object({ scan: z.coerce.number().int().min(1).max(5000).default(1000) });
const GroupsQuery = ScanQuery.extend({ limit: z.coerce.number().int().min(1).max(500).default(50), bins: z.coerce.number().int().min(2).max(50).default(10) });
const SeriesQuery = z.object({
  minutes: z.coerce.number().min(1).max(24 * 60).default(15),
  bucket_s: z.coerce.number().int().min(1).max(3600).default(10),
  scan: z.coerce.number().int().min(1).max(2000).default(300),
});
/** Dashboard aggregates: documented as open objects (their shape follows what the page draws). */
const Aggregate = z.looseObject({});
const tags = ["stats"];
const security = TRAINER_SECURITY;

function mean(xs: number[]): number | null {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
}

function std(xs: number[]): number | null {
  const m = mean(xs);
  if (m === null) return null;
  return Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / xs.length);
}

export function statsRoutes(ctx: GatewayContext): FastifyPluginAsync {
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

  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();

    const overviewSchema = {
      tags,
      security,
      summary: "Task counts by status, mean reward, usage and the weight version over the newest tasks",
      querystring: ScanQuery,
      response: { 200: Aggregate.describe("counts, reward and usage"), ...errorResponses(400, 401) },
    };
    app.get("/v1/stats/overview", { schema: overviewSchema }, async (req) => {
      const tasks = await recentTasks(req.query.scan);
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

    const groupsSchema = {
      tags,
      security,
      summary: "Per GRPO group: its reward distribution over the newest tasks",
      querystring: GroupsQuery,
      response: { 200: Aggregate.describe("the groups, and the reward range of their histograms"), ...errorResponses(400, 401) },
    };
    app.get("/v1/stats/groups", { schema: groupsSchema }, async (req) => {
      const q = req.query;
      const groups = new Map<string, { tasks: number; ended: number; rewards: number[]; newest: string }>();
      for (const t of await recentTasks(q.scan)) {
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
      const width = (hi - lo) / q.bins || 1;
      return {
        range: { min: lo, max: hi, bins: q.bins },
        groups: [...groups.entries()].slice(0, q.limit).map(([group_id, g]) => {
          const histogram = new Array<number>(q.bins).fill(0);
          for (const r of g.rewards) histogram[Math.min(q.bins - 1, Math.floor((r - lo) / width))]!++;
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

    const seriesSchema = {
      tags,
      security,
      summary: "LLM calls, tokens/s and tasks ended per time bucket",
      querystring: SeriesQuery,
      response: { 200: Aggregate.describe("one entry per time bucket"), ...errorResponses(400, 401) },
    };
    app.get("/v1/stats/timeseries", { schema: seriesSchema }, async (req) => {
      const q = req.query;
      const bucketMs = q.bucket_s * 1000;
      const now = Date.now();
      const end = Math.floor(now / bucketMs) * bucketMs + bucketMs;
      const start = end - Math.ceil((q.minutes * 60_000) / bucketMs) * bucketMs;
      const n = Math.round((end - start) / bucketMs);
      const buckets = Array.from({ length: n }, (_, i) => ({ t: new Date(start + i * bucketMs).toISOString(), llm_calls: 0, completion_tokens: 0, prompt_tokens: 0, tasks_ended: 0 }));
      for (const t of await recentTasks(q.scan)) {
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
        bucket_s: q.bucket_s,
        buckets: buckets.map((b) => ({ ...b, tokens_per_s: b.completion_tokens / q.bucket_s })),
      };
    });

    const ranksSchema = { tags, security, summary: "Per (engine, dp_rank): open sessions and engine health; each engine's preflight", response: { 200: Aggregate.describe("engines and their ranks"), ...errorResponses(401) } };
    app.get("/v1/stats/ranks", { schema: ranksSchema }, async () => {
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
  };
}
