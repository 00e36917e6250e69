import type { FastifyPluginAsync } from "fastify";
import type { GatewayContext } from "../context.js";

export function healthRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.get("/healthz", async () => ({ status: "ok" }));
    app.get("/readyz", async (_req, reply) => {
      try {
        await ctx.redis.ping();
        return { status: "ready" };
      } catch (err) {
        return reply.code(503).send({ status: "unavailable", reason: `redis: ${(err as Error).message}` });
      }
    });
  };
}
