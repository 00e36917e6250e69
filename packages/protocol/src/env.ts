import { z } from "zod";

/** Environment schemas for each app (docs/operations.md#environment). A bad value is a start-up error, never a silent default. */

const Port = z.coerce.number().int().min(0).max(65535);
const LogLevel = z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info");
/** One server (`redis://host:port/db`) or a Redis Cluster by its seed nodes (`redis+cluster://h1:p1,h2:p2`). */
const RedisUrl = z
  .string()
  .default("redis://127.0.0.1:6379")
  .refine(
    (u) => /^rediss?:\/\//.test(u) || /^rediss?\+cluster:\/\/(?:[^@/]*@)?[^/:,]+:\d+(?:,[^/:,]+:\d+)*\/?$/.test(u),
    "must be redis://host:port[/db], rediss://…, or redis+cluster://host1:port1,host2:port2",
  );
const OptionalSecret = z
  .string()
  .optional()
  .transform((s) => (s === "" ? undefined : s));
/** Key prefix for every Redis key and BullMQ queue of one deployment (lets tests share a server). */
const KeyPrefix = z
  .string()
  .regex(/^[A-Za-z0-9_-]+$/, "letters, digits, '_' or '-' only")
  .default("rg");

/** Whether a string has the form of one egress rule: a CIDR, an IP, a host name, `*.suffix` or `*` (the worker parses it fully). */
export function isEgressRule(r: string): boolean {
  return r === "*" || /^(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?$/.test(r) || /^[0-9A-Fa-f:.]+(\/\d{1,3})?$/.test(r);
}

/** A comma list of egress rules: CIDRs, IPs, host names, `*.suffix` or `*` (worker callbacks). */
const EgressList = z.string().refine(
  (s) =>
    s
      .split(",")
      .map((r) => r.trim())
      .filter(Boolean)
      .every(isEgressRule),
  "must be a comma list of CIDRs (10.0.0.0/8), IPs, host names, *.domain, or *",
);

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
  })
  .strict();
export type EngineConfig = z.infer<typeof EngineConfig>;

const EngineList = z
  .string()
  .transform((s, ctx) => {
    try {
      return JSON.parse(s) as unknown;
    } catch {
      ctx.addIssue({ code: "custom", message: "must be a JSON list of {kind, url, dp_size, model?, profile?, vocab_size?}" });
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
   * Agent calls one session may make per second, across every replica (a token bucket in Redis);
   * over it, the call is answered 429 in the agent's protocol with `retry-after`. 0 (default): off.
   */
  ROLLGATE_SESSION_RATE: z.coerce.number().nonnegative().default(0),
  /** The bucket: calls a session may make at once after being idle (default: twice the rate, at least 1). */
  ROLLGATE_SESSION_BURST: z.coerce.number().positive().optional(),
  /**
   * The infrastructure retry budget of a rollout: attempts in all (the gateway unreachable or
   * failing for the worker, a session that lost an LLM call). Set on each rollout job when it is queued.
   */
  ROLLGATE_ROLLOUT_ATTEMPTS: z.coerce.number().int().positive().default(3),
  /** Delay before a rollout's second attempt, doubled for each later one (with jitter). */
  ROLLGATE_ROLLOUT_BACKOFF_MS: z.coerce.number().int().nonnegative().default(2_000),
  LOG_LEVEL: LogLevel,
});
export type GatewayEnv = z.infer<typeof GatewayEnv>;

const RUNTIME_KINDS = ["local", "docker", "kubernetes"] as const;
const SandboxRuntimes = z
  .string()
  .default("local")
  .transform((s, ctx) => {
    const kinds = [...new Set(s.split(",").map((k) => k.trim()).filter(Boolean))];
    const bad = kinds.filter((k) => !(RUNTIME_KINDS as readonly string[]).includes(k));
    if (kinds.length === 0 || bad.length > 0) {
      ctx.addIssue({ code: "custom", message: `must be a comma list of ${RUNTIME_KINDS.join(", ")}${bad.length ? ` (unknown: ${bad.join(", ")})` : ""}` });
      return z.NEVER;
    }
    return kinds as (typeof RUNTIME_KINDS)[number][];
  });

export const WorkerEnv = z.object({
  REDIS_URL: RedisUrl,
  ROLLGATE_KEY_PREFIX: KeyPrefix,
  /** Where the worker reaches the gateway's session API. */
  ROLLGATE_GATEWAY_URL: z.url().default("http://127.0.0.1:8080"),
  ROLLGATE_API_KEY: OptionalSecret,
  ROLLGATE_WORKER_CONCURRENCY: z.coerce.number().int().positive().default(4),
  ROLLGATE_WORKER_NAME: z.string().min(1).optional(),
  /** Parent folder of the per-rollout working directories (default: the OS temp dir). */
  ROLLGATE_SANDBOX_ROOT: z.string().optional(),
  /** PATH given to sandboxed programs; default: node's folder, the install's bins, /usr/local/bin:/usr/bin:/bin. */
  ROLLGATE_SANDBOX_PATH: z.string().optional(),
  /** More host paths bubblewrap sandboxes see (read-only): a comma list of absolute paths. */
  ROLLGATE_SANDBOX_BINDS: z
    .string()
    .default("")
    .transform((s) => s.split(",").map((p) => p.trim()).filter(Boolean))
    .refine((l) => l.every((p) => p.startsWith("/")), "must be a comma list of absolute paths"),
  /**
   * Destinations a sealed sandbox never reaches, whatever its task's `runtime.egress` allows
   * (same syntax as ROLLGATE_CALLBACK_DENY): name your engines and internal networks here.
   * Loopback, link-local / metadata addresses, Redis and the gateway are always refused.
   */
  ROLLGATE_SANDBOX_EGRESS_DENY: EgressList.default(""),
  /** How long task records and results are kept in Redis. */
  ROLLGATE_RESULT_TTL_S: z.coerce.number().int().positive().default(7 * 24 * 3600),
  ROLLGATE_CALLBACK_ATTEMPTS: z.coerce.number().int().positive().default(12),
  /** On SIGTERM: how long running rollouts may finish before they are cancelled. */
  ROLLGATE_SHUTDOWN_GRACE_S: z.coerce.number().nonnegative().default(30),
  /** BullMQ lock (renewed while a rollout runs); a dead worker's job is recovered after about this long. */
  ROLLGATE_JOB_LOCK_MS: z.coerce.number().int().min(1000).default(30_000),
  ROLLGATE_STALLED_INTERVAL_MS: z.coerce.number().int().min(500).default(15_000),
  ROLLGATE_CALLBACK_BACKOFF_MS: z.coerce.number().int().positive().default(1000),
  /** Which `runtime.kind`s this worker runs: a comma list of local, docker, kubernetes (default local). */
  ROLLGATE_RUNTIMES: SandboxRuntimes,
  /** The Docker engine (`docker` runtime): unix:///path/docker.sock, a bare socket path, or tcp://host:port. */
  DOCKER_HOST: z
    .string()
    .default("unix:///var/run/docker.sock")
    .refine((h) => /^(unix:\/\/\/|\/|tcp:\/\/|https?:\/\/)/.test(h), "must be unix:///path, /path, tcp://host:port or http(s)://host:port"),
  /** The Docker network of `runtime.network: "host"` containers (it must reach ROLLGATE_PUBLIC_URL); sealed ones get a network of their own. */
  ROLLGATE_DOCKER_NETWORK: z.string().min(1).default("bridge"),
  /**
   * The worker's own container (name, id, or `self`: its hostname, which Docker makes the container id), when the worker runs in a container on the Docker
   * engine it drives: it joins each sealed sandbox's network and serves the sandbox's relay
   * there. Unset: the relay listens on the sandbox network's gateway address (the worker runs on the Docker host).
   */
  ROLLGATE_DOCKER_RELAY_CONTAINER: z.string().min(1).optional(),
  /** The namespace sandbox pods and their Secrets are created in (`kubernetes` runtime). */
  ROLLGATE_K8S_NAMESPACE: z
    .string()
    .regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, "must be a Kubernetes namespace name")
    .default("rollgate-sandboxes"),
  /** Sandbox pods one worker keeps at once; more rollouts wait for a slot (default: ROLLGATE_WORKER_CONCURRENCY). */
  ROLLGATE_K8S_MAX_PODS: z.coerce.number().int().positive().optional(),
  /** How long a sandbox pod may take to be Running (scheduling, image pull) before the attempt fails. */
  ROLLGATE_K8S_START_TIMEOUT_S: z.coerce.number().positive().default(300),
  /**
   * Where callbacks (and `http` evaluators) may go: a comma list of CIDRs (10.0.0.0/8, ::1/128),
   * IPs, host names or `*.domain` suffixes; `*` (default) allows any destination not denied.
   * Checked on the address the name resolves to at send time, and the connection goes to that address.
   */
  ROLLGATE_CALLBACK_ALLOW: EgressList.default("*"),
  /**
   * More destinations to refuse, same syntax. Link-local (169.254.0.0/16, fe80::/10) and cloud
   * metadata endpoints (169.254.169.254, fd00:ec2::254, metadata.google.internal, …) are always refused.
   */
  ROLLGATE_CALLBACK_DENY: EgressList.default(""),
  /**
   * How often the worker asks the gateway's /readyz; it takes rollouts only while the gateway is
   * ready (the queue holds them meanwhile). 0: take rollouts whatever the gateway says.
   */
  ROLLGATE_READINESS_POLL_MS: z.coerce.number().int().nonnegative().default(2_000),
  LOG_LEVEL: LogLevel,
});
export type WorkerEnv = z.infer<typeof WorkerEnv>;

export const EngineSimEnv = z.object({
  PORT: Port.default(8000),
  HOST: z.string().default("127.0.0.1"),
  SIM_KIND: z.enum(["vllm", "sglang"]).default("vllm"),
  SIM_DP_SIZE: z.coerce.number().int().positive().default(1),
  SIM_MODEL: z.string().default("Qwen/Qwen3-8B"),
  SIM_SEED: z.coerce.number().int().default(0),
  /** Tokens in an unscripted answer. */
  SIM_RANDOM_TOKENS: z.coerce.number().int().positive().default(24),
  SIM_TTFT_MS: z.coerce.number().nonnegative().default(0),
  SIM_TPOT_MS: z.coerce.number().nonnegative().default(0),
  SIM_MAX_MODEL_LEN: z.coerce.number().int().positive().default(40960),
  /** Per-rank batch limit; more requests wait (0 = no limit). */
  SIM_MAX_RUNNING: z.coerce.number().int().nonnegative().default(0),
  /** Initial weight version (default: vLLM "0", SGLang "default"). */
  SIM_WEIGHT_VERSION: z.string().min(1).optional(),
  LOG_LEVEL: LogLevel,
});
export type EngineSimEnv = z.infer<typeof EngineSimEnv>;

export const ClusterEnv = z.object({
  PORT: Port.default(8080),
  HOST: z.string().default("127.0.0.1"),
  REDIS_URL: z.string().optional(),
  ROLLGATE_KEY_PREFIX: KeyPrefix,
  ROLLGATE_API_KEY: OptionalSecret,
  ROLLGATE_ENGINES: z.string().optional(),
  ROLLGATE_PUBLIC_URL: z.url().optional(),
  ROLLGATE_WORKER_CONCURRENCY: z.coerce.number().int().positive().default(4),
  ROLLGATE_SIM_PORT: Port.default(0),
  ROLLGATE_SIM_DP_SIZE: z.coerce.number().int().positive().default(2),
  LOG_LEVEL: LogLevel,
});
export type ClusterEnv = z.infer<typeof ClusterEnv>;

/** Parses an environment with a schema, or throws one error that lists every bad variable. */
export function parseEnv<S extends z.ZodType>(schema: S, env: Record<string, string | undefined>): z.infer<S> {
  const result = schema.safeParse(env);
  if (result.success) return result.data;
  const lines = result.error.issues.map((i) => `  ${i.path.join(".") || "(env)"}: ${i.message}`);
  throw new Error(`invalid environment:\n${lines.join("\n")}`);
}
