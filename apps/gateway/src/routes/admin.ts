import { randomUUID } from "node:crypto";
import { parseRankMember } from "@rollgate/store";
import { Preflight } from "@rollgate/protocol";
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import { z } from "zod";
import type { GatewayContext } from "../context.js";
import { errorBody } from "../errors.js";
import { pausePlan, type AbortPauseMode } from "../engines/capabilities.js";
import { pauseEngine, resumeEngine, type EnginePauseMode } from "../ops/engine-control.js";
import { WeightLoad, describeLoadFailures, describeLoadedRanks, loadEngineWeights } from "../ops/weight-loading.js";
import { TRAINER_SECURITY, errorResponses, named } from "./schemas.js";

/** How each per-engine pause plan drives the engine's own pause route. */
const ENGINE_MODE: Record<AbortPauseMode, EnginePauseMode> = { keep: "freeze", in_place: "freeze", abort_continue: "abort", drain: "finish" };
/** How long a freeze-in-place pause waits for tokens already generated to reach the gateway. */
const FROZEN_SETTLE_MS = 250;
const FROZEN = new Set<string>(["keep", "in_place"]);
/** The weight-load mark outlives a replica that died mid-load by at most this long. */
const LOAD_MARK_TTL_S = 30;
const LOAD_MARK_REFRESH_MS = 10_000;

const PauseBody = named(
  "PauseRequest",
  z
    .object({
      mode: z
        .enum(["drain", "abort"])
        .default("drain")
        .describe(
          "drain: in-flight calls finish; abort: each engine pauses at once, the way its preflight says (keep: frozen in place and resumed on the new weights; abort_continue: cut and continued token-in by the gateway; drain when neither is possible)",
        ),
      timeout_s: z.number().nonnegative().max(3600).default(60).describe("how long to wait for in-flight calls of every replica"),
    })
    .strict(),
);
/** Each engine's answer to its own pause or resume route (ops/engine-control.ts). */
const EngineAnswer = z.object({ url: z.string(), kind: z.string(), ok: z.boolean(), status: z.number().int().nullable(), detail: z.string() });
const EngineAnswers = z.array(EngineAnswer);
const PauseAnswer = named(
  "PauseAnswer",
  z.object({
    paused: z.literal(true),
    mode: z.enum(["drain", "abort"]),
    id: z.string(),
    inflight_at_pause: z.number().int(),
    drained: z.boolean(),
    still_inflight: z.number().int(),
    frozen: z.number().int().describe("calls frozen in place on engines that keep them (they go on after resume)"),
    engines: z
      .array(
        EngineAnswer.extend({
          mode: z.string().describe("what the engine's pause route was asked to do with running requests: abort, finish or freeze"),
          plan: z.string(),
          why: z.string(),
        }),
      )
      .describe("per engine: the pause route's answer, the plan (keep, in_place, abort_continue, drain) and why"),
  }),
);
const ResumeAnswer = named("ResumeAnswer", z.object({ paused: z.literal(false), was_paused: z.boolean(), engines: EngineAnswers }));
const InferenceState = named("InferenceState", z.object({ paused: z.record(z.string(), z.unknown()).nullable(), inflight: z.number().int() }));
const EnginesQuery = z.object({
  refresh: z.enum(["true", "false"]).optional().describe("run every engine's preflight again"),
  wait_s: z.coerce.number().min(0).max(120).default(30).describe("how long to wait for a preflight still running (null after)"),
});
const Version = z.union([z.string().min(1).max(128), z.number().int().nonnegative()]);
const WeightsBody = named("WeightsRequest", z.object({ version: Version }).strict());
const WeightsAnswer = named("WeightsAnswer", z.object({ version: z.string().nullable() }));
const InferenceWeightsBody = named(
  "InferenceWeightsRequest",
  z
    .object({
      version: Version,
      load: WeightLoad.optional().describe(
        "`{path}`: a checkpoint folder every engine can read; `{lora: {name, path}}`: a LoRA adapter, loaded (or replaced) under `name`. Needs inference paused.",
      ),
    })
    .strict(),
);
const EngineLoad = named(
  "EngineLoad",
  z.object({
    index: z.number().int(),
    kind: z.string(),
    url: z.string(),
    ok: z.boolean(),
    ranks: z.array(z.object({ dp_rank: z.number().int(), loaded: z.boolean().describe("true only when the engine confirmed this rank loaded"), detail: z.string() })),
    steps: z.array(z.object({ route: z.string(), status: z.number().int().nullable(), detail: z.string() })).describe("the engine routes called, in order"),
    engine_weight_version: z.string().nullable(),
  }),
);
const InferenceWeightsAnswer = named(
  "InferenceWeightsAnswer",
  z.object({ version: z.string(), previous_version: z.string().nullable(), load: z.record(z.string(), z.unknown()).nullable(), engines: z.array(EngineLoad) }),
);
const EnginesAnswer = named(
  "EnginesAnswer",
  z.object({
    engines: z.array(
      z.object({
        index: z.number().int(),
        kind: z.string(),
        url: z.string(),
        dp_size: z.number().int(),
        profile: z.string().describe("the engine's model profile"),
        preflight: Preflight.nullable().describe("what will hold on the engine before a run; null while still running"),
        ranks: z.array(
          z.object({
            dp_rank: z.number().int(),
            healthy: z.boolean(),
            sessions: z.number().describe("open sessions assigned to the rank"),
            inflight: z.number().int().describe("engine calls in flight on the rank, all replicas"),
            recent_calls: z
              .object({ calls: z.number().int(), p50_ms: z.number(), p95_ms: z.number() })
              .nullable()
              .describe("latency of the rank's last calls (up to 100) through this replica; null before the first"),
            last_probe_latency_ms: z.number().nullable(),
            last_probe: z.string().nullable(),
            detail: z.string().nullable(),
          }),
        ),
      }),
    ),
    inflight_this_replica: z.number().int(),
  }),
);
const tags = ["admin"];
const security = TRAINER_SECURITY;

/** The RL loop's admin routes (docs/http-api.md#admin): pause/resume inference, the weight version, engine state. */
export function adminRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();

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
    const pauseSchema = {
      tags,
      security,
      summary: "Pause inference on every replica",
      description:
        "New engine calls wait (agents are not failed). drain: in-flight calls finish, then the engines' own pause routes are called. abort: the engines are paused at once, cutting in-flight calls, which the gateway continues from their tokens after resume (one answer per call; records keep each token's weight version). 409 resumed_during_pause: a resume came while it waited for calls in flight, and the engines were left running. The body may be left out.",
      body: PauseBody.prefault({}),
      response: { 200: PauseAnswer, ...errorResponses(400, 401, 409) },
    };
    app.post("/admin/inference/pause", { schema: pauseSchema }, async (req, reply) => {
      const { mode, timeout_s } = req.body;
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
      // After the drain, calls still running (it timed out) are let finish on vLLM (mode=wait). SGLang
      // has no such mode: in_place freezes them into the new weights, which only its in_place plan's
      // calls (stamped token by token as they arrive) record truly; any other SGLang engine's are cut
      // instead (continued token-in where the profile has a gateway parser, else failed as lost).
      const stampedInPlace = await Promise.all(
        ctx.registry.engines.map(async (e, i) => {
          if (e.kind !== "sglang" || !later.includes(i)) return true;
          const caps = await ctx.registry.capabilities(i).catch(() => null);
          return caps !== null && pausePlan(e.kind, caps, ctx.registry.profiles[i]!).mode === "in_place";
        }),
      );
      const engineMode = (i: number): EnginePauseMode => (plans[i]!.mode === "drain" && !stampedInPlace[i] ? "abort" : ENGINE_MODE[plans[i]!.mode]);
      const pauseOne = (i: number) => pauseEngine(ctx.registry.dispatcher, ctx.registry.engines[i]!, engineMode(i));
      const results: Awaited<ReturnType<typeof pauseOne>>[] = [];
      // A resume that came while this pause waited (its caller gave up on it and resumed) ends it:
      // the engines paused now would hold every call of a gateway that no longer holds any. Read
      // again after pausing them too, and resumed again, for a resume that came in between.
      const resumedMeanwhile = async () => (await ctx.admin.pauseState()) === null;
      const resumedAnswer = () =>
        reply
          .code(409)
          .send(errorBody("resumed_during_pause", "inference was resumed while this pause was under way (waiting for calls in flight): it ended there and the engines run (pause again if that resume was not meant)"));
      const pauseUnlessResumed = async (engines: number[]) => {
        if (await resumedMeanwhile()) return false;
        for (const [k, r] of (await Promise.all(engines.map(pauseOne))).entries()) results[engines[k]!] = r;
        if (!(await resumedMeanwhile())) return true;
        await Promise.all(engines.map((i) => resumeEngine(ctx.registry.dispatcher, ctx.registry.engines[i]!)));
        return false;
      };
      if (!(await pauseUnlessResumed(now))) return resumedAnswer();
      // Tokens a frozen engine generated before it froze may still be on their way to the replicas
      // stamping them: let them arrive before the caller can move the weight version, or the last
      // ones would be stamped with the new version (a real engine streams its output after its
      // pause route returns, too).
      if (now.some((i) => FROZEN.has(plans[i]!.mode))) await new Promise((r) => setTimeout(r, FROZEN_SETTLE_MS));
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
      if (!(await pauseUnlessResumed(later))) return resumedAnswer();
      const frozen = Object.entries(await ctx.admin.inflightByRank()).reduce((n, [member, count]) => (FROZEN.has(plans[parseRankMember(member).engine]?.mode ?? "") ? n + count : n), 0);
      return {
        paused: true as const,
        mode,
        id: state.id,
        inflight_at_pause: inflightAtPause,
        drained: remaining === 0,
        still_inflight: remaining,
        frozen,
        engines: results.map((r, i) => ({ ...r, plan: plans[i]!.mode, why: plans[i]!.why })),
      };
    });

    const resumeSchema = {
      tags,
      security,
      summary: "Resume inference",
      description:
        "409 `weights_mixed` after a weight load some ranks confirmed and others did not: those ranks run weights the policy version does not name, and their tokens would be stamped with it. A load that succeeds (or `POST /admin/weights` declaring the version every engine now runs) lifts it.",
      response: { 200: ResumeAnswer, ...errorResponses(401, 409) },
    };
    app.post("/admin/inference/resume", { schema: resumeSchema }, async (req, reply) => {
      // The trainer's `finally: resume()` after a half-done load would let the loaded ranks sample
      // on new weights under the old version: every record of theirs would lie about its version.
      const loading = await ctx.admin.weightLoad();
      if (loading !== null) {
        return reply
          .code(409)
          .send(
            errorBody(
              "weights_loading",
              `inference stays paused: the engines are loading weights ${loading.version} (since ${loading.since}); resumed now, they would sample on half-loaded weights stamped with the old version. Resume once POST /admin/inference/weights has answered.`,
            ),
          );
      }
      const mixed = await ctx.admin.mixedWeights();
      if (mixed !== null) {
        const version = await ctx.weights.get();
        return reply
          .code(409)
          .send(
            errorBody(
              "weights_mixed",
              `inference stays paused: a weight load failed part way and left ${mixed} off the weights of the version ${version ?? "unset"}; their tokens would be stamped with the wrong version (or their calls fail). Load the weights again (POST /admin/inference/weights with load, after fixing the cause, or the previous checkpoint), then resume.`,
            ),
          );
      }
      const engines = await Promise.all(ctx.registry.engines.map((e) => resumeEngine(ctx.registry.dispatcher, e)));
      const was = await ctx.admin.resume();
      return { paused: false as const, was_paused: was !== null, engines };
    });

    const stateSchema = { tags, security, summary: "Pause state and calls in flight", response: { 200: InferenceState, ...errorResponses(401) } };
    app.get("/admin/inference", { schema: stateSchema }, async () => ({ paused: ctx.pause.paused, inflight: await ctx.admin.inflight() }));

    /** The version stamped on every engine call from now on, on every replica. */
    const setVersion = async (version: string) => {
      await ctx.weights.set(version);
      // The caller says every engine runs `version` now (a load confirmed it, or it pushed them itself).
      await ctx.admin.setMixedWeights(null);
      // This replica hears its own message before the answer goes out (see PauseGate.heardWeights).
      const heard = ctx.pause.heardWeights(version);
      await ctx.admin.publish({ type: "weights", version });
      await heard;
    };

    const setWeightsSchema = {
      tags,
      security,
      summary: "Set the policy weight version",
      description: "Stamped on every completion (and token) from now on.",
      body: WeightsBody,
      response: { 200: WeightsAnswer, ...errorResponses(400, 401) },
    };
    app.post("/admin/weights", { schema: setWeightsSchema }, async (req) => {
      const version = String(req.body.version);
      await setVersion(version);
      await ctx.admin.setLoadedEngines(null);
      return { version };
    });

    /**
     * Sets the weight version and, with `load`, first makes every engine load the new weights
     * through its own route (only while paused, so no call runs on half-loaded weights). The
     * version moves only when every engine confirmed the load; otherwise 502 says which engine and
     * rank did not, the version stays, and inference stays paused for a retry.
     */
    const loadWeightsSchema = {
      tags,
      security,
      summary: "Set the weight version, loading new weights on every engine",
      description:
        "Without `load`: the same as `POST /admin/weights`. With `load` (only while paused, else 409): every engine loads the weights through its own route (vLLM `/collective_rpc` update_config + reload_weights or `/v1/load_lora_adapter`; SGLang `/update_weights_from_disk` or `/load_lora_adapter`), and the version moves only when every engine confirmed it. Otherwise 502 `weights_load_failed` whose `details.engines` says per engine and rank what loaded; the version stays and inference stays paused.",
      body: InferenceWeightsBody,
      response: { 200: InferenceWeightsAnswer, ...errorResponses(400, 401, 409, 502) },
    };
    app.post("/admin/inference/weights", { schema: loadWeightsSchema }, async (req, reply) => {
      const version = String(req.body.version);
      const { load } = req.body;
      const previous = await ctx.weights.get();
      if (!load) {
        await setVersion(version);
        await ctx.admin.setLoadedEngines(null);
        return { version, previous_version: previous, load: null, engines: [] };
      }
      // One load at a time on every replica: two interleave on the engines (the version set last
      // need not be the weights loaded last), and resume waits for it (see the resume route).
      const mark = { version, since: new Date().toISOString(), token: randomUUID() };
      if (!(await ctx.admin.beginWeightLoad(mark, LOAD_MARK_TTL_S))) {
        const running = await ctx.admin.weightLoad();
        return reply
          .code(409)
          .send(errorBody("weights_loading", `another weight load is under way (${running ? `version ${running.version}, since ${running.since}` : "just ended"}): call again once it has answered`));
      }
      const refresh = setInterval(() => void ctx.admin.refreshWeightLoad(mark.token, LOAD_MARK_TTL_S).catch(() => undefined), LOAD_MARK_REFRESH_MS);
      try {
        return await loadWhilePaused(version, load, previous, req, reply);
      } finally {
        clearInterval(refresh);
        await ctx.admin.endWeightLoad(mark.token).catch(() => undefined);
      }
    });

    /** The load itself, run under the load mark: paused is read after the mark is set, so a resume cannot slip between. */
    const loadWhilePaused = async (version: string, load: WeightLoad, previous: string | null, req: FastifyRequest, reply: FastifyReply) => {
      if (!(await ctx.admin.pauseState())) {
        return reply
          .code(409)
          .send(errorBody("not_paused", "loading weights needs inference paused: POST /admin/inference/pause first, then load, then POST /admin/inference/resume"));
      }
      const engines = await Promise.all(ctx.registry.engines.map((e, i) => loadEngineWeights(ctx.registry.dispatcher, i, e, load, version)));
      if (engines.some((e) => !e.ok)) {
        // Ranks that did load run weights the version does not name: resume waits for a load that succeeds.
        const loaded = describeLoadedRanks(engines, load);
        if (loaded !== null) await ctx.admin.setMixedWeights(loaded);
        const mixed = loaded === null ? "" : ` Not on the weights of ${previous ?? "unset"} any more: ${loaded}; resume is refused until a load succeeds.`;
        const message = `weights not loaded: ${describeLoadFailures(engines)}. The weight version stays ${previous ?? "unset"} and inference stays paused.${mixed}`;
        req.log.error({ version, engines }, "weight load failed");
        return reply.code(502).send(errorBody("weights_load_failed", message, { version, previous_version: previous, load, engines }));
      }
      // Set before the version moves, so a probe never compares the engines with a version their record predates.
      await ctx.admin.setLoadedEngines({ version, engines: engines.flatMap((e) => (e.engine_weight_version === version ? [e.index] : [])) });
      await setVersion(version);
      return { version, previous_version: previous, load, engines };
    };

    const getWeightsSchema = { tags, security, summary: "The policy weight version", response: { 200: WeightsAnswer, ...errorResponses(401) } };
    app.get("/admin/weights", { schema: getWeightsSchema }, async () => ({ version: await ctx.weights.get() }));

    /**
     * The engines: their ranks' health and load, and each engine's preflight (what will hold before
     * a run: profile, vocabulary, token-in, tool-turn round trip, reasoning drops, pause mode).
     * `?refresh=true` runs the preflight again; a preflight still running after `wait_s` is null.
     */
    const enginesSchema = {
      tags,
      security,
      summary: "Engines, their preflight and their ranks",
      description:
        "Per engine: its model profile and preflight (what will hold before a run: vocabulary, token-in and its route, whether tool-calling turns re-render to their ids, whether the template drops reasoning at new user turns, what an abort-mode pause does). Per (engine, dp_rank): health, open sessions, in-flight calls, recent call latency and the last probe.",
      querystring: EnginesQuery,
      response: { 200: EnginesAnswer, ...errorResponses(400, 401) },
    };
    app.get("/admin/engines", { schema: enginesSchema }, async (req) => {
      const [loads, down, inflight, preflight] = await Promise.all([
        ctx.router.loads(),
        ctx.router.downRanks(),
        ctx.admin.inflightByRank(),
        ctx.preflight.all({ full: true, refresh: req.query.refresh === "true", waitMs: req.query.wait_s * 1000 }),
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
