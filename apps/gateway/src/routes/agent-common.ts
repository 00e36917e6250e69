import type { RecordHead, Session } from "@rollgate/protocol";
import { hashToken, tokenMatches } from "@rollgate/store";
import { issuesMessage } from "@rollgate/protocol";
import type { FastifyReply, FastifyRequest } from "fastify";
import { ZodError, type z } from "zod";
import { sessionToken } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { EngineError } from "../engines/errors.js";
import { BODY_TOO_LARGE_MESSAGE, isBodyTooLarge, isStorageUnavailable } from "../errors.js";
import { CallRejected } from "../llm/chat-call.js";
import { LeftWhileHeld, lostCallOf, type AgentFailure } from "../llm/lost-calls.js";
import { bindRequestScope } from "../observability/metrics.js";
import { requestScopeOf } from "../observability/request-hooks.js";
import { AGENT_SECURITY, SidParams } from "./schemas.js";

/**
 * What every agent-facing route shares, whatever its protocol: session authentication, the
 * abort signal tied to the client connection, SSE framing, and the status/kind of a failure
 * (each protocol renders it in its own error shape).
 */

/** Agents send long histories: allow far more than Fastify's 1 MiB default. */
export const AGENT_BODY_LIMIT = 64 * 1024 * 1024;

/**
 * The declared schema of an agent-facing route. The body is the client protocol's own request
 * schema (open objects: fields a real CLI sends that the gateway does not use pass through).
 * Routes take it with `attachValidation`: the session token is checked first, so a caller without
 * one learns nothing from the body's errors; then `rejectInvalid` hands a bad body to the route's
 * error handler, which answers in the protocol's shape.
 */
export function agentSchema(summary: string, description: string): AgentRouteSchema;
export function agentSchema<B extends z.ZodType>(summary: string, description: string, body: B): AgentRouteSchema & { body: B };
export function agentSchema(summary: string, description: string, body?: z.ZodType) {
  return { tags: ["agent"], security: AGENT_SECURITY, summary, description, params: SidParams, ...(body ? { body } : {}) };
}
interface AgentRouteSchema {
  tags: string[];
  security: typeof AGENT_SECURITY;
  summary: string;
  description: string;
  params: typeof SidParams;
}

/** Throws a body that failed its declared schema (after authentication: see agentSchema). */
export function rejectInvalid(req: FastifyRequest): void {
  if (req.validationError) throw req.validationError;
}

export interface AuthorizedSession {
  session: Session;
  /** The session's token hash: the key for signatures the gateway issues to this session. */
  tokenHash: string;
  /** The call's sequence number, when it was taken in the same step as the session read (see authorizeSession). */
  seq?: number;
  /** The session's record heads, read in the same round trip as the session (see authorizeSession `history`). */
  heads?: Promise<RecordHead[]>;
}

export type AuthFailure = { status: 401 | 403; kind: "invalid_token" | "session_closed"; message: string };

/** Requests whose session token was checked, and the token every other agent request presented. */
const authorized = new WeakSet<FastifyRequest>();
/** The call number a request took with its session read (it is pending until recorded or settled). */
const takenSeqs = new WeakMap<FastifyRequest, { seq: number; tokenHash: string }>();
const presented = new WeakMap<FastifyRequest, string>();

/**
 * What this process learned of a session when it checked a token for it: its token hash and
 * whether it is a branch's, neither of which changes while the session exists (bounded; the oldest
 * go first). A session deleted and made again under its id has another token: what was learned of
 * the old one is replaced once a token of the new one is checked, and until then the old hash only
 * ever fails to take a number (getForCall `tokenHash`).
 */
const known = new Map<string, { tokenHash: string; replay: boolean }>();
const KNOWN_MAX = 100_000;
function remember(sid: string, tokenHash: string, replay: boolean): void {
  const had = known.get(sid);
  if (had?.tokenHash === tokenHash) return;
  if (had) known.delete(sid);
  else if (known.size >= KNOWN_MAX) {
    const oldest = known.keys().next().value;
    if (oldest !== undefined) known.delete(oldest);
  }
  known.set(sid, { tokenHash, replay });
}

/** What a call route asks of its session read (see authorizeSession). */
export interface SessionReadOptions {
  takeSeq?: boolean;
  history?: boolean;
}

/** A session read under way: sent before the body's schema check (readSessionEarly) or by authorizeSession. */
interface SessionRead {
  token: string | undefined;
  /** The token hash this process already checked for the session, when the read also takes the call's number with it. */
  early: string | undefined;
  reading: ReturnType<GatewayContext["sessions"]["getForCall"]> | null;
  heads: Promise<RecordHead[]> | undefined;
}

const earlyReads = new WeakMap<FastifyRequest, SessionRead>();

function startSessionRead(ctx: GatewayContext, req: FastifyRequest, sid: string, extraToken: string | undefined, { takeSeq = false, history = false }: SessionReadOptions, bodyChecked: boolean): SessionRead {
  const token = sessionToken(req) ?? extraToken;
  if (token) presented.set(req, token);
  const k = token && takeSeq ? known.get(sid) : undefined;
  // Before the body's check (bodyChecked false) a number is taken too: a body that then fails its
  // schema gives it back (agentFailure) before its agent is answered, as one failing translation does.
  const early = k !== undefined && !k.replay && (!bodyChecked || !req.validationError) && !ctx.rateLimit?.enabled && tokenMatches(token!, k.tokenHash) ? k.tokenHash : undefined;
  // The session and (early) the call's number in one step: one Redis command per call, not two.
  // Taken only if that hash is still the session's: an old token of a session made again under its id takes nothing.
  const reading = token ? ctx.sessions.getForCall(sid, early !== undefined ? { takeSeq: true, tokenHash: early } : {}) : null;
  // Sent in the same tick as the session read: both leave in one write (auto-pipelined).
  const heads = reading && history && (!bodyChecked || !req.validationError) && ctx.caller.pending.local(sid) === null ? ctx.sessions.recordHeads(sid) : undefined;
  // Not wanted when the call is refused; a failed read is the call's failure only if it is used.
  heads?.catch(() => undefined);
  reading?.catch(() => undefined);
  return { token, early, reading, heads };
}

/**
 * A call route's `preValidation` hook: the session read (authorizeSession) is sent once the body
 * is parsed, before the body's schema check, so that check and the Redis round trip overlap
 * instead of adding up before the engine is called. The route's handler still calls
 * authorizeSession first, with the same options, and gets this read's outcome.
 */
export function readSessionEarly(ctx: GatewayContext, options: (req: FastifyRequest) => SessionReadOptions & { extraToken?: string }) {
  return (req: FastifyRequest, _reply: FastifyReply, done: () => void): void => {
    const sid = (req.params as { sid?: unknown } | undefined)?.sid;
    if (typeof sid === "string") {
      const { extraToken, ...opts } = options(req);
      earlyReads.set(req, startSessionRead(ctx, req, sid, extraToken, opts, false));
    }
    done();
  };
}

/**
 * Checks the session token (Bearer, x-api-key, x-goog-api-key, or `extraToken` such as Gemini's ?key=).
 *
 * `takeSeq` (a call that goes to the engine if its session is open): when this process already
 * checked this token for this session, the call's sequence number is taken by the command that
 * reads the session (if it is open), not by one after, unless the session rate limit is on (a
 * refused call must not use up a number) or the session is a branch's (its calls' numbers index
 * the replayed rollout). A number taken by a call then refused (a limit) is a gap like an aborted
 * call's, which the records and trajectories already allow; one taken by a call whose body then
 * fails its schema is given back.
 *
 * `history` (the body echoes assistant turns): the session's record heads are read together with
 * the session (one round trip before the engine instead of two), unless a record of this session is
 * still being written by this process (the call then reads them once it is stored, as before).
 *
 * A read the route's readSessionEarly hook started for this request is the one used.
 */
export async function authorizeSession(
  ctx: GatewayContext,
  req: FastifyRequest,
  sid: string,
  extraToken?: string,
  options: SessionReadOptions = {},
): Promise<AuthorizedSession | AuthFailure> {
  const started = earlyReads.get(req);
  earlyReads.delete(req);
  const { token, early, reading, heads } = started ?? startSessionRead(ctx, req, sid, extraToken, options, true);
  const found = await reading;
  // (A token already checked against the known hash: that hash still being the session's suffices.)
  if (!token || !found || !(early !== undefined ? found.tokenHash === early : tokenMatches(token, found.tokenHash))) {
    // One answer for an unknown session and a wrong token: a sandbox learns nothing of others.
    return { status: 401, kind: "invalid_token", message: "invalid session token" };
  }
  if (found.seq !== undefined) takenSeqs.set(req, { seq: found.seq, tokenHash: found.tokenHash });
  remember(sid, found.tokenHash, Boolean(found.session.replay));
  if (found.session.state !== "open") return { status: 403, kind: "session_closed", message: `session ${sid} is closed` };
  // Over ROLLGATE_SESSION_RATE: throws a 429 the route renders in its protocol (with retry-after).
  authorized.add(req);
  if (ctx.rateLimit?.enabled) await ctx.rateLimit.check(req, sid);
  return heads ? { ...found, heads } : found;
}

/** Whether an agent body's messages hold an assistant turn (OpenAI Chat and Anthropic Messages spell it alike). */
export function echoesAssistantTurn(body: unknown): boolean {
  const messages = (body as { messages?: unknown } | null)?.messages;
  return Array.isArray(messages) && messages.some((m) => (m as { role?: unknown } | null)?.role === "assistant");
}

export function isAuthFailure(x: AuthorizedSession | AuthFailure): x is AuthFailure {
  return "kind" in x;
}

/** Aborts when the client goes away before the response is complete (cancels the engine call). */
export function clientAbortSignal(reply: FastifyReply): AbortSignal {
  const abort = new AbortController();
  // The request's metrics scope goes with its signal, which every engine call of it carries.
  const scope = requestScopeOf(reply.request);
  if (scope) bindRequestScope(abort.signal, scope);
  // The answer's close, or its connection's: an answer queued behind an earlier one on its
  // connection (HTTP/1.1 pipelining) gets no close of its own when the connection goes.
  const socket = reply.request.raw.socket;
  const closed = () => {
    reply.raw.off("close", closed);
    socket.off("close", closed);
    if (!reply.raw.writableFinished) abort.abort();
  };
  reply.raw.once("close", closed);
  socket.once("close", closed);
  return abort.signal;
}

/** Takes over the response for Server-Sent Events. */
export function startSse(reply: FastifyReply): (frame: string) => void {
  reply.hijack();
  reply.raw.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  return corkedWriter(reply.raw);
}

/**
 * Writes to a streamed answer. The first frame of a tick leaves at once (the response headers with
 * the answer's first one): Node's own per-write cork would hold it until the tick ends, after the
 * engine stream was read down to its next pending chunk through every layer, and that first frame
 * is an agent's time to its next token. The frames written after it in the same tick (the rest of the events of one
 * engine read) are corked and leave together in one write when the tick ends.
 */
export function corkedWriter(raw: FastifyReply["raw"]): (frame: string) => void {
  let corked = false;
  const uncork = () => {
    corked = false;
    raw.uncork();
  };
  return (frame) => {
    if (corked) {
      raw.write(frame);
      return;
    }
    raw.write(frame);
    // The socket was corked by that write (node's http corks each write until the next tick).
    const socket = raw.socket;
    if (socket) while (socket.writableCorked > 0) socket.uncork();
    corked = true;
    raw.cork();
    process.nextTick(uncork);
  };
}

/** A failure's HTTP status and a short machine kind, for any protocol's error shape. */
export function failureOf(err: unknown): AgentFailure {
  if (err instanceof ZodError) return { status: 400, kind: "invalid_request", message: issuesMessage(err) };
  if (err instanceof CallRejected) return { status: err.status, kind: err.code, message: err.message };
  if (err instanceof EngineError) return { status: err.status, kind: `engine_${err.kind}`, message: err.forAgent };
  // Redis away: 503, so the agent's SDK retries (they retry 5xx) instead of seeing a bug.
  if (isBodyTooLarge(err)) return { status: 413, kind: "request_too_large", message: BODY_TOO_LARGE_MESSAGE };
  if (isStorageUnavailable(err)) return { status: 503, kind: "storage_unavailable", message: "the gateway's store (Redis) is unreachable; retry shortly" };
  const e = err as { statusCode?: number; code?: string; message?: string };
  const status = e.statusCode && e.statusCode >= 400 && e.statusCode < 600 ? e.statusCode : 500;
  return { status, kind: e.code ?? "internal_error", message: status >= 500 ? "internal error" : (e.message ?? "error") };
}

/**
 * The failure an agent is about to be answered, after marking its session when the call is lost
 * to infrastructure (lost-calls.ts). Not when the agent itself went away. A call whose token could
 * not be checked (Redis away before authentication) is marked only on the session that token is
 * for, once Redis can tell.
 */
export async function agentFailure(ctx: GatewayContext, req: FastifyRequest, reply: FastifyReply, err: unknown): Promise<AgentFailure> {
  const failure = failureOf(err);
  const sid = (req.params as { sid?: unknown } | undefined)?.sid;
  // A call that took its number with the session read and failed before the engine was called
  // has no record coming. A body its protocol cannot express never was a call: its number is given
  // back (a session limit counts numbers), before the agent is answered so its next call takes it.
  const taken = takenSeqs.get(req);
  if (typeof sid === "string" && taken !== undefined) {
    takenSeqs.delete(req);
    if (err instanceof ZodError) await ctx.caller.pending.giveBack(sid, taken.seq, taken.tokenHash);
    else ctx.caller.pending.settle(sid, taken.seq, taken.tokenHash);
  }
  // The agent hung up (its own timeout, or it gave up): nothing to mark, nobody to answer; unless
  // a pause of inference held its call until it did (LeftWhileHeld).
  const agentLeft = reply.raw.destroyed || req.raw.socket?.destroyed === true;
  if (typeof sid !== "string" || (agentLeft && !(err instanceof LeftWhileHeld))) return failure;
  const lost = err instanceof LeftWhileHeld ? err.lostCall(new Date()) : lostCallOf(err, failure, new Date());
  if (!lost) return failure;
  // Marked only while the session has the token the call presented: a session deleted while the
  // call ran, and perhaps made again under its id for another rollout, is not charged with it.
  const token = presented.get(req);
  if (token && (authorized.has(req) || isStorageUnavailable(err))) await ctx.lostCalls.note(sid, lost, hashToken(token));
  return failure;
}
