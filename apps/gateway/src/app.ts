import { createRedis, rolloutQueue } from "@rollgate/queue";
import { AdminStore, RankRouter, SessionStore, TaskStore, WeightStore, rankMember } from "@rollgate/store";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type RouteOptions } from "fastify";
import { serializerCompiler } from "fastify-type-provider-zod";
import { getHeapStatistics } from "node:v8";
import { pino, type Logger } from "pino";
import type { GatewayContext } from "./context.js";
import { engineVersion } from "./engines/capabilities.js";
import { EngineRegistry } from "./engines/registry.js";
import { frameworkErrors, lingerAfter413, notFoundHandler, parseJsonBody, queryGuard } from "./input-guards.js";
import { ChatCaller } from "./llm/chat-call.js";
import { LostCallLedger } from "./llm/lost-calls.js";
import { PendingCalls } from "./llm/pending-calls.js";
import { RedactingLogController, SessionTaskCache, redactingLogger, requestChildLogger, rootLoggerOptions } from "./observability/logging.js";
import { GatewayMetrics } from "./observability/metrics.js";
import { requestObservability } from "./observability/request-hooks.js";
import { AdminChannel } from "./ops/admin-channel.js";
import { BodyBudget } from "./ops/body-budget.js";
import { EngineHealth } from "./ops/engine-health.js";
import { LoadedWeights } from "./ops/loaded-weights.js";
import { PauseGate } from "./ops/pause-gate.js";
import { PreflightReports } from "./ops/preflight.js";
import { RankHealthBus } from "./ops/rank-health.js";
import { SessionRateLimiter, retryAfterHeader } from "./ops/rate-limit.js";
import { SubmitSweep } from "./ops/submit-sweep.js";
import { Rerouter } from "./ops/reroute.js";
import { unusedConnectionsCloser } from "./ops/unused-connections.js";
import { engineWeightVersion } from "./ops/weight-loading.js";
import { AGENT_BODY_LIMIT } from "./routes/agent-common.js";
import { anthropicAgentRoutes } from "./routes/agent-anthropic.js";
import { dashboardRoutes } from "./routes/dashboard.js";
import { registerDocs } from "./routes/docs.js";
import { geminiAgentRoutes } from "./routes/agent-gemini.js";
import { openAIAgentRoutes } from "./routes/agent-openai.js";
import { responsesAgentRoutes } from "./routes/agent-responses.js";
import { healthRoutes } from "./routes/health.js";
import { metricsRoutes } from "./routes/metrics.js";
import { queueBoardRoutes } from "./routes/queues.js";
import { zodValidatorCompiler } from "./routes/schemas.js";
import { trainerRoutes } from "./routes/trainer.js";
import type { GatewayEnv } from "./env.js";

export interface BuildGatewayOptions {
  env: GatewayEnv;
  logger?: Logger;
  /** Sees every route as it is added (tests hold the OpenAPI document against them). */
  onRoute?: (route: RouteOptions) => void;
}

/**
 * The gateway app factory: builds every client and route but does not listen (tests use
 * `inject()` or `listen({port: 0})`). Closing the app closes Redis, the queue and the engine pool.
 */
export async function buildGateway({ env, logger, onRoute }: BuildGatewayOptions): Promise<FastifyInstance> {
  // Secrets are redacted (headers, ?key= in URLs) whatever logger is passed in: observability/logging.ts.
  const log = redactingLogger(logger ?? pino(rootLoggerOptions(env.LOG_LEVEL)));
  // The stores' connection auto-pipelines: the commands every concurrent call issues in one tick
  // leave in one write (and their answers come back in one read) instead of a syscall each; the
  // profile under load had the socket writes as the gateway's largest cost.
  const redis = createRedis(env.REDIS_URL, "producer", { enableAutoPipelining: true });
  redis.on("error", (err) => log.warn({ err: err.message }, "redis connection error"));
  const prefix = env.ROLLGATE_KEY_PREFIX;
  const registry = new EngineRegistry(env.ROLLGATE_ENGINES, env.ROLLGATE_ENGINE_TIMEOUT_S * 1000);
  const sessions = new SessionStore(redis, prefix);
  const weights = new WeightStore(redis, prefix);
  // BullMQ gets a connection of its own: it loads dozens of Lua scripts onto the client it uses,
  // and ioredis copies those into every MULTI on that client (the stores' hot path).
  const queueRedis = createRedis(env.REDIS_URL, "producer");
  queueRedis.on("error", (err: Error) => log.warn({ err: err.message }, "redis (queue) connection error"));
  const rollouts = rolloutQueue({ connection: queueRedis, keyPrefix: prefix, attempts: env.ROLLGATE_ROLLOUT_ATTEMPTS, backoffMs: env.ROLLGATE_ROLLOUT_BACKOFF_MS });
  rollouts.on("error", (err) => log.warn({ err: err.message }, "rollout queue error"));

  // Per-request access logs only at debug: agent traffic would drown everything else at info.
  const quietRequests = env.LOG_LEVEL !== "debug" && env.LOG_LEVEL !== "trace";
  // Request log lines carry reqId plus the session/task ids the URL (and the session) names.
  const sessionTasks = new SessionTaskCache((sid) => sessions.get(sid));
  const metrics = new GatewayMetrics({ processMetrics: true });
  const app = Fastify({
    loggerInstance: log as FastifyBaseLogger,
    logController: new RedactingLogController({ disableRequestLogging: quietRequests }),
    childLoggerFactory: requestChildLogger(sessionTasks),
    // A URL Fastify cannot decode is a 400 in the caller's shape (input-guards.ts).
    frameworkErrors,
  });
  if (onRoute) app.addHook("onRoute", onRoute);
  app.setNotFoundHandler(notFoundHandler);
  // Routes declare zod schemas (routes/schemas.ts): they validate requests and encode answers.
  app.setValidatorCompiler(zodValidatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  // Before any route: the OpenAPI document is collected from the routes as they are added.
  await registerDocs(app);
  // Agent bodies held at once over every sandbox: past the budget a call waits, its body unread.
  const bodyBudget = new BodyBudget(bodyBudgetBytes(env), AGENT_BODY_LIMIT, env.ROLLGATE_AGENT_BODY_TIMEOUT_S * 1000, () => metrics.bodyTimedOut());
  // JSON bodies: an empty body (a DELETE sent with a JSON content type) is no body; a malformed,
  // too deep or prototype-poisoning one is a 400 every route renders in its protocol's error shape.
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (req, body, done) => {
    // A chunked agent body, held at the largest size until now, holds its own from here.
    if (req.headers["content-length"] === undefined) bodyBudget.bodyRead(req, Buffer.byteLength(body as string));
    try {
      done(null, parseJsonBody(body as string));
    } catch (err) {
      done(err as Error, undefined);
    }
  });
  // A query string that is not valid percent-encoding: 400 naming the parameter, on every route.
  app.addHook("onRequest", queryGuard);
  // Decided by the route, not the raw URL: Fastify decodes the path before routing ("/%73/<sid>/…" is an agent route).
  app.addHook("onRequest", (req, reply, done) => (req.routeOptions.url?.startsWith("/s/") ? bodyBudget.hook(req, reply, done) : done()));
  // One onSend hook for every answer, callback-style (an async hook is a promise and a microtask
  // turn per request): a 413 keeps reading the rest of the body, so the client reads the answer
  // instead of a reset; a call refused by the session rate limit answers `retry-after` (whatever
  // its protocol).
  app.addHook("onSend", (req, reply, payload, done) => {
    if (reply.statusCode === 413) lingerAfter413(req, reply);
    else if (reply.statusCode === 429) retryAfterHeader(req, reply);
    done(null, payload);
  });
  let publicUrl = env.ROLLGATE_PUBLIC_URL?.replace(/\/+$/, "");
  app.addHook("onListen", async () => {
    if (publicUrl) return;
    const addr = app.server.address();
    if (addr && typeof addr === "object") {
      const host = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
      publicUrl = `http://${host === "0.0.0.0" || host === "[::]" ? "127.0.0.1" : host}:${addr.port}`;
    }
  });

  const tasks = new TaskStore(redis, prefix);
  const router = new RankRouter(redis, prefix, { maxSkew: env.ROLLGATE_AFFINITY_MAX_SKEW });
  const admin = new AdminStore(redis, prefix);
  const subscriber = createRedis(env.REDIS_URL, "producer");
  subscriber.on("error", (err: Error) => log.warn({ err: err.message }, "redis subscriber error"));
  // One subscription to the admin channel, heard by the pause gate and the rank-health bus.
  const channel = new AdminChannel(admin, subscriber);
  const pause = new PauseGate(admin, channel, log, () => weights.get(), (operation) => metrics.backgroundError(operation));
  await pause.start();
  const loadedWeights = new LoadedWeights(admin, channel, log);
  await loadedWeights.start();
  const preflight = new PreflightReports(registry, log);
  const rankHealth = new RankHealthBus(admin, channel);
  const health = new EngineHealth(
    registry,
    router,
    env.ROLLGATE_HEALTH_FAILURES,
    log,
    (member, down) => rankHealth.announce(member, down),
    () => pause.paused !== null,
    async (engine) => {
      const [loaded, policy] = await Promise.all([admin.loadedEngines(), weights.get()]);
      if (!loaded || loaded.version !== policy || !loaded.engines.includes(engine)) return null;
      const reported = await engineWeightVersion(registry.dispatcher, registry.engines[engine]!);
      return reported !== null && reported !== policy
        ? `the engine reports weight version ${reported}, not ${policy} which it loaded: it restarted on other weights (pause, load the weights again, resume)`
        : null;
    },
    {
      engineVersion: (engine) => engineVersion(registry.dispatcher, registry.engines[engine]!),
      // A restarted engine may be another release: probed again before its next call, and its preflight redone.
      restarted: (engine) => {
        registry.forgetCapabilities(engine);
        void preflight.get(engine, { full: false, refresh: true });
      },
    },
  );
  rankHealth.onChange((member, down) => health.heard(member, down));
  await rankHealth.start();
  health.start(env.ROLLGATE_HEALTH_INTERVAL_S);
  const rerouter = new Rerouter(registry, router, sessions, health, env.ROLLGATE_ROUTING);
  const submitSweep = new SubmitSweep(tasks, rollouts, log, { intervalMs: env.ROLLGATE_SUBMIT_SWEEP_MS, graceMs: env.ROLLGATE_SUBMIT_GRACE_MS });
  submitSweep.start();
  const lostCalls = new LostCallLedger(sessions, log, { onNoted: (call) => metrics.lostCall(call.kind), storeReady: () => redis.status === "ready" });
  const ctx: GatewayContext = {
    env,
    redis,
    queueRedis,
    log,
    tasks,
    sessions,
    router,
    weights,
    registry,
    caller: new ChatCaller({
      pending: new PendingCalls({ sessions, log, lostCalls, countError: (what) => metrics.storeError(what), waitMs: env.ROLLGATE_APPEND_WAIT_MS }),
      registry,
      sessions,
      tasks,
      pause,
      rerouter,
      log,
      observe: (record, call) => {
        metrics.observeCall(record, call);
        health.recordCall(rankMember(call.target.engineIndex, call.target.dpRank), record.latency_ms);
      },
      continuation: env.ROLLGATE_CONTINUATION,
      countError: (what) => metrics.storeError(what),
      tokenHoldTtlMs: env.ROLLGATE_TOKEN_HOLD_TTL_S * 1000,
      loadedWeights,
      staleWeights: (engine) => void health.checkStale(engine).catch((err: Error) => log.warn({ err: err.message, engine }, "cannot drain an engine on stale weights")),
      countRetry: (engine, dpRank, reason) => metrics.retriedCall(engine, dpRank, reason),
      rankUnreachable: (member) => void health.callFailed(member).catch((err: Error) => log.warn({ err: err.message, rank: member }, "cannot probe a rank a call found unreachable")),
    }),
    lostCalls,
    admin,
    pause,
    health,
    preflight,
    rollouts,
    rateLimit: new SessionRateLimiter(redis, prefix, env.ROLLGATE_SESSION_RATE, env.ROLLGATE_SESSION_BURST ?? Math.max(1, 2 * env.ROLLGATE_SESSION_RATE)),
    bodyBudget,
    publicUrl: () => publicUrl ?? `http://127.0.0.1:${env.PORT}`,
  };

  await app.register(requestObservability({ metrics, sessionTasks }));
  await app.register(healthRoutes(ctx));
  await app.register(trainerRoutes(ctx));
  await app.register(openAIAgentRoutes(ctx));
  await app.register(responsesAgentRoutes(ctx));
  await app.register(anthropicAgentRoutes(ctx));
  await app.register(geminiAgentRoutes(ctx));
  await app.register(dashboardRoutes());
  await app.register(metricsRoutes(ctx, metrics));
  await app.register(queueBoardRoutes(ctx));

  // What will hold on each engine, found out in the background once the app is up (and logged).
  app.addHook("onReady", async () => ctx.preflight.start());

  // A connection no request has begun on does not hold the close (ops/unused-connections.ts).
  const closeUnusedConnections = unusedConnectionsCloser(app.server);
  app.addHook("preClose", (done) => {
    closeUnusedConnections();
    done();
  });
  app.addHook("onClose", async () => {
    health.stop();
    await submitSweep.stop();
    bodyBudget.close();
    // Answered calls whose records are still being written: stored (or marked lost) before Redis goes.
    await ctx.caller.pending.drain();
    await lostCalls.close();
    await pause.stop();
    channel.close();
    await rollouts.close();
    await registry.close();
    redis.disconnect();
    queueRedis.disconnect();
  });
  // The instance is typed with pino's Logger; callers only need the default Fastify shape.
  return app as unknown as FastifyInstance;
}

/**
 * ROLLGATE_AGENT_BODY_BUDGET_MB, or a quarter of the V8 heap limit: a body is parsed into the heap
 * and lives there for its call, and a heap that reaches its limit ends the process.
 */
function bodyBudgetBytes(env: GatewayEnv): number {
  if (env.ROLLGATE_AGENT_BODY_BUDGET_MB !== undefined) return env.ROLLGATE_AGENT_BODY_BUDGET_MB * 2 ** 20;
  return Math.max(AGENT_BODY_LIMIT, Math.floor(getHeapStatistics().heap_size_limit / 4));
}
