import { z } from "zod";
import { SamplingParams } from "./chat.js";
import { Id } from "./ids.js";
import { Trajectory, TrajectoryBuilderName } from "./trace.js";

const Argv = z.array(z.string()).min(1, "needs at least the program to run");

export const Limits = z
  .object({
    timeout_s: z.number().positive().max(7 * 24 * 3600).default(1800),
    max_llm_calls: z.number().int().positive().optional(),
    max_total_tokens: z.number().int().positive().optional(),
  })
  .strict();
export type Limits = z.infer<typeof Limits>;

export const AgentSpec = z
  .object({
    /** Only the `command` harness exists so far; named CLI presets come with the fleet issue. */
    harness: z.literal("command"),
    command: Argv,
    model: z.string().optional(),
    args: z.array(z.string()).default([]),
    env: z.record(z.string(), z.string()).default({}),
  })
  .strict();
export type AgentSpec = z.infer<typeof AgentSpec>;

/** Relative paths only: a file may never land outside the sandbox's working directory. */
const RelativePath = z
  .string()
  .min(1)
  .refine((p) => !p.startsWith("/") && !p.split(/[\\/]/).includes(".."), "must be a relative path inside the working directory");

export const RuntimeSpec = z
  .object({
    kind: z.literal("local").default("local"),
    files: z.record(RelativePath, z.string()).default({}),
    prepare: z.array(Argv).default([]),
    image: z.string().nullable().default(null),
  })
  .strict();
export type RuntimeSpec = z.infer<typeof RuntimeSpec>;

export const EvaluatorSpec = z
  .object({
    kind: z.literal("command"),
    command: Argv,
    reward: z.literal("exit_code").default("exit_code"),
    timeout_s: z.number().positive().max(24 * 3600).default(600),
  })
  .strict();
export type EvaluatorSpec = z.infer<typeof EvaluatorSpec>;

export const CallbackSpec = z
  .object({
    url: z.url({ protocol: /^https?$/ }),
    secret: z.string().min(1),
  })
  .strict();
export type CallbackSpec = z.infer<typeof CallbackSpec>;

/** The task a trainer submits (DESIGN §2). */
export const Task = z
  .object({
    id: Id.optional(),
    group_id: Id.optional(),
    instruction: z.string(),
    agent: AgentSpec,
    runtime: RuntimeSpec.default({ kind: "local", files: {}, prepare: [], image: null }),
    evaluator: EvaluatorSpec.nullable().default(null),
    sampling: SamplingParams.default({}),
    limits: Limits.default({ timeout_s: 1800 }),
    trajectory: z.object({ builder: TrajectoryBuilderName.default("prefix_merging") }).strict().default({ builder: "prefix_merging" }),
    callback: CallbackSpec.nullable().default(null),
    metadata: z.record(z.string(), z.unknown()).default({}),
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

export const TaskError = z.object({ kind: z.string(), message: z.string() });
export type TaskError = z.infer<typeof TaskError>;

/** What a finished rollout produced: in `GET /v1/tasks/:id` and the callback body. */
export const TaskResult = z.object({
  id: z.string(),
  group_id: z.string().nullable(),
  status: TerminalStatus,
  reward: z.number().nullable(),
  evaluation: z.object({ exit_code: z.number().int().nullable(), stdout_tail: z.string() }).nullable(),
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
  agent: z.object({ exit_code: z.number().int().nullable(), signal: z.string().nullable(), log_tail: z.string() }),
  metadata: z.record(z.string(), z.unknown()),
});
export type TaskResult = z.infer<typeof TaskResult>;

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
