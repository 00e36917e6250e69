import { KeyPrefix, LogLevel, OptionalSecret, Port, RedisUrl, ResultTtlSeconds, parseEnv } from "@rollgate/config";
import { resolveProfile } from "@rollgate/models";
import { z } from "zod";

/** The gateway's environment (a bad value is a start-up error naming every bad variable). */

export const EngineConfig = z
  .object({
    kind: z.enum(["vllm", "sglang"]),
    url: z.url({ protocol: /^https?$/ }).transform((u) => u.replace(/\/+$/, "")),
    dp_size: z.number().int().positive().default(1),
    /** The model name to send; when absent it is read from the engine's `/v1/models`. */
    model: z.string().optional(),
    /**
     * The model profile (what rollgate knows of the model's family): a preset name or an inline
     * object, checked by the gateway against `@rollgate/models`; absent: `default`.
     */
    profile: z.union([z.string().min(1), z.record(z.string(), z.unknown())]).optional(),
    /** Token ids must be below this; overrides the profile's vocabulary size. */
    vocab_size: z.number().int().positive().optional(),
    /**
     * Ask for and record the experts an MoE model routed each token to (routing replay, R3): the
     * engine must run with `--enable-return-routed-experts`; an answer without them fails the call.
     */
    routed_experts: z.boolean().optional(),
  })
  .strict();
export type EngineConfig = z.infer<typeof EngineConfig>;

const EngineList = z
  .string()
  .transform((s, ctx) => {
    try {
      return JSON.parse(s) as unknown;
    } catch {
      ctx.addIssue({ code: "custom", message: "must be a JSON list of {kind, url, dp_size, model?, profile?, vocab_size?, routed_experts?}" });
      return z.NEVER;
    }
  })
  .pipe(z.array(EngineConfig).min(1));

export const GatewayEnv = z.object({
  PORT: Port.default(8080),
  HOST: z.string().default("127.0.0.1"),
  REDIS_URL: RedisUrl,
  ROLLGATE_KEY_PREFIX: KeyPrefix,
  ROLLGATE_API_KEY: OptionalSecret,
  ROLLGATE_ENGINES: EngineList,
  ROLLGATE_PUBLIC_URL: z.url().optional(),
  ROLLGATE_ENGINE_TIMEOUT_S: z.coerce.number().positive().default(600),
  /**
   * How long a call's max_total_tokens hold (its worst case, kept in Redis for every replica to
   * see) counts when its gateway never releases it: a replica that died must not block its
   * sessions' budgets for ever. Longer than any call runs (engine timeout, pauses), else a call
   * still running loses its hold and the session may pass its limit.
   */
  ROLLGATE_TOKEN_HOLD_TTL_S: z.coerce.number().positive().default(900),
  /**
   * Connections to each engine URL at most (calls in flight beyond it wait in the pool). Every
   * agent session may have a call in flight: thousands of sessions need thousands of connections.
   */
  ROLLGATE_ENGINE_CONNECTIONS: z.coerce.number().int().positive().default(4096),
  /** How a new session picks its engine rank (see RankRouter). */
  ROLLGATE_ROUTING: z.enum(["affinity", "least_loaded", "round_robin"]).default("least_loaded"),
  /** `affinity` routing: a group's rank with this many more open sessions than the least-loaded rank is overloaded, and the group moves on. */
  ROLLGATE_AFFINITY_MAX_SKEW: z.coerce.number().int().positive().default(16),
  /** Seconds between health probes of every engine rank (0 turns them off). */
  ROLLGATE_HEALTH_INTERVAL_S: z.coerce.number().nonnegative().default(10),
  /** Consecutive failed probes before a rank is drained. */
  ROLLGATE_HEALTH_FAILURES: z.coerce.number().int().positive().default(2),
  /**
   * How a call that continues a recorded one reaches the engine (README "Trajectories"):
   * `auto` lets the engine render the chat unless its template would rewrite the recorded tokens,
   * then continues token-in (recorded prompt + output ids + the new turns' ids); `token_in` always
   * continues token-in when the call extends a recorded one; `render` never does.
   */
  ROLLGATE_CONTINUATION: z.enum(["auto", "render", "token_in"]).default("auto"),
  /**
   * How long a session's close waits for the records of its calls still being written (an agent is
   * answered before its call's record is stored); a call with no record by then is marked lost.
   */
  ROLLGATE_APPEND_WAIT_MS: z.coerce.number().int().nonnegative().default(5_000),
  /**
   * Agent calls one session may make per second, across every replica (a token bucket in Redis);
   * over it, the call is answered 429 in the agent's protocol with `retry-after`. 0 (default): off.
   */
  ROLLGATE_SESSION_RATE: z.coerce.number().nonnegative().default(0),
  /** The bucket: calls a session may make at once after being idle (default: twice the rate, at least 1). */
  ROLLGATE_SESSION_BURST: z.coerce.number().positive().optional(),
  /**
   * MiB of agent request bodies held at once over every session (ops/body-budget.ts); calls past it
   * wait, their bodies unread. Default: a quarter of the process's V8 heap limit. At least 64 (the
   * largest body).
   */
  ROLLGATE_AGENT_BODY_BUDGET_MB: z.coerce.number().int().min(64).optional(),
  /** Seconds an agent request's body may take to arrive once it may be read; past it the connection is closed. */
  ROLLGATE_AGENT_BODY_TIMEOUT_S: z.coerce.number().positive().default(60),
  /**
   * The infrastructure retry budget of a rollout: attempts in all (the gateway unreachable or
   * failing for the worker, a session that lost an LLM call). Set on each rollout job when it is queued.
   */
  ROLLGATE_ROLLOUT_ATTEMPTS: z.coerce.number().int().positive().default(3),
  /** Delay before a rollout's second attempt, doubled for each later one (with jitter). */
  ROLLGATE_ROLLOUT_BACKOFF_MS: z.coerce.number().int().nonnegative().default(2_000),
  /**
   * Milliseconds between rounds of the submit sweep (ops/submit-sweep.ts): one replica at a time
   * queues the job of a task whose submission never got that far (its replica was killed between
   * storing the task and queueing its job). 0 turns it off.
   */
  ROLLGATE_SUBMIT_SWEEP_MS: z.coerce.number().int().nonnegative().default(10_000),
  /** How old an unfinished submission must be before the sweep finishes it (a live submit is far quicker). */
  ROLLGATE_SUBMIT_GRACE_MS: z.coerce.number().int().positive().default(30_000),
  /** How long the record of a task the gateway ends itself (cancelled before it started) is kept: the workers' TTL, set the same. */
  ROLLGATE_RESULT_TTL_S: ResultTtlSeconds,
  LOG_LEVEL: LogLevel,
});
export type GatewayEnv = z.infer<typeof GatewayEnv>;


/** The gateway's environment: GatewayEnv, with each engine's model profile checked against the presets. */
const GatewayEnvWithProfiles = GatewayEnv.extend({
  ROLLGATE_ENGINES: GatewayEnv.shape.ROLLGATE_ENGINES.superRefine((engines, ctx) => {
    engines.forEach((e, i) => {
      const r = resolveProfile(e.profile, e.vocab_size);
      if (!r.ok) for (const message of r.issues) ctx.addIssue({ code: "custom", path: [i, "profile"], message });
    });
  }),
});

export function loadGatewayEnv(env: Record<string, string | undefined> = process.env): GatewayEnv {
  return parseEnv(GatewayEnvWithProfiles, env);
}
