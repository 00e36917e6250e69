import { anthropicError, anthropicErrorType, geminiError, openAIError } from "@rollgate/transforms";
import type { FastifyReply, FastifyRequest } from "fastify";
import { errorBody } from "./errors.js";

/**
 * Guards for input no route sees in its own error handler (found by fuzz.test.ts): bodies nested
 * too deep to serialise again, URLs Fastify cannot decode, and paths no route matches. Each
 * answer is in the caller's protocol shape, judged from the path.
 */

/** JSON nested deeper than this is refused (JSON.stringify overflows the stack near 5,000 levels; no SDK nests past ~50). */
export const MAX_JSON_DEPTH = 512;

/** Whether JSON text nests (arrays and objects) deeper than `max`; linear, strings skipped. */
export function jsonDepthExceeds(text: string, max = MAX_JSON_DEPTH): boolean {
  if (text.length <= max) return false;
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped char
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

type Family = "openai" | "anthropic" | "gemini" | "trainer";

/** Which protocol a path speaks: the agent routes by their shape, everything else ours. */
export function familyOf(url: string): Family {
  const path = url.split("?")[0] ?? "";
  if (!path.startsWith("/s/")) return "trainer";
  if (/^\/s\/[^/]*\/v1\/messages/.test(path)) return "anthropic";
  if (/^\/s\/[^/]*\/v1beta\//.test(path) || /^\/s\/[^/]*\/v1\/models\/.+:/.test(path)) return "gemini";
  return "openai";
}

export function sendInFamily(reply: FastifyReply, url: string, status: number, message: string, kind: string) {
  switch (familyOf(url)) {
    case "openai":
      return reply.code(status).send(openAIError(message, status === 404 ? "not_found_error" : "invalid_request_error", kind));
    case "anthropic":
      return reply.code(status).send(anthropicError(anthropicErrorType(status), message));
    case "gemini":
      return reply.code(status).send(geminiError(status, message, kind));
    default:
      return reply.code(status).send(errorBody(status === 404 ? "not_found" : "invalid_request", message));
  }
}

/** No route matches: 404 in the caller's shape (Fastify's own body is in none of them). */
export function notFoundHandler(req: FastifyRequest, reply: FastifyReply) {
  return sendInFamily(reply, req.url, 404, `no route ${req.method} ${req.url.split("?")[0]}`, "not_found");
}

/** Fastify's framework errors (a URL it cannot decode, a bad content-type header…): 400 in the caller's shape. */
export function frameworkErrors(err: Error & { statusCode?: number }, req: FastifyRequest, reply: FastifyReply) {
  const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 400;
  return sendInFamily(reply, req.url ?? "/", status, err.message, "invalid_request");
}
