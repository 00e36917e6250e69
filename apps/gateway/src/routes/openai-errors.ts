import { openAIError } from "@rollgate/transforms";
import type { FastifyReply } from "fastify";
import { ZodError } from "zod";
import { failureOf, type AuthFailure } from "./agent-common.js";

/** OpenAI's error `type` for an HTTP status. */
export function openAIErrorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status >= 500) return "api_error";
  return "invalid_request_error";
}

/** Any failure in OpenAI's error shape, which the OpenAI SDKs surface as APIError subclasses. */
export function sendOpenAIError(reply: FastifyReply, err: unknown) {
  if (err instanceof ZodError) {
    const issue = err.issues[0];
    const param = issue ? issue.path.map(String).join(".") : null;
    const message = err.issues.map((i) => `${i.path.map(String).join(".") || "body"}: ${i.message}`).join("; ");
    return reply.code(400).send(openAIError(message, "invalid_request_error", "invalid_value", param));
  }
  const f = failureOf(err);
  return reply.code(f.status).send(openAIError(f.message, openAIErrorType(f.status), f.kind));
}

export function sendOpenAIAuthFailure(reply: FastifyReply, f: AuthFailure) {
  const code = f.kind === "invalid_token" ? "invalid_api_key" : f.kind;
  return reply.code(f.status).send(openAIError(f.message, openAIErrorType(f.status), code));
}
