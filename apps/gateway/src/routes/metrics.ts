import { callbackQueue } from "@rollgate/queue";
import type { FastifyPluginAsync } from "fastify";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import type { GatewayMetrics } from "../observability/metrics.js";
import { TRAINER_SECURITY, errorResponses, textResponse } from "./schemas.js";

const schema = {
  tags: ["operations"],
  summary: "Prometheus metrics",
  description: "Text exposition format. Requires the API key when ROLLGATE_API_KEY is set.",
  security: TRAINER_SECURITY,
  response: { 200: textResponse("text/plain", "metrics"), ...errorResponses(401) },
};

/**
 * `GET /metrics`: Prometheus text format. State metrics (queues, tasks, sessions, ranks, pause,
 * weights) are read when scraped; see observability/metrics.ts for every name. Takes the API key
 * when ROLLGATE_API_KEY is set (Prometheus: `authorization: {credentials: <key>}`).
 */
export function metricsRoutes(ctx: GatewayContext, metrics: GatewayMetrics): FastifyPluginAsync {
  return async (app) => {
    // Read-only handle on the callbacks queue (the worker owns its jobs): counts and ages only.
    const callbacks = callbackQueue({ connection: ctx.queueRedis, keyPrefix: ctx.env.ROLLGATE_KEY_PREFIX, attempts: 1, backoffMs: 1000 });
    callbacks.on("error", (err) => ctx.log.warn({ err: err.message }, "callbacks queue error (metrics)"));
    app.addHook("onClose", async () => {
      await callbacks.close().catch(() => undefined);
    });
    app.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));

    app.get("/metrics", { schema }, async (_req, reply) => {
      await metrics.refresh({
        tasks: ctx.tasks,
        router: ctx.router,
        members: () => ctx.registry.members(),
        paused: () => ctx.pause.paused !== null,
        inflight: () => ctx.pause.inflightCount,
        bodyBudget: () => ctx.bodyBudget,
        weightVersion: () => ctx.weights.get(),
        queues: [ctx.rollouts, callbacks],
      });
      return reply.type(metrics.registry.contentType).send(await metrics.registry.metrics());
    });
  };
}
