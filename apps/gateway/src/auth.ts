import { timingSafeEqual } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { errorBody } from "./errors.js";

function bearer(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  return h?.startsWith("Bearer ") ? h.slice(7).trim() : undefined;
}

function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** onRequest hook for trainer and admin routes: `Authorization: Bearer <ROLLGATE_API_KEY>` when one is set. */
export function requireApiKey(apiKey: string | undefined) {
  return async (req: FastifyRequest, reply: FastifyReply) => {
    if (!apiKey) return;
    const given = bearer(req);
    if (!given || !sameSecret(given, apiKey)) {
      return reply.code(401).send(errorBody("unauthorized", "missing or wrong API key (Authorization: Bearer <key>)"));
    }
  };
}

/** The session token an agent presents, in any of the places its SDK puts it. */
export function sessionToken(req: FastifyRequest): string | undefined {
  const h = req.headers;
  const apiKey = h["x-api-key"] ?? h["x-goog-api-key"];
  return bearer(req) ?? (typeof apiKey === "string" ? apiKey : undefined);
}
