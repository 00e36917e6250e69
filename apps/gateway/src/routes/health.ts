import type { Readiness } from "@rollgate/protocol";
import type { FastifyPluginAsync } from "fastify";
import type { GatewayContext } from "../context.js";

/**
 * `/healthz`: the process is alive. `/readyz`: it can serve, i.e. Redis answers and every
 * configured engine has a rank that answers and a known served model (EngineHealth.readiness);
 * 503 with the reason per engine until then. Workers hold their tasks while it is 503.
 */
export function healthRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.get("/healthz", async () => ({ status: "ok" }));
    app.get("/readyz", async (_req, reply) => {
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
