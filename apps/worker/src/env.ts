import { KeyPrefix, LogLevel, OptionalSecret, RedisUrl, ResultTtlSeconds, parseEnv } from "@rollgate/config";
import { isEgressRule } from "@rollgate/protocol";
import { z } from "zod";

/** The worker's environment (a bad value is a start-up error naming every bad variable). */

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
  ROLLGATE_SANDBOX_PATH: z
    .string()
    .refine(
      (p) => p.split(":").every((d) => d.startsWith("/")),
      // An empty or relative entry is looked up from the working directory, which the agent wrote:
      // its ./python3 would run as the grader's python3.
      "must be a colon list of absolute folders (an empty or relative entry would find programs the agent left in its working directory)",
    )
    .optional(),
  /** More host paths bubblewrap sandboxes see (read-only): a comma list of absolute paths. */
  ROLLGATE_SANDBOX_BINDS: z
    .string()
    .default("")
    .transform((s) => s.split(",").map((p) => p.trim()).filter(Boolean))
    .refine((l) => l.every((p) => p.startsWith("/")), "must be a comma list of absolute paths"),
  /** Host paths only evaluators of bubblewrap sandboxes see (read-only; hidden tests): a comma list of absolute paths. */
  ROLLGATE_EVALUATOR_BINDS: z
    .string()
    .default("")
    .transform((s) => s.split(",").map((p) => p.trim()).filter(Boolean))
    .refine((l) => l.every((p) => p.startsWith("/")), "must be a comma list of absolute paths"),
  /** The most a bubblewrap sandbox's /tmp and /dev/shm each hold, in MiB: they are tmpfs, the host's memory. */
  ROLLGATE_SANDBOX_TMPFS_MB: z.coerce.number().int().positive().default(512),
  /**
   * The most processes (threads included) a bubblewrap sandbox runs at once (RLIMIT_NPROC, which
   * root ignores: a root worker runs its sandboxes as ROLLGATE_SANDBOX_UID).
   */
  ROLLGATE_SANDBOX_MAX_PROCS: z.coerce.number().int().positive().default(4096),
  /**
   * The most memory each process of a bubblewrap sandbox may take, in MiB (RLIMIT_DATA: address
   * space only reserved does not count); 0: no limit.
   */
  ROLLGATE_SANDBOX_PROCESS_MEMORY_MB: z.coerce.number().int().nonnegative().default(8192),
  /**
   * The most a sandbox keeps in its own folders (working directory, HOME, TMPDIR), in MiB: they
   * then live on a tmpfs of that size mounted by the worker (root only). 0: no cap (folders of
   * ROLLGATE_SANDBOX_ROOT).
   */
  ROLLGATE_SANDBOX_DISK_MB: z.coerce.number().int().nonnegative().default(0),
  /** With ROLLGATE_SANDBOX_DISK_MB: the most files and folders (inodes) a sandbox's folders hold. */
  ROLLGATE_SANDBOX_INODES: z.coerce.number().int().positive().default(131072),
  /** The unprivileged user and group a root worker runs its bubblewrap sandboxes as (default nobody / nogroup, 65534). */
  ROLLGATE_SANDBOX_UID: z.coerce.number().int().positive().max(4294967294).default(65534),
  ROLLGATE_SANDBOX_GID: z.coerce.number().int().positive().max(4294967294).default(65534),
  /**
   * Destinations a sealed sandbox never reaches, whatever its task's `runtime.egress` allows
   * (same syntax as ROLLGATE_CALLBACK_DENY): name your engines and internal networks here.
   * Loopback, link-local / metadata addresses, Redis and the gateway are always refused.
   */
  ROLLGATE_SANDBOX_EGRESS_DENY: EgressList.default(""),
  /**
   * Local sandboxes: "on" starts the steps' programs from a small helper process (the spawner), so
   * forking them costs the worker's event loop nothing (a Python one when python3 ≥ 3.9 is on the
   * PATH, its starts cheapest; else a node one); "off" forks them from the worker itself.
   */
  ROLLGATE_SANDBOX_SPAWNER: z.enum(["on", "off"]).default("on"),
  /** How long task records and results are kept in Redis (the gateway's must be the same). */
  ROLLGATE_RESULT_TTL_S: ResultTtlSeconds,
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


export function loadWorkerEnv(env: Record<string, string | undefined> = process.env): WorkerEnv {
  return parseEnv(WorkerEnv, env);
}
