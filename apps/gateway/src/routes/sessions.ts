import { randomBytes, randomUUID } from "node:crypto";
import {
  ClosedSession,
  CompletionRecord,
  CreateSessionRequest,
  CreateSessionResponse,
  DecodedTrajectory,
  type ErrorBody,
  LostCalls,
  Session,
  Trajectory,
  TrajectoryBuilderName,
} from "@rollgate/protocol";
import { hashToken, parseRankMember, type FailedCallNote } from "@rollgate/store";
import { TRAINER_FORMATS, TrajectoryInvariantError, buildTrajectory, toTrainerFormat } from "@rollgate/trajectory";
import type { FastifyPluginAsync } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import { z } from "zod";
import type { GatewayContext } from "../context.js";
import { EngineError } from "../engines/errors.js";
import { errorBody } from "../errors.js";
import { replayGap } from "../llm/replay.js";
import { trajectoryOptions } from "../trajectory-options.js";
import { decodeTrajectory, type TokenDecoder } from "./dashboard-decode.js";
import { IdParams, TRAINER_SECURITY, errorResponses, named } from "./schemas.js";

const TrajectoryQuery = z.object({
  builder: TrajectoryBuilderName.default("prefix_merging"),
  /** `rollgate` (default): the trajectory itself; a trainer's name: `{builder, format, samples}`, one sample per trace. */
  format: z.enum(TRAINER_FORMATS).default("rollgate").describe("`rollgate`: the trajectory itself; a trainer's name: `{builder, format, samples}`, one sample per trace"),
});
const DecodedQuery = z.object({ builder: TrajectoryBuilderName.default("prefix_merging") });
const CloseQuery = z.object({
  trajectory: TrajectoryBuilderName.optional().describe("also answer the trajectory built by this builder (`trajectory`), or why it could not be built (`trajectory_error`)"),
});
const CompletionList = named("CompletionList", z.object({ session_id: z.string(), completions: z.array(CompletionRecord) }));
const TrainerSamples = z
  .object({ builder: TrajectoryBuilderName, format: z.string(), samples: z.array(z.unknown()), lost_calls: LostCalls })
  .describe("one sample per trace, in a trainer's format; `lost_calls`: the session's, as on the session (a rollout with any is not whole)");
const tags = ["sessions"];
const security = TRAINER_SECURITY;

/** The engine whose tokenizer decodes a session's tokens: the one its records came from, else its assignment. */
function engineOf(ctx: GatewayContext, session: Session, records: readonly CompletionRecord[]): number {
  const fromRecords = records.length > 0 ? ctx.registry.indexOf(records[0]!.engine) : -1;
  return fromRecords >= 0 ? fromRecords : records.length === 0 ? (session.assignment?.engine ?? -1) : -1;
}

/**
 * The open of a session id that was closed before it was opened: its attempt was taken over (or
 * its task cancelled) while its worker, stalled, had not opened it yet.
 */
function closedUnopened(id: string) {
  return errorBody("conflict", `session ${id} was closed before it was opened (its attempt was taken over or its task ended): it cannot be opened`);
}

export function sessionUrls(publicUrl: string, id: string): Pick<CreateSessionResponse, "base_url" | "urls"> {
  const base = `${publicUrl}/s/${id}`;
  return { base_url: base, urls: { openai: `${base}/v1`, anthropic: base, gemini: base } };
}

/** The session API (docs/http-api.md#sessions): open, inspect, close, read records and trajectories. */
export function sessionRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();

    const openSchema = {
      tags,
      security,
      summary: "Open a session",
      description: "Assigns an engine rank; the answer holds the session token (shown once) and the base URLs for each client protocol. The body may be left out.",
      // No body at all is an empty request (every field has a default).
      body: CreateSessionRequest.prefault({}),
      response: { 201: CreateSessionResponse, ...errorResponses(400, 401, 404, 409, 503) },
    };
    app.post("/v1/sessions", { schema: openSchema }, async (req, reply) => {
      const body = req.body;
      const id = body.id ?? `s-${randomUUID()}`;
      // An id this gateway made up is new (create's HSETNX still guards it): only a caller's own is looked up.
      if (body.id && (await ctx.sessions.get(id))) return reply.code(409).send(errorBody("conflict", `session ${id} exists`));
      if (body.id && (await ctx.sessions.closedUnopened(id))) return reply.code(409).send(closedUnopened(id));
      if (body.replay) {
        const { session_id: sourceId, calls } = body.replay;
        const source = await ctx.sessions.get(sourceId);
        if (!source) return reply.code(404).send(errorBody("not_found", `no session ${sourceId} to replay`));
        // Each replayed call needs a record to answer from. A source still open: the records of its
        // calls that have answered, on any replica (one that just answered may still be storing it).
        if (source.state === "closed") await ctx.caller.pending.settled(sourceId);
        else {
          // A call still running is no failed one (its answer is on its way): not a gap to replay over.
          const running = await ctx.caller.pending.earlierSettled(sourceId, calls);
          if (running.length > 0) {
            return reply.code(409).send(errorBody("conflict", `session ${sourceId} cannot be replayed to call ${calls} yet: its call ${running[0]} has not answered yet`));
          }
        }
        const gap = replayGap(await ctx.sessions.recordHeads(sourceId), calls, await ctx.sessions.numberedCalls(sourceId));
        if (gap) return reply.code(409).send(errorBody("conflict", `session ${sourceId} cannot be replayed to call ${calls}: ${gap}`));
      }
      const healthy = ctx.registry.members().filter((m) => !ctx.health.isDown(m));
      // A source's branches share its rank, whatever the routing policy: its prefix cache holds the
      // replayed prefix. As a GRPO group's does, the rank stops taking them once it is up to
      // ROLLGATE_AFFINITY_MAX_SKEW sessions busier than the least-loaded one (n branches at once
      // would otherwise all land on it), and the next ones go together to another rank.
      let affinityKey = body.affinity_key;
      let policy = ctx.env.ROLLGATE_ROUTING;
      if (body.replay) {
        const sourceRank = await ctx.sessions.rankMember(body.replay.session_id);
        affinityKey = `replay:${body.replay.session_id}`;
        policy = "affinity";
        if (sourceRank) await ctx.router.prefer(affinityKey, sourceRank);
      }
      const member = await ctx.router.assign(healthy, affinityKey, policy);
      if (!member) return reply.code(503).send(errorBody("no_engine", "no engine rank is available"));
      const { engine, dpRank } = parseRankMember(member);
      const target = ctx.registry.target(engine, dpRank);
      const servedModel = await ctx.registry.servedModel(engine).catch(() => body.model ?? "unknown");
      const token = randomBytes(32).toString("base64url");
      const assignment = { engine, engine_url: target.engine.url, dp_rank: dpRank, served_model: servedModel };
      const created = await ctx.sessions.create(id, body, hashToken(token), assignment, member, new Date());
      if (created === "taken") return reply.code(409).send(errorBody("conflict", `session ${id} exists`));
      if (created === "closed") return reply.code(409).send(closedUnopened(id));
      const response: CreateSessionResponse = { id, token, ...sessionUrls(ctx.publicUrl(), id) };
      return reply.code(201).send(response);
    });

    /**
     * A session's records, once the ones still being written are stored: this replica's always; a
     * closed session's on any replica too (its close waited for them already, so this is one look).
     * An open session's calls may still be running: what it answers is the records so far.
     */
    const recordsOf = async (id: string, session: Session): Promise<CompletionRecord[]> => {
      if (session.state === "closed") await ctx.caller.pending.settled(id);
      else await ctx.caller.pending.local(id);
      return ctx.sessions.records(id);
    };

    // The trajectory built now from the session's records, or the invariant it breaks. `settled`:
    // the caller already waited for the session's pending calls (its close did).
    const sessionTrajectory = async (
      id: string,
      session: Session,
      builder: TrajectoryBuilderName,
      { settled = false, final }: { settled?: boolean; final?: { records: CompletionRecord[]; failures: FailedCallNote[] } | undefined } = {},
    ): Promise<{ trajectory: Trajectory } | { error: ErrorBody["error"] }> => {
      // `final`: the records and failed-call notes read in the close's own step (none was pending).
      const [records, failures] = final
        ? [final.records, final.failures]
        : await Promise.all([settled ? ctx.sessions.records(id) : recordsOf(id, session), ctx.sessions.failures(id)]);
      try {
        const trajectory = buildTrajectory(records, builder, trajectoryOptions(ctx.registry, session, records));
        trajectory.stats.failed_calls = failures;
        trajectory.stats.lost_calls = session.lost_calls;
        return { trajectory };
      } catch (err) {
        if (err instanceof TrajectoryInvariantError) return errorBody("trajectory_invalid", err.message, { record_id: err.record_id });
        throw err;
      }
    };

    // The session with the lost-call marks this replica still holds for it (Redis was away when
    // they were made), so a reader never sees a rollout as clean while a mark is on its way.
    const current = async (id: string) => {
      // Its counts once this replica's records still being written are stored.
      await ctx.caller.pending.local(id);
      const found = await ctx.sessions.getForCall(id);
      return found ? ctx.lostCalls.withHeld(found.session, found.tokenHash) : null;
    };

    const getSchema = {
      tags,
      security,
      summary: "A session",
      description: "State, assigned (engine, dp_rank), counts.",
      params: IdParams,
      response: { 200: Session, ...errorResponses(400, 401, 404) },
    };
    app.get("/v1/sessions/:id", { schema: getSchema }, async (req, reply) => {
      const { id } = req.params;
      const session = await current(id);
      if (!session) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      return session;
    });

    const closeSchema = {
      tags,
      security,
      summary: "Close a session",
      description:
        "No further LLM calls are accepted. With `?trajectory=<builder>` the answer also holds the session's trajectory (what `GET /v1/sessions/:id/trajectory?builder=` answers), or `trajectory_error` when an invariant breaks: a rollout's last two requests in one.",
      params: IdParams,
      querystring: CloseQuery,
      response: { 200: ClosedSession, ...errorResponses(400, 401, 404) },
    };
    app.post("/v1/sessions/:id/close", { schema: closeSchema }, async (req, reply) => {
      const { id } = req.params;
      // Held lost-call marks are written before the session closes: a closed session's marks are final.
      await ctx.lostCalls.flush(id);
      // Closes it (if open) and reads it back in one step; with a trajectory asked for, its records
      // too when none of its calls is pending.
      const found = await ctx.sessions.closeAndGet(id, new Date(), { records: req.query.trajectory !== undefined });
      if (!found) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      // The rank's slot is given back while the rest is read (their commands share a round trip);
      // the answer waits for it, and its failure is the close's.
      const { released } = found;
      let closed = found;
      try {
        // Agents are answered before their calls' records are stored: those still on their way (on
        // any replica) are waited for, and any that never come are lost calls; then it is read again.
        let final = found.final;
        if (await ctx.caller.pending.atClose(id, closed.pendingCalls)) {
          closed = { ...((await ctx.sessions.getForCall(id)) ?? closed), pendingCalls: 0, released };
          final = undefined;
        }
        const session = ctx.lostCalls.withHeld(closed.session, closed.tokenHash);
        const builder = req.query.trajectory;
        if (!builder) return session;
        // No call is pending any more: the close took none after it, and atClose waited for those before it.
        const built = await sessionTrajectory(id, session, builder, { settled: true, final });
        return "error" in built ? { ...session, trajectory_error: built.error } : { ...session, trajectory: built.trajectory };
      } finally {
        await released;
      }
    });

    const dropSchema = {
      tags,
      security,
      summary: "Drop a session and its records",
      params: IdParams,
      response: { 204: z.undefined().describe("dropped"), ...errorResponses(400, 401, 404) },
    };
    app.delete("/v1/sessions/:id", { schema: dropSchema }, async (req, reply) => {
      const { id } = req.params;
      const existed = await ctx.sessions.delete(id, new Date());
      if (!existed) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      return reply.code(204).send();
    });

    const completionsSchema = {
      tags,
      security,
      summary: "The raw completion records",
      params: IdParams,
      response: { 200: CompletionList, ...errorResponses(400, 401, 404) },
    };
    app.get("/v1/sessions/:id/completions", { schema: completionsSchema }, async (req, reply) => {
      const { id } = req.params;
      const session = await ctx.sessions.get(id);
      if (!session) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      return { session_id: id, completions: await recordsOf(id, session) };
    });

    const trajectorySchema = {
      tags,
      security,
      summary: "The session's trajectory",
      description:
        "Traces and stats (`format=rollgate`; with `builder=prefix_tree` also `tree`, the conversations as one tree of shared prefixes), or `{builder, format, samples}` in a trainer's format, one sample per trace.",
      params: IdParams,
      querystring: TrajectoryQuery,
      response: { 200: z.union([Trajectory, TrainerSamples]), ...errorResponses(400, 401, 404, 422) },
    };
    app.get("/v1/sessions/:id/trajectory", { schema: trajectorySchema }, async (req, reply) => {
      const { id } = req.params;
      const session = await ctx.sessions.get(id);
      if (!session) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      const { format, builder } = req.query;
      const built = await sessionTrajectory(id, session, builder);
      if ("error" in built) return reply.code(422).send({ error: built.error });
      if (format === "rollgate") return built.trajectory;
      return { builder, format, samples: toTrainerFormat(built.trajectory, format), lost_calls: session.lost_calls };
    });

    const decodedSchema = {
      tags,
      security,
      summary: "The session's trajectory as text",
      description:
        "Each trace decoded by the engine that produced its tokens (its own `/detokenize`, cached): the prompt, and the response as runs of trainable (loss_mask 1) and masked tokens. What the dashboard and `rollgate trajectory --decode` show.",
      params: IdParams,
      querystring: DecodedQuery,
      response: { 200: DecodedTrajectory, ...errorResponses(400, 401, 404, 409, 422, 502) },
    };
    app.get("/v1/sessions/:id/trajectory/decoded", { schema: decodedSchema }, async (req, reply) => {
      const { id } = req.params;
      const session = await ctx.sessions.get(id);
      if (!session) return reply.code(404).send(errorBody("not_found", `no session ${id}`));
      const records = await recordsOf(id, session);
      let trajectory;
      try {
        trajectory = buildTrajectory(records, req.query.builder, trajectoryOptions(ctx.registry, session, records));
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
  };
}
