import { randomBytes, randomUUID } from "node:crypto";
import { CreateSessionRequest, TrajectoryBuilderName, type CreateSessionResponse } from "@rollgate/protocol";
import { hashToken, parseRankMember } from "@rollgate/store";
import { TRAINER_FORMATS, TrajectoryInvariantError, buildTrajectory, toTrainerFormat } from "@rollgate/trajectory";
import type { FastifyPluginAsync } from "fastify";
import { z } from "zod";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { errorBody, trainerErrorHandler, validationError } from "../errors.js";
import { trajectoryOptions } from "../trajectory-options.js";

const IdParams = z.object({ id: z.string().min(1).max(256) });
const TrajectoryQuery = z.object({
  builder: TrajectoryBuilderName.default("prefix_merging"),
  /** `rollgate` (default): the trajectory itself; a trainer's name: `{builder, format, samples}`, one sample per trace. */
  format: z.enum(TRAINER_FORMATS).default("rollgate"),
});

export function sessionUrls(publicUrl: string, id: string): Pick<CreateSessionResponse, "base_url" | "urls"> {
  const base = `${publicUrl}/s/${id}`;
  return { base_url: base, urls: { openai: `${base}/v1`, anthropic: base, gemini: base } };
}

/** The session API (docs/http-api.md#sessions): open, inspect, close, read records and trajectories. */
export function sessionRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.setErrorHandler(trainerErrorHandler);
    app.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));

    app.post("/v1/sessions", async (req, reply) => {
      const parsed = CreateSessionRequest.safeParse(req.body ?? {});
      if (!parsed.success) return reply.code(400).send(validationError(parsed.error));
      const body = parsed.data;
      const id = body.id ?? `s-${randomUUID()}`;
      if (await ctx.sessions.get(id)) return reply.code(409).send(errorBody("conflict", `session ${id} exists`));
      const healthy = ctx.registry.members().filter((m) => !ctx.health.isDown(m));
      const member = await ctx.router.assign(healthy, body.affinity_key, ctx.env.ROLLGATE_ROUTING);
      if (!member) return reply.code(503).send(errorBody("no_engine", "no engine rank is available"));
      const { engine, dpRank } = parseRankMember(member);
      const target = ctx.registry.target(engine, dpRank);
      const servedModel = await ctx.registry.servedModel(engine).catch(() => body.model ?? "unknown");
      const token = randomBytes(32).toString("base64url");
      const assignment = { engine, engine_url: target.engine.url, dp_rank: dpRank, served_model: servedModel };
      const created = await ctx.sessions.create(id, body, hashToken(token), assignment, member, new Date());
      if (!created) return reply.code(409).send(errorBody("conflict", `session ${id} exists`));
      const response: CreateSessionResponse = { id, token, ...sessionUrls(ctx.publicUrl(), id) };
      return reply.code(201).send(response);
    });

    // The session with the lost-call marks this replica still holds for it (Redis was away when
    // they were made), so a reader never sees a rollout as clean while a mark is on its way.
    const current = async (id: string) => {
      const found = await ctx.sessions.getForCall(id);
      return found ? ctx.lostCalls.withHeld(found.session, found.tokenHash) : null;
    };

    app.get("/v1/sessions/:id", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      const session = await current(id);
      if (!session) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      return session;
    });

    app.post("/v1/sessions/:id/close", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      if (!(await ctx.sessions.get(id))) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      // Held lost-call marks are written before the session closes: a closed session's marks are final.
      await ctx.lostCalls.flush(id);
      await ctx.sessions.close(id, new Date());
      return current(id);
    });

    app.delete("/v1/sessions/:id", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      const existed = await ctx.sessions.delete(id, new Date());
      if (!existed) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      return reply.code(204).send();
    });

    app.get("/v1/sessions/:id/completions", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      if (!(await ctx.sessions.get(id))) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      return { session_id: id, completions: await ctx.sessions.records(id) };
    });

    app.get("/v1/sessions/:id/trajectory", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      const query = TrajectoryQuery.safeParse(req.query);
      if (!query.success) return reply.code(400).send(validationError(query.error));
      const session = await ctx.sessions.get(id);
      if (!session) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      const [records, failures] = await Promise.all([ctx.sessions.records(id), ctx.sessions.failures(id)]);
      try {
        const trajectory = buildTrajectory(records, query.data.builder, trajectoryOptions(ctx.registry, session, records));
        trajectory.stats.failed_calls = failures;
        const { format, builder } = query.data;
        return format === "rollgate" ? trajectory : { builder, format, samples: toTrainerFormat(trajectory, format) };
      } catch (err) {
        if (err instanceof TrajectoryInvariantError) {
          return reply.code(422).send(errorBody("trajectory_invalid", err.message, { record_id: err.record_id }));
        }
        throw err;
      }
    });
  };
}
