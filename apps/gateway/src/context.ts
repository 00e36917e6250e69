import type { RolloutJob } from "@rollgate/queue";
import type { AdminStore, RankRouter, RedisClient, SessionStore, TaskStore, WeightStore } from "@rollgate/store";
import type { Queue } from "bullmq";
import type { Logger } from "pino";
import type { EngineRegistry } from "./engines/registry.js";
import type { ChatCaller } from "./llm/chat-call.js";
import type { LostCallLedger } from "./llm/lost-calls.js";
import type { BodyBudget } from "./ops/body-budget.js";
import type { EngineHealth } from "./ops/engine-health.js";
import type { PauseGate } from "./ops/pause-gate.js";
import type { PreflightReports } from "./ops/preflight.js";
import type { SessionRateLimiter } from "./ops/rate-limit.js";
import type { GatewayEnv } from "./env.js";

/** Everything the routes share. Built once per gateway process (see app.ts). */
export interface GatewayContext {
  env: GatewayEnv;
  redis: RedisClient;
  /**
   * The connection BullMQ queues use. Never `redis`: BullMQ defines its dozens of Lua scripts on
   * the client it is given, and ioredis copies every defined script into each auto-pipelined batch
   * and MULTI of that client (tens of µs of CPU on each of the stores' commands).
   */
  queueRedis: RedisClient;
  log: Logger;
  tasks: TaskStore;
  sessions: SessionStore;
  router: RankRouter;
  weights: WeightStore;
  registry: EngineRegistry;
  caller: ChatCaller;
  /** Marks sessions that lost a call to infrastructure (their rollouts are not scored). */
  lostCalls: LostCallLedger;
  admin: AdminStore;
  pause: PauseGate;
  health: EngineHealth;
  /** Each engine's preflight (what will hold before a run), run at start. */
  preflight: PreflightReports;
  rollouts: Queue<RolloutJob>;
  /** ROLLGATE_SESSION_RATE: agent calls per second per session (off when absent or rate 0). */
  rateLimit?: SessionRateLimiter;
  /** The bytes of agent request bodies held at once (ROLLGATE_AGENT_BODY_BUDGET_MB). */
  bodyBudget: BodyBudget;
  /** How sandboxes reach this gateway; set once the server listens. */
  publicUrl: () => string;
}
