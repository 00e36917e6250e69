import type { FastifyPluginAsync } from "fastify";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { trainerErrorHandler } from "../errors.js";
import { adminRoutes } from "./admin.js";
import { sessionRoutes } from "./sessions.js";
import { statsRoutes } from "./stats.js";
import { taskRoutes } from "./tasks.js";

/**
 * Every trainer- and admin-facing JSON route: one API key check, and one error handler that
 * answers every failure (bad input included) as `{error: {type, message, details}}` (errors.ts).
 */
export function trainerRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.setErrorHandler(trainerErrorHandler);
    app.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));
    await app.register(taskRoutes(ctx));
    await app.register(sessionRoutes(ctx));
    await app.register(adminRoutes(ctx));
    await app.register(statsRoutes(ctx));
  };
}
