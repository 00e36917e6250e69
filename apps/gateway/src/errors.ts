import { describeIssues, issuesMessage, type ErrorBody } from "@rollgate/protocol";
import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";
import { ZodError } from "zod";

/** Our error body (docs/http-api.md#errors) for trainer and admin routes. */
export function errorBody(type: string, message: string, details?: unknown): ErrorBody {
  return { error: { type, message, ...(details !== undefined ? { details } : {}) } };
}

export function validationError(err: ZodError): ErrorBody {
  return errorBody("invalid_request", issuesMessage(err), describeIssues(err));
}

/** What a body over the limit is told (Fastify's own message names no limit). */
export const BODY_TOO_LARGE_MESSAGE =
  "the request body is over this route's size limit (agent routes 64 MiB, POST /v1/tasks/batch 256 MiB, every other route 1 MiB)";

/** Whether an error is Fastify's "body over the limit". */
export function isBodyTooLarge(err: unknown): boolean {
  return (err as { code?: unknown })?.code === "FST_ERR_CTP_BODY_TOO_LARGE";
}

/** Maps Fastify's own errors (bad JSON, body too large, wrong content type) to a status and a sentence. */
export function fastifyErrorStatus(err: FastifyError): { status: number; message: string } {
  if (isBodyTooLarge(err)) return { status: 413, message: BODY_TOO_LARGE_MESSAGE };
  const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
  return { status, message: status >= 500 ? "internal error" : err.message };
}

/**
 * Whether an error means Redis is unreachable right now (a retry later may succeed). Typed facts
 * first (ioredis's MaxRetriesPerRequestError by name, a socket's errno code); the text is read
 * only because ioredis raises a closed connection, an unwritable stream and too many cluster
 * redirections as plain Errors, and Redis states CLUSTERDOWN only as the code word of its reply.
 */
export function isStorageUnavailable(err: unknown): boolean {
  const e = err as { name?: string; message?: string; code?: string };
  return (
    e?.name === "MaxRetriesPerRequestError" ||
    e?.code === "ECONNREFUSED" ||
    /Connection is closed|Stream isn't writeable|ECONNREFUSED|CLUSTERDOWN|Too many Cluster redirections/.test(e?.message ?? "")
  );
}

/** Error handler for trainer/admin route plugins. */
export function trainerErrorHandler(err: FastifyError, req: FastifyRequest, reply: FastifyReply) {
  if (err instanceof ZodError) return reply.code(400).send(validationError(err));
  if (isStorageUnavailable(err)) {
    req.log.warn({ err: err.message }, "storage unavailable");
    return reply.code(503).header("retry-after", "1").send(errorBody("unavailable", "the task store (Redis) is unreachable; retry shortly"));
  }
  const { status, message } = fastifyErrorStatus(err);
  if (status >= 500) req.log.error({ err }, "request failed");
  const type = status === 413 ? "payload_too_large" : status >= 500 ? "internal_error" : "invalid_request";
  return reply.code(status).send(errorBody(type, message));
}
