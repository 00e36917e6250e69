import { randomUUID } from "node:crypto";
import { parseRankMember } from "@rollgate/store";
import type { FastifyPluginAsync } from "fastify";
import { z } from "zod";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { errorBody, trainerErrorHandler, validationError } from "../errors.js";
import { pauseEngine, resumeEngine } from "../ops/engine-control.js";
import { WeightLoad, describeLoadFailures, loadEngineWeights } from "../ops/weight-loading.js";

const PauseBody = z
  .object({
    mode: z.enum(["drain", "abort"]).default("drain"),
    /** How long to wait for in-flight calls (every replica) to finish. */
    timeout_s: z.number().nonnegative().max(3600).default(60),
  })
  .strict();
const Version = z.union([z.string().min(1).max(128), z.number().int().nonnegative()]);
const WeightsBody = z.object({ version: Version }).strict();
const InferenceWeightsBody = z.object({ version: Version, load: WeightLoad.optional() }).strict();

/** The RL loop's admin routes (DESIGN §2): pause/resume inference, the weight version, engine state. */
export function adminRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.setErrorHandler(trainerErrorHandler);
    app.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));

    /**
     * Every replica stops sending new calls (agents wait, they are not failed). `drain`: in-flight
     * calls finish, then (or after `timeout_s`) the engines' own pause routes are called. `abort`:
     * the engines are paused at once and cut their in-flight calls (finish_reason "abort" with the
     * tokens so far); after resume each replica continues those calls token-in on the new weights,
     * so agents only see latency and records note which tokens came from which weight version.
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
      const pauseEngines = () => Promise.all(ctx.registry.engines.map((e) => pauseEngine(ctx.registry.dispatcher, e, mode === "abort")));
      const cut = mode === "abort" ? await pauseEngines() : null;
      const deadline = Date.now() + timeout_s * 1000;
      // Read again now that every replica has heard the pause and reported (reports are coalesced
      // over a few ms, so a call that had just started may be missing from the first count).
      let remaining = await ctx.admin.inflight();
      while (remaining > 0 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        remaining = await ctx.admin.inflight();
      }
      const engines = cut ?? (await pauseEngines());
      return { paused: true, mode, id: state.id, inflight_at_pause: inflightAtPause, drained: remaining === 0, still_inflight: remaining, engines };
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

    app.get("/admin/engines", async () => {
      const [loads, down, inflight] = await Promise.all([ctx.router.loads(), ctx.router.downRanks(), ctx.admin.inflightByRank()]);
      const health = new Map(ctx.health.snapshot().map((h) => [h.member, h]));
      return {
        engines: ctx.registry.engines.map((e, index) => ({
          index,
          kind: e.kind,
          url: e.url,
          dp_size: e.dp_size,
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
