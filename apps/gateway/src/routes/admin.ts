import { randomUUID } from "node:crypto";
import { parseRankMember } from "@rollgate/store";
import type { FastifyPluginAsync } from "fastify";
import { z } from "zod";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { errorBody, trainerErrorHandler, validationError } from "../errors.js";
import { pausePlan, type AbortPauseMode } from "../engines/capabilities.js";
import { pauseEngine, resumeEngine, type EnginePauseMode } from "../ops/engine-control.js";
import { WeightLoad, describeLoadFailures, loadEngineWeights } from "../ops/weight-loading.js";

/** How each per-engine pause plan drives the engine's own pause route. */
const ENGINE_MODE: Record<AbortPauseMode, EnginePauseMode> = { keep: "freeze", in_place: "freeze", abort_continue: "abort", drain: "finish" };
const FROZEN = new Set<string>(["keep", "in_place"]);

const PauseBody = z
  .object({
    mode: z.enum(["drain", "abort"]).default("drain"),
    /** How long to wait for in-flight calls (every replica) to finish. */
    timeout_s: z.number().nonnegative().max(3600).default(60),
  })
  .strict();
const EnginesQuery = z.object({
  refresh: z.enum(["true", "false"]).optional(),
  wait_s: z.coerce.number().min(0).max(120).default(30),
});
const Version = z.union([z.string().min(1).max(128), z.number().int().nonnegative()]);
const WeightsBody = z.object({ version: Version }).strict();
const InferenceWeightsBody = z.object({ version: Version, load: WeightLoad.optional() }).strict();

/** The RL loop's admin routes (docs/http-api.md#admin): pause/resume inference, the weight version, engine state. */
export function adminRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.setErrorHandler(trainerErrorHandler);
    app.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));

    /**
     * Every replica stops sending new calls (agents wait, they are not failed). `drain`: in-flight
     * calls finish, then (or after `timeout_s`) the engines' own pause routes are called. `abort`:
     * each engine is paused at once the best way it allows (engines/capabilities.ts `pausePlan`):
     * frozen in place (vLLM `keep`, SGLang `in_place`) and resumed on the new weights, the gateway
     * marking which tokens came after the change; or cut (finish_reason "abort" with the tokens so
     * far) and, after resume, continued token-in by the gateway, for models whose profile declares
     * a gateway parser; or, when neither is possible, drained first. Agents only see latency, and
     * records note which tokens came from which weight version.
     */
    app.post("/admin/inference/pause", async (req, reply) => {
      const parsed = PauseBody.safeParse(req.body ?? {});
      if (!parsed.success) return reply.code(400).send(validationError(parsed.error));
      const { mode, timeout_s } = parsed.data;
      const state = { mode, since: new Date().toISOString(), id: randomUUID() };
      // Replicas report their in-flight count within a few ms of every call start and end.
      const inflightAtPause = await ctx.admin.inflight();
      await ctx.admin.pause(state);
      // Give every replica a moment to hear the pause: no new engine calls, and an "abort" answer
      // from here on is read as a cut to continue after resume.
      await new Promise((r) => setTimeout(r, 200));
      const plans = await Promise.all(
        ctx.registry.engines.map(async (e, i) => {
          if (mode === "drain") return { mode: "drain" as const, why: "drain-mode pause" };
          const caps = await ctx.registry.capabilities(i).catch(() => null);
          const profile = ctx.registry.profiles[i]!;
          return caps ? pausePlan(e.kind, caps, profile) : { mode: profile.gateway_parser ? ("abort_continue" as const) : ("drain" as const), why: "the engine's capabilities are unknown" };
        }),
      );
      const now = plans.flatMap((p, i) => (p.mode === "drain" ? [] : [i]));
      const later = plans.flatMap((p, i) => (p.mode === "drain" ? [i] : []));
      const pauseOne = (i: number) => pauseEngine(ctx.registry.dispatcher, ctx.registry.engines[i]!, ENGINE_MODE[plans[i]!.mode]);
      const results: Awaited<ReturnType<typeof pauseOne>>[] = [];
      for (const [k, r] of (await Promise.all(now.map(pauseOne))).entries()) results[now[k]!] = r;
      // Calls on frozen engines stay in flight until resume; only the others are waited for.
      const onDrained = (byRank: Record<string, number>) =>
        Object.entries(byRank).reduce((n, [member, count]) => (later.includes(parseRankMember(member).engine) || plans[parseRankMember(member).engine]?.mode === "abort_continue" ? n + count : n), 0);
      const deadline = Date.now() + timeout_s * 1000;
      // Read again now that every replica has heard the pause and reported (reports are coalesced
      // over a few ms, so a call that had just started may be missing from the first count).
      let remaining = onDrained(await ctx.admin.inflightByRank());
      while (remaining > 0 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        remaining = onDrained(await ctx.admin.inflightByRank());
      }
      for (const [k, r] of (await Promise.all(later.map(pauseOne))).entries()) results[later[k]!] = r;
      const frozen = Object.entries(await ctx.admin.inflightByRank()).reduce((n, [member, count]) => (FROZEN.has(plans[parseRankMember(member).engine]?.mode ?? "") ? n + count : n), 0);
      return {
        paused: true,
        mode,
        id: state.id,
        inflight_at_pause: inflightAtPause,
        drained: remaining === 0,
        still_inflight: remaining,
        frozen,
        engines: results.map((r, i) => ({ ...r, plan: plans[i]!.mode, why: plans[i]!.why })),
      };
    });

    app.post("/admin/inference/resume", async () => {
      const engines = await Promise.all(ctx.registry.engines.map((e) => resumeEngine(ctx.registry.dispatcher, e)));
      const was = await ctx.admin.resume();
      return { paused: false, was_paused: was !== null, engines };
    });

    app.get("/admin/inference", async () => ({ paused: ctx.pause.paused, inflight: await ctx.admin.inflight() }));

    /** The version stamped on every engine call from now on, on every replica. */
    const setVersion = async (version: string) => {
      await ctx.weights.set(version);
      await ctx.admin.publish({ type: "weights", version });
    };

    app.post("/admin/weights", async (req, reply) => {
      const parsed = WeightsBody.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send(validationError(parsed.error));
      const version = String(parsed.data.version);
      await setVersion(version);
      return { version };
    });

    /**
     * Sets the weight version and, with `load`, first makes every engine load the new weights
     * through its own route (only while paused, so no call runs on half-loaded weights). The
     * version moves only when every engine confirmed the load; otherwise 502 says which engine and
     * rank did not, the version stays, and inference stays paused for a retry.
     */
    app.post("/admin/inference/weights", async (req, reply) => {
      const parsed = InferenceWeightsBody.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send(validationError(parsed.error));
      const version = String(parsed.data.version);
      const { load } = parsed.data;
      const previous = await ctx.weights.get();
      if (!load) {
        await setVersion(version);
        return { version, previous_version: previous, load: null, engines: [] };
      }
      if (!(await ctx.admin.pauseState())) {
        return reply
          .code(409)
          .send(errorBody("not_paused", "loading weights needs inference paused: POST /admin/inference/pause first, then load, then POST /admin/inference/resume"));
      }
      const engines = await Promise.all(ctx.registry.engines.map((e, i) => loadEngineWeights(ctx.registry.dispatcher, i, e, load, version)));
      if (engines.some((e) => !e.ok)) {
        const message = `weights not loaded: ${describeLoadFailures(engines)}. The weight version stays ${previous ?? "unset"} and inference stays paused.`;
        req.log.error({ version, engines }, "weight load failed");
        return reply.code(502).send(errorBody("weights_load_failed", message, { version, previous_version: previous, load, engines }));
      }
      await setVersion(version);
      return { version, previous_version: previous, load, engines };
    });

    app.get("/admin/weights", async () => ({ version: await ctx.weights.get() }));

    /**
     * The engines: their ranks' health and load, and each engine's preflight (what will hold before
     * a run: profile, vocabulary, token-in, tool-turn round trip, reasoning drops, pause mode).
     * `?refresh=true` runs the preflight again; a preflight still running after `wait_s` is null.
     */
    app.get("/admin/engines", async (req, reply) => {
      const q = EnginesQuery.safeParse(req.query);
      if (!q.success) return reply.code(400).send(validationError(q.error));
      const [loads, down, inflight, preflight] = await Promise.all([
        ctx.router.loads(),
        ctx.router.downRanks(),
        ctx.admin.inflightByRank(),
        ctx.preflight.all({ full: true, refresh: q.data.refresh === "true", waitMs: q.data.wait_s * 1000 }),
      ]);
      const health = new Map(ctx.health.snapshot().map((h) => [h.member, h]));
      return {
        engines: ctx.registry.engines.map((e, index) => ({
          index,
          kind: e.kind,
          url: e.url,
          dp_size: e.dp_size,
          profile: ctx.registry.profiles[index]!.name,
          preflight: preflight[index] ?? null,
          ranks: ctx.registry
            .members()
            .filter((m) => parseRankMember(m).engine === index)
            .map((m) => {
              const h = health.get(m);
              return {
                dp_rank: parseRankMember(m).dpRank,
                healthy: !down.has(m),
                sessions: loads[m] ?? 0,
                inflight: inflight[m] ?? 0,
                recent_calls: ctx.health.recentLatency(m),
                last_probe_latency_ms: h?.lastLatencyMs ?? null,
                last_probe: h?.lastCheck ?? null,
                detail: h?.detail ?? null,
              };
            }),
        })),
        inflight_this_replica: ctx.pause.inflightCount,
      };
    });
  };
}
