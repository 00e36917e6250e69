import { Readiness } from "@rollgate/protocol";
import type { FastifyPluginAsync } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import { z } from "zod";
import type { GatewayContext } from "../context.js";

const tags = ["operations"];
const liveness = { tags, summary: "Liveness", response: { 200: z.object({ status: z.literal("ok") }) } };
const readiness = {
  tags,
  summary: "Readiness: Redis answers and every engine has a rank that answers and a known model",
  description: "503 until then, with the reason per engine. Workers take no tasks while it is 503 (the queue holds them).",
  response: { 200: Readiness.describe("ready"), 503: Readiness.describe("not ready, and why") },
};

/**
 * `/healthz`: the process is alive. `/readyz`: it can serve, i.e. Redis answers and every
 * configured engine has a rank that answers and a known served model (EngineHealth.readiness);
 * 503 with the reason per engine until then. Workers hold their tasks while it is 503.
 */
export function healthRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();
    app.get("/healthz", { schema: liveness }, async () => ({ status: "ok" as const }));
    app.get("/readyz", { schema: readiness }, async (_req, reply) => {
      let redis = "ok";
      try {
        await ctx.redis.ping();
      } catch (err) {
        redis = (err as Error).message;
      }
      const engines = ctx.health.readiness();
      const reasons = [
        ...(redis === "ok" ? [] : [`redis: ${redis}`]),
        ...engines.filter((e) => !e.ready).map((e) => `engine ${e.engine} (${e.kind} ${e.url}): ${e.reason}`),
      ];
      const ready = reasons.length === 0;
      const body: Readiness = { status: ready ? "ready" : "unavailable", reason: ready ? null : reasons.join("; "), redis, engines };
      return reply.code(ready ? 200 : 503).send(body);
    });
  };
}
