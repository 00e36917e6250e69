import { secretsEqual } from "@rollgate/protocol";
import type { FastifyReply, FastifyRequest } from "fastify";
import { errorBody } from "./errors.js";

function bearer(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  return h?.startsWith("Bearer ") ? h.slice(7).trim() : undefined;
}

/** onRequest hook for trainer and admin routes: `Authorization: Bearer <ROLLGATE_API_KEY>` when one is set. */
export function requireApiKey(apiKey: string | undefined) {
  return async (req: FastifyRequest, reply: FastifyReply) => {
    if (!apiKey) return;
    const given = bearer(req);
    if (!given || !secretsEqual(given, apiKey)) {
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
