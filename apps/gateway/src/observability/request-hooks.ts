import type { FastifyPluginCallback, FastifyReply, FastifyRequest } from "fastify";
import type { Logger } from "pino";
import { boundToTask, type SessionTaskCache } from "./logging.js";
import type { GatewayMetrics, RequestScope } from "./metrics.js";

const kScope = Symbol("rollgate.requestScope");
type Scoped = FastifyRequest & { [kScope]?: RequestScope };

/** The scope of an agent request (set before its handler runs), for its engine calls to add to. */
export function requestScopeOf(req: FastifyRequest): RequestScope | undefined {
  return (req as Scoped)[kScope];
}

/** Agent-facing routes: `/s/:sid/…` (every client protocol). */
function isAgentRoute(route: string | undefined): boolean {
  return route !== undefined && route.startsWith("/s/:sid/");
}

/** Whether the request's logger already carries a task id (no parse of its bindings on the hot path). */
function hasTaskBinding(log: unknown): boolean {
  if (boundToTask(log)) return true;
  const bindings = (log as Partial<Logger>).bindings?.();
  return Boolean(bindings && "task_id" in bindings);
}

/**
 * Root hooks for every route (registered before the route plugins, not encapsulated):
 *
 * - agent routes get the task id of their session on their logger (`task_id`, from
 *   `session.metadata.task_id`, one cached lookup per session; the session id is already bound
 *   by the request logger factory), and get a request scope the ChatCaller `observe` hook
 *   adds engine time to;
 * - every answered request counts in `rollgate_http_requests_total`; an agent request that
 *   recorded calls adds its gateway overhead (request time minus engine time).
 */
export function requestObservability(opts: { metrics: GatewayMetrics; sessionTasks: SessionTaskCache }): FastifyPluginCallback {
  const plugin: FastifyPluginCallback = (app, _o, pluginDone) => {
    app.addHook("preHandler", (req: FastifyRequest, reply: FastifyReply, done) => {
      if (!isAgentRoute(req.routeOptions.url)) return done();
      const scope: RequestScope = { engineMs: 0, protocol: null };
      (req as Scoped)[kScope] = scope;
      const sid = (req.params as { sid?: unknown }).sid;
      // Nothing to add: the session is known to have no task, or the logger has its task id (the
      // cheap test first: reading a logger's bindings parses them).
      if (typeof sid !== "string" || opts.sessionTasks.peek(sid) === null || hasTaskBinding(req.log)) return done();
      opts.sessionTasks.taskOf(sid).then(
        (taskId) => {
          if (taskId) {
            req.log = req.log.child({ task_id: taskId });
            reply.log = req.log;
          }
          done();
        },
        () => done(),
      );
    });

    app.addHook("onResponse", (req: FastifyRequest, reply: FastifyReply, done) => {
      opts.metrics.observeRequest(req.method, req.routeOptions.url ?? "(unmatched)", reply.statusCode, reply.elapsedTime, (req as Scoped)[kScope]);
      done();
    });
    pluginDone();
  };
  // Not encapsulated: the hooks apply to the routes registered after it.
  Object.assign(plugin, { [Symbol.for("skip-override")]: true });
  return plugin;
}
