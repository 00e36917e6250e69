import type { IncomingMessage } from "node:http";
import { anthropicError, anthropicErrorType, geminiError, openAIError } from "@rollgate/transforms";
import type { FastifyReply, FastifyRequest } from "fastify";
import sjson from "secure-json-parse";
import { errorBody } from "./errors.js";

/**
 * Guards for input no route sees in its own error handler (found by fuzz.test.ts and review):
 * bodies nested too deep to serialise again or carrying prototype-poisoning keys, query strings
 * that are not valid percent-encoding, bodies over the limit, URLs Fastify cannot decode, and
 * paths no route matches. Each answer is in the caller's protocol shape, judged from the path.
 */

/** JSON nested deeper than this is refused (JSON.stringify overflows the stack near 5,000 levels; no SDK nests past ~50). */
export const MAX_JSON_DEPTH = 512;

/**
 * Whether JSON text nests (arrays and objects) deeper than `max`; linear, strings skipped. A string
 * is jumped over with indexOf (its closing quote: the next one after an even run of backslashes)
 * rather than read char by char: an agent's body is mostly string (the history), and this runs on
 * every call before JSON.parse.
 */
export function jsonDepthExceeds(text: string, max = MAX_JSON_DEPTH): boolean {
  if (text.length <= max) return false;
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      const close = closingQuote(text, i);
      if (close < 0) return false; // unterminated: JSON.parse refuses it
      i = close;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

/** The index of the quote that closes the string opened at `open`, or -1. */
function closingQuote(text: string, open: number): number {
  for (let from = open + 1; ; ) {
    const q = text.indexOf('"', from);
    if (q < 0) return -1;
    let backslashes = 0;
    for (let b = q - 1; b > open && text.charCodeAt(b) === 0x5c; b--) backslashes++;
    if (backslashes % 2 === 0) return q;
    from = q + 1;
  }
}

/** A JSON body the gateway refuses: a 400 every route renders in its protocol's error shape. */
export class BadJsonBody extends Error {
  readonly statusCode = 400;
  readonly code = "invalid_json";
}

/**
 * Parses a JSON request body. Refuses nesting deeper than MAX_JSON_DEPTH (it parses, but
 * overflows the stack when the body is serialised again) and the prototype-poisoning keys
 * `__proto__` and `constructor.prototype` (secure-json-parse, as Fastify's own parser does:
 * a body that later meets Object.assign or a merge must not be able to swap a prototype).
 * An empty body is no body.
 */
export function parseJsonBody(text: string): unknown {
  if (text.trim() === "") return undefined;
  if (jsonDepthExceeds(text)) throw new BadJsonBody(`the body nests deeper than ${MAX_JSON_DEPTH} levels`);
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch (err) {
    throw new BadJsonBody(`the body is not valid JSON: ${(err as Error).message}`);
  }
  // Only a body that spells one of the keys (perhaps \u-escaped) can hold one: skip the walk otherwise.
  if (body !== null && typeof body === "object" && (text.includes("__proto__") || text.includes("constructor") || text.includes("\\u"))) {
    try {
      sjson.scan(body as Record<string, unknown>, { protoAction: "error", constructorAction: "error" });
    } catch {
      throw new BadJsonBody("the body holds a __proto__ or constructor.prototype key, which the gateway refuses");
    }
  }
  return body;
}

function decodeQueryPart(s: string): string | null {
  try {
    return decodeURIComponent(s.replace(/\+/g, " "));
  } catch {
    return null;
  }
}

/**
 * The first query parameter whose name or value is not valid percent-encoding (`%ZZ`, a lone
 * `%`, an encoded invalid UTF-8 sequence), with the reason; null when the query string is sound.
 */
export function malformedQueryParam(url: string): { param: string; message: string } | null {
  const q = url.indexOf("?");
  if (q < 0) return null;
  for (const part of url.slice(q + 1).split("&")) {
    if (part === "") continue;
    const eq = part.indexOf("=");
    const rawName = eq < 0 ? part : part.slice(0, eq);
    const name = decodeQueryPart(rawName);
    if (name === null) return { param: rawName, message: `query parameter name ${JSON.stringify(rawName)} is not valid percent-encoding` };
    if (eq >= 0 && decodeQueryPart(part.slice(eq + 1)) === null) {
      return { param: name, message: `query parameter ${JSON.stringify(name)}: the value is not valid percent-encoding (a % must start a %XX escape of UTF-8 bytes)` };
    }
  }
  return null;
}

/**
 * onRequest: a query string that cannot be decoded is a 400 naming the parameter, on every route.
 * Callback-style (not async): it runs on every request, and an async hook costs a promise and a
 * microtask turn each time. A refused request is answered here and goes no further (no `done`).
 */
export function queryGuard(req: FastifyRequest, reply: FastifyReply, done: () => void): void {
  const bad = malformedQueryParam(req.url);
  if (!bad) return done();
  void sendInFamily(reply, req.url, 400, bad.message, "invalid_query");
}

/** How long, and how many more bytes, a connection is read after a 413 before it is closed. */
const LINGER_MS = 30_000;
const LINGER_MAX_BYTES = 512 * 1024 * 1024;

/**
 * onSend for a 413: the answer goes out before the body has been read, and a connection closed
 * with unread bytes is reset, so a client that sends its whole body before reading (Python's
 * http.client, requests) would see "connection reset" instead of the 413. Keep the connection
 * (no `connection: close`): Node then reads and drops the rest of the body; past LINGER_MS or
 * LINGER_MAX_BYTES the socket is closed anyway.
 */
export function lingerAfter413(req: FastifyRequest, reply: FastifyReply): void {
  if (reply.statusCode !== 413) return;
  reply.removeHeader("connection");
  drainWithin(req.raw);
}

function drainWithin(raw: IncomingMessage) {
  if (raw.complete) return;
  const socket = raw.socket;
  const start = socket.bytesRead;
  const started = Date.now();
  const timer = setInterval(() => {
    if (raw.complete || socket.destroyed) return clearInterval(timer);
    if (Date.now() - started > LINGER_MS || socket.bytesRead - start > LINGER_MAX_BYTES) {
      clearInterval(timer);
      socket.destroy();
    }
  }, 200);
  timer.unref();
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
  // Fastify wants nothing back from this handler; the reply (a thenable) is sent, not awaited.
  void sendInFamily(reply, req.url ?? "/", status, err.message, "invalid_request");
}
