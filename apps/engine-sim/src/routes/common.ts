import type { FastifyReply, FastifyRequest } from "fastify";
import type { z } from "zod";
import { vllmError } from "../errors.js";

/** Raw JSON bodies, kept so tool schemas can be re-read with Python number semantics. */
const rawBodies = new WeakMap<FastifyRequest, string>();

export function setRawBody(req: FastifyRequest, raw: string): void {
  rawBodies.set(req, raw);
}

export function getRawBody(req: FastifyRequest): string | undefined {
  return rawBodies.get(req);
}

export function sendError(reply: FastifyReply, status: number, message: string, param: string | null = null): FastifyReply {
  return reply.code(status).send(vllmError(message, status, param));
}

/** One line per issue, like pydantic's validation error listing. */
export function formatZodError(err: z.ZodError): string {
  const lines = err.issues.map((i) => `${i.path.length ? i.path.join(".") : "body"}: ${i.message}`);
  return `${err.issues.length} validation error${err.issues.length === 1 ? "" : "s"}:\n  ${lines.join("\n  ")}`;
}
