import { z } from "zod";
import { SamplingParams } from "./chat.js";
import { Id } from "./ids.js";
import { Trajectory, TrajectoryBuilderName } from "./trace.js";

/** Whether a string has the form of one egress rule: a CIDR, an IP, a host name, `*.suffix` or `*` (the worker parses it fully). */
export function isEgressRule(r: string): boolean {
  return r === "*" || /^(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?$/.test(r) || /^[0-9A-Fa-f:.]+(\/\d{1,3})?$/.test(r);
}

const Argv = z.array(z.string()).min(1, "needs at least the program to run");

export const Limits = z
  .object({
    timeout_s: z.number().positive().max(7 * 24 * 3600).default(1800),
    max_llm_calls: z.number().int().positive().optional(),
    max_total_tokens: z.number().int().positive().optional(),
  })
  .strict();
export type Limits = z.infer<typeof Limits>;

/** The agent CLIs rollgate knows how to run unmodified (the worker's harness presets). */
export const HarnessPreset = z.enum(["claude-code", "codex", "gemini-cli", "opencode", "qwen-code", "pi"]);
export type HarnessPreset = z.infer<typeof HarnessPreset>;

/** Which wire protocol a multi-protocol CLI (opencode, pi) should speak. */
export const AgentProtocol = z.enum(["openai_chat", "openai_responses", "anthropic_messages", "gemini"]);
export type AgentProtocol = z.infer<typeof AgentProtocol>;

const AgentCommon = {
  /** The model name the agent is told to use (the gateway serves the engine's model whatever it is). */
  model: z.string().min(1).optional(),
  /** Extra argv appended to the harness's own. */
  args: z.array(z.string()).default([]),
  env: z.record(z.string(), z.string()).default({}),
};

export const AgentSpec = z.discriminatedUnion("harness", [
  z.object({ harness: z.literal("command"), command: Argv, ...AgentCommon }).strict(),
  z
    .object({
      harness: HarnessPreset,
      protocol: AgentProtocol.optional(),
      ...AgentCommon,
    })
    .strict(),
]);
export type AgentSpec = z.infer<typeof AgentSpec>;

/** Relative paths only: a file may never land outside the sandbox's working directory. */
const RelativePath = z
  .string()
  .min(1)
  .refine((p) => !p.startsWith("/") && !p.split(/[\\/]/).includes(".."), "must be a relative path inside the working directory");

/** A CPU quantity: cores as a number (1.5) or a Kubernetes string ("2", "500m"). */
const CpuQuantity = z.union([
  z.number().positive().max(1024),
  z.string().regex(/^(\d+(\.\d+)?|\d+m)$/, 'cores ("2", "0.5") or millicores ("500m")'),
]);
/** A memory quantity: bytes as a number, or a Kubernetes string ("512Mi", "2Gi", "1G"). */
const MemoryQuantity = z.union([
  z.number().int().positive(),
  z.string().regex(/^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|K|M|G|T)?$/, 'bytes or a quantity like "512Mi", "2Gi", "1G"'),
]);
const LabelValue = z.string().regex(/^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/, "must be a Kubernetes label value");

/**
 * Where a rollout runs (docs/agent-environment.md#runtimes): `local` (folders on the worker's host), `docker` (one
 * container per rollout on the worker's Docker engine) or `kubernetes` (one pod per rollout in the
 * worker's sandbox namespace). One object with kind-specific optional fields, so a task without
 * `runtime` (or `{}`) stays a `local` one with the same defaults as before.
 */
export const RuntimeSpec = z
  .object({
    kind: z.enum(["local", "docker", "kubernetes"]).default("local"),
    files: z.record(RelativePath, z.string()).default({}),
    prepare: z.array(Argv).default([]),
    /** The container image: required for `docker` and `kubernetes` (`local` ignores it, as before). */
    image: z.string().min(1).nullable().default(null),
    /** Keep the sandbox after the rollout (for debugging); it is removed by default. */
    keep: z.boolean().default(false),
    /** `local` only. `bwrap`: run every step inside bubblewrap with the working directory as the only writable path. */
    isolation: z.enum(["none", "bwrap"]).default("none"),
    /** `docker`/`kubernetes`: the working directory inside the container (default `/workspace`). */
    workdir: z
      .string()
      .refine((p) => p.startsWith("/") && p !== "/" && !p.split("/").includes(".."), "must be an absolute path other than /")
      .optional(),
    /** `docker`/`kubernetes`: limits (Kubernetes also requests the same, so the pod is Guaranteed). */
    resources: z.object({ cpu: CpuQuantity.optional(), memory: MemoryQuantity.optional() }).strict().optional(),
    /**
     * `sealed`: the agent reaches its own session's gateway routes and, through the worker, only
     * what `egress` allows; nothing else of the network (the default for bwrap, docker and
     * kubernetes). `host`: the host's network as it is (the only choice for `local` without
     * isolation; `docker`: the worker's ROLLGATE_DOCKER_NETWORK). See `runtimeNetwork`.
     */
    network: z.enum(["sealed", "host"]).optional(),
    /**
     * A sealed sandbox's way out, besides its session: CIDRs, IPs, host names, `*.domain`, or `*`
     * (any destination the worker does not deny). Default: nothing. HTTP(S) through the proxy
     * the worker gives the agent (HTTP_PROXY / HTTPS_PROXY); kubernetes: CIDRs and IPs only.
     */
    egress: z
      .array(z.string().refine(isEgressRule, "must be a CIDR (10.0.0.0/8), an IP, a host name, *.domain, or *"))
      .max(256)
      .default([]),
    /** `kubernetes` only: the pod's service account (its token is never mounted). Default: the namespace's `default`. */
    service_account: z.string().min(1).optional(),
    /** `kubernetes` only: the pod's nodeSelector. */
    node_selector: z.record(z.string().min(1), LabelValue).optional(),
  })
  .strict()
  .superRefine((r, ctx) => {
    const bad = (path: string, message: string) => ctx.addIssue({ code: "custom", path: [path], message });
    const only: Record<string, Array<"docker" | "kubernetes">> = {
      workdir: ["docker", "kubernetes"],
      resources: ["docker", "kubernetes"],
      service_account: ["kubernetes"],
      node_selector: ["kubernetes"],
    };
    for (const [field, kinds] of Object.entries(only)) {
      if (r[field as keyof typeof r] !== undefined && !(kinds as string[]).includes(r.kind)) {
        bad(field, `only for runtime.kind ${kinds.join(" or ")}`);
      }
    }
    const network = runtimeNetwork(r);
    if (network === "sealed" && r.kind === "local" && r.isolation !== "bwrap") {
      bad("network", 'a local sandbox without isolation shares the host\'s network: "sealed" needs runtime.isolation "bwrap" (or a container runtime)');
    }
    if (network === "host" && r.kind === "kubernetes") bad("network", "a pod's network is the cluster's: kubernetes sandboxes are always sealed (deploy/k8s NetworkPolicy)");
    if (network === "host" && r.egress.length > 0) bad("egress", 'only for runtime.network "sealed" (a "host" network reaches everything the host does)');
    if (r.kind === "local") return;
    if (r.image === null) bad("image", `runtime.kind ${r.kind} needs an image`);
    if (r.isolation !== "none") bad("isolation", "only for runtime.kind local (the container is the isolation)");
  });
export type RuntimeSpec = z.infer<typeof RuntimeSpec>;

/**
 * The network a sandbox gets: `runtime.network` when given, else `sealed` wherever the runtime
 * can seal it (bwrap, docker, kubernetes) and `host` for a local sandbox without isolation.
 */
export function runtimeNetwork(r: Pick<RuntimeSpec, "kind" | "isolation" | "network">): "sealed" | "host" {
  return r.network ?? (r.kind === "local" && r.isolation !== "bwrap" ? "host" : "sealed");
}

const EvalTimeout = z.number().positive().max(24 * 3600).default(600);

export const EvaluatorSpec = z.discriminatedUnion("kind", [
  /** Runs a command in the working directory; `reward` says how its outcome becomes a number. */
  z
    .object({
      kind: z.literal("command"),
      command: Argv,
      /** exit_code: 1 on exit 0 else 0 · last_line_float: the last stdout line · json: `{reward, ...}` on stdout. */
      reward: z.enum(["exit_code", "last_line_float", "json"]).default("exit_code"),
      timeout_s: EvalTimeout,
    })
    .strict(),
  /** Reward 1 when a file in the working directory matches exactly (`equals`) or by `regex`, else 0. */
  z
    .object({
      kind: z.literal("file"),
      path: RelativePath,
      equals: z.string().optional(),
      /** A JavaScript regular expression (checked at submission: one that does not compile is a 400). */
      regex: z
        .string()
        .optional()
        .superRefine((re, c) => {
          if (re === undefined) return;
          try {
            new RegExp(re);
          } catch (err) {
            c.addIssue({ code: "custom", message: `not a valid regular expression: ${(err as Error).message}` });
          }
        }),
    })
    .strict()
    .refine((e) => (e.equals === undefined) !== (e.regex === undefined), "give exactly one of equals or regex"),
  /** Harbor-style: reads `reward.json` ({reward}) or `reward.txt` (a number), after an optional `command`. */
  z
    .object({
      kind: z.literal("reward_file"),
      path: RelativePath.optional(),
      command: Argv.optional(),
      timeout_s: EvalTimeout,
    })
    .strict(),
  /** POSTs the result (without the trajectory) to `url`, which answers `{reward}`. */
  z
    .object({
      kind: z.literal("http"),
      url: z.url({ protocol: /^https?$/ }),
      headers: z.record(z.string(), z.string()).default({}),
      timeout_s: EvalTimeout,
    })
    .strict(),
  z.object({ kind: z.literal("none") }).strict(),
]);
export type EvaluatorSpec = z.infer<typeof EvaluatorSpec>;

export const CallbackSpec = z
  .object({
    url: z.url({ protocol: /^https?$/ }),
    secret: z.string().min(1),
  })
  .strict();
export type CallbackSpec = z.infer<typeof CallbackSpec>;

/**
 * A branch of a recorded rollout (docs/data-model.md#branches): the first `at_call` LLM calls are
 * answered from the source session's records (the agent re-executes the same tool calls in a fresh
 * sandbox), later ones are sampled. Set by `POST /v1/tasks/:id/branches`.
 */
export const BranchSpec = z
  .object({
    task_id: z.string().min(1),
    /** The source task's session, whose records answer the replayed calls. */
    session_id: z.string().min(1),
    at_call: z.number().int().min(1),
    /** Keep the replayed answers' tokens trainable (loss_mask 1); by default they are masked, not being samples of this run. */
    train_replayed: z.boolean().default(false),
  })
  .strict();
export type BranchSpec = z.infer<typeof BranchSpec>;

/** The task a trainer submits (docs/data-model.md#task). */
export const Task = z
  .object({
    id: Id.optional(),
    group_id: Id.optional(),
    instruction: z.string(),
    agent: AgentSpec,
    runtime: RuntimeSpec.default({ kind: "local", files: {}, prepare: [], image: null, keep: false, isolation: "none", egress: [] }),
    evaluator: EvaluatorSpec.nullable().default(null),
    sampling: SamplingParams.default({}),
    limits: Limits.default({ timeout_s: 1800 }),
    trajectory: z.object({ builder: TrajectoryBuilderName.default("prefix_merging") }).strict().default({ builder: "prefix_merging" }),
    callback: CallbackSpec.nullable().default(null),
    metadata: z.record(z.string(), z.unknown()).default({}),
    branch: BranchSpec.optional(),
  })
  .strict();
export type TaskInput = z.input<typeof Task>;
export type Task = z.infer<typeof Task>;
/** A task once accepted: its id is always set. */
export type AcceptedTask = Task & { id: string };

export const TerminalStatus = z.enum(["completed", "failed", "timed_out", "cancelled"]);
export type TerminalStatus = z.infer<typeof TerminalStatus>;
export const TaskStatus = z.enum(["queued", "running", ...TerminalStatus.options]);
export type TaskStatus = z.infer<typeof TaskStatus>;
/** Whether a status is one a task ends in (and never leaves): the one definition of "terminal". */
export function isTerminalStatus(status: string): status is TerminalStatus {
  return (TerminalStatus.options as readonly string[]).includes(status);
}

export const TaskError = z.object({
  kind: z.string(),
  message: z.string(),
  /** `replay_diverged`: the index of the call where the branch's agent asked something else than the source. */
  call: z.number().int().optional(),
});
export type TaskError = z.infer<typeof TaskError>;

/** What a finished rollout produced: in `GET /v1/tasks/:id` and the callback body. */
export const TaskResult = z.object({
  id: z.string(),
  group_id: z.string().nullable(),
  status: TerminalStatus,
  reward: z.number().nullable(),
  evaluation: z
    .object({
      kind: z.string(),
      exit_code: z.number().int().nullable(),
      stdout_tail: z.string(),
      /** What the evaluator read: the parsed JSON, the matched file, the HTTP answer. */
      details: z.unknown().optional(),
    })
    .nullable(),
  error: TaskError.nullable(),
  session_id: z.string().nullable(),
  trajectory: Trajectory.nullable(),
  usage: z.object({
    llm_calls: z.number().int(),
    prompt_tokens: z.number().int(),
    completion_tokens: z.number().int(),
    cached_tokens: z.number().int(),
  }),
  timings: z.object({
    queued_ms: z.number(),
    run_ms: z.number(),
    eval_ms: z.number(),
    total_ms: z.number(),
  }),
  attempts: z.number().int(),
  worker: z.string(),
  agent: z.object({
    exit_code: z.number().int().nullable(),
    signal: z.string().nullable(),
    log_tail: z.string(),
    /**
     * The sandbox's caps the agent's run ended against (a local sandbox with ROLLGATE_SANDBOX_DISK_MB:
     * its folders were full of bytes, or of files, when its last step ended). Absent: none.
     */
    limits_reached: z.array(z.enum(["disk", "inodes"])).optional(),
  }),
  metadata: z.record(z.string(), z.unknown()),
});
export type TaskResult = z.infer<typeof TaskResult>;

/**
 * What a trainer must know of a GRPO group before using it: members by status, and every member
 * that has no reward and why (failed, timed out or cancelled: drop it, or the whole group, before
 * computing advantages; `error.kind: "infrastructure"` means it lost an LLM call, not that the
 * policy failed).
 */
export const GroupSummary = z.object({
  size: z.number().int(),
  /** Members by terminal status (statuses no member has are left out). */
  statuses: z.partialRecord(TerminalStatus, z.number().int()),
  /** Members that ended `completed` with a reward. */
  scored: z.number().int(),
  /** Every other member: its id, status and error. */
  unscored: z.array(z.object({ id: z.string(), status: TerminalStatus.nullable(), error: TaskError.nullable() })),
});
export type GroupSummary = z.infer<typeof GroupSummary>;

/** What a group of branches shares, told once in its group callback. */
export const GroupBranch = z.object({
  /** The task the group branches from, and the call it branches at. */
  task_id: z.string(),
  at_call: z.number().int(),
  /** The replayed part's tokens: the prompt and answer of the last replayed call (every branch starts with them). */
  shared_prefix_ids: z.array(z.number().int()),
  /** Each member's reward, in member order (null: no reward). */
  rewards: z.array(z.number().nullable()),
});
export type GroupBranch = z.infer<typeof GroupBranch>;

/** A group callback's body (`X-Rollgate-Event: group.completed`, once every member has ended). */
export const GroupResult = z.object({
  group_id: z.string(),
  /** Each member's result (null for one that expired from the store). */
  tasks: z.array(TaskResult.nullable()),
  summary: GroupSummary,
  /** Set for a group of branches (POST /v1/tasks/:id/branches). */
  branch: GroupBranch.optional(),
});
export type GroupResult = z.infer<typeof GroupResult>;

/** The summary of a group's results (pure). */
export function summarizeGroup(ids: string[], results: (TaskResult | null)[]): GroupSummary {
  const statuses: Partial<Record<TerminalStatus, number>> = {};
  const unscored: GroupSummary["unscored"] = [];
  let scored = 0;
  ids.forEach((id, i) => {
    const r = results[i] ?? null;
    if (r) statuses[r.status] = (statuses[r.status] ?? 0) + 1;
    if (r && r.status === "completed" && r.reward !== null) scored++;
    else unscored.push({ id, status: r?.status ?? null, error: r ? r.error : { kind: "missing", message: "no readable result is stored for this member" } });
  });
  return { size: ids.length, statuses, scored, unscored };
}

export const CallbackState = z.object({
  state: z.enum(["none", "pending", "delivered", "failed"]),
  delivery_id: z.string().nullable(),
  attempts: z.number().int(),
  last_error: z.string().nullable(),
  delivered_at: z.string().nullable(),
});
export type CallbackState = z.infer<typeof CallbackState>;

/** The stored state of a task: what `GET /v1/tasks/:id` returns. */
export const TaskRecord = z.object({
  id: z.string(),
  group_id: z.string().nullable(),
  status: TaskStatus,
  task: Task,
  created_at: z.string(),
  started_at: z.string().nullable(),
  finished_at: z.string().nullable(),
  attempts: z.number().int(),
  worker: z.string().nullable(),
  session_id: z.string().nullable(),
  callback: CallbackState,
  result: TaskResult.nullable(),
});
export type TaskRecord = z.infer<typeof TaskRecord>;

export const TaskAccepted = z.object({ id: z.string(), status: TaskStatus });
export type TaskAccepted = z.infer<typeof TaskAccepted>;

/** `POST /v1/tasks/batch`: a list of tasks, or a GRPO group of `n` copies of one task. */
export const GroupCallback = CallbackSpec;
export const BatchRequest = z.union([
  z.object({ tasks: z.array(Task).min(1).max(10_000), group_callback: GroupCallback.optional() }).strict(),
  z
    .object({
      group_id: Id,
      n: z.number().int().min(1).max(4096),
      task: Task,
      group_callback: GroupCallback.optional(),
    })
    .strict(),
]);
export type BatchRequest = z.infer<typeof BatchRequest>;

/** `POST /v1/tasks/:id/branches`: N runs that replay the task's first `at_call` calls, then sample. */
export const BranchRequest = z
  .object({
    at_call: z.number().int().min(1),
    n: z.number().int().min(1).max(4096),
    /** The branches' sampling (later calls only; replayed answers are the records'); default: the source task's. */
    sampling: SamplingParams.optional(),
    /** The group callback: every branch's result, their rewards and the shared prefix, once all have ended. */
    callback: GroupCallback.optional(),
    /** Default: `b-<uuid>`; members are `<group_id>-<k>`. */
    group_id: Id.optional(),
    train_replayed: z.boolean().default(false),
  })
  .strict();
export type BranchRequest = z.infer<typeof BranchRequest>;

export const BranchAccepted = z.object({
  group_id: z.string(),
  task_ids: z.array(z.string()),
  /**
   * `at_call` is the number of calls the source made: every branch replays the whole rollout, its
   * last answer included, and samples nothing (no trainable token unless `train_replayed`).
   */
  whole_rollout: z.boolean().default(false),
});
export type BranchAccepted = z.infer<typeof BranchAccepted>;

export const TaskEventType = z.enum(["queued", "started", "llm_call", "evaluating", "terminal", "cancel_requested", "retrying"]);
export type TaskEventType = z.infer<typeof TaskEventType>;

/** One lifecycle event of a task, as `GET /v1/tasks/:id/events` streams it. */
export const TaskEvent = z.object({
  id: z.string(),
  type: TaskEventType,
  at: z.string(),
  data: z.record(z.string(), z.unknown()),
});
export type TaskEvent = z.infer<typeof TaskEvent>;

export const TaskListQuery = z.object({
  status: TaskStatus.optional(),
  group_id: z.string().optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  /** `next_cursor` of an earlier page: "<created ms>:<task id>". */
  cursor: z
    .string()
    .regex(/^\d{1,16}:\S+$/, 'must be the next_cursor of an earlier page ("<created ms>:<task id>")')
    .optional(),
});
export type TaskListQuery = z.infer<typeof TaskListQuery>;
