import type { Session } from "@rollgate/protocol";
import { tokenMatches } from "@rollgate/store";
import type { FastifyReply, FastifyRequest } from "fastify";
import { sessionToken } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { EngineError } from "../engines/errors.js";
import { BODY_TOO_LARGE_MESSAGE, isBodyTooLarge, isStorageUnavailable } from "../errors.js";
import { CallRejected } from "../llm/chat-call.js";

/**
 * What every agent-facing route shares, whatever its protocol: session authentication, the
 * abort signal tied to the client connection, SSE framing, and the status/kind of a failure
 * (each protocol renders it in its own error shape).
 */

/** Agents send long histories: allow far more than Fastify's 1 MiB default. */
export const AGENT_BODY_LIMIT = 64 * 1024 * 1024;

export interface AuthorizedSession {
  session: Session;
  /** The session's token hash: the key for signatures the gateway issues to this session. */
  tokenHash: string;
}

export type AuthFailure = { status: 401 | 403; kind: "invalid_token" | "session_closed"; message: string };

/** Checks the session token (Bearer, x-api-key, x-goog-api-key, or `extraToken` such as Gemini's ?key=). */
export async function authorizeSession(
  ctx: GatewayContext,
  req: FastifyRequest,
  sid: string,
  extraToken?: string,
): Promise<AuthorizedSession | AuthFailure> {
  const token = sessionToken(req) ?? extraToken;
  const found = token ? await ctx.sessions.getForCall(sid) : null;
  if (!token || !found || !tokenMatches(token, found.tokenHash)) {
    // One answer for an unknown session and a wrong token: a sandbox learns nothing of others.
    return { status: 401, kind: "invalid_token", message: "invalid session token" };
  }
  if (found.session.state !== "open") return { status: 403, kind: "session_closed", message: `session ${sid} is closed` };
  // Over ROLLGATE_SESSION_RATE: throws a 429 the route renders in its protocol (with retry-after).
  if (ctx.rateLimit?.enabled) await ctx.rateLimit.check(req, sid);
  return found;
}

export function isAuthFailure(x: AuthorizedSession | AuthFailure): x is AuthFailure {
  return "kind" in x;
}

/** Aborts when the client goes away before the response is complete (cancels the engine call). */
export function clientAbortSignal(reply: FastifyReply): AbortSignal {
  const abort = new AbortController();
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) abort.abort();
  });
  return abort.signal;
}

/** Takes over the response for Server-Sent Events. */
export function startSse(reply: FastifyReply): (frame: string) => void {
  reply.hijack();
  reply.raw.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  return (frame) => reply.raw.write(frame);
}

/** A failure's HTTP status and a short machine kind, for any protocol's error shape. */
export function failureOf(err: unknown): { status: number; kind: string; message: string } {
  if (err instanceof CallRejected) return { status: err.status, kind: err.code, message: err.message };
  if (err instanceof EngineError) return { status: err.status, kind: `engine_${err.kind}`, message: err.message };
  // Redis away: 503, so the agent's SDK retries (they retry 5xx) instead of seeing a bug.
  if (isBodyTooLarge(err)) return { status: 413, kind: "request_too_large", message: BODY_TOO_LARGE_MESSAGE };
  if (isStorageUnavailable(err)) return { status: 503, kind: "storage_unavailable", message: "the gateway's store (Redis) is unreachable; retry shortly" };
  const e = err as { statusCode?: number; code?: string; message?: string };
  const status = e.statusCode && e.statusCode >= 400 && e.statusCode < 600 ? e.statusCode : 500;
  return { status, kind: e.code ?? "internal_error", message: status >= 500 ? "internal error" : (e.message ?? "error") };
}
