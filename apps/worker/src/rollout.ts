import { randomUUID } from "node:crypto";
import type { AcceptedTask, TaskError, TaskRecord, TaskResult, TerminalStatus, Trajectory } from "@rollgate/protocol";
import type { CallbackJob, RolloutJob } from "@rollgate/queue";
import type { TaskStore } from "@rollgate/store";
import { UnrecoverableError, type Job, type Queue } from "bullmq";
import type { Logger } from "pino";
import { GatewayUnavailable, type GatewayClient } from "./gateway-client.js";
import { runProcess, type RunResult } from "./sandbox/process.js";
import { sandboxEnv } from "./sandbox/environment.js";
import { makeWorkdir, removeWorkdir } from "./sandbox/workdir.js";

export interface RolloutDeps {
  tasks: TaskStore;
  gateway: GatewayClient;
  callbacks: Queue<CallbackJob>;
  workerName: string;
  sandboxRoot: string | undefined;
  sandboxPath: string;
  resultTtlSeconds: number;
  log: Logger;
}

const TERMINAL = new Set(["completed", "failed", "timed_out", "cancelled"]);

interface Outcome {
  status: TerminalStatus;
  reward: number | null;
  evaluation: TaskResult["evaluation"];
  error: TaskError | null;
  agent: TaskResult["agent"];
  runMs: number;
  evalMs: number;
}

/** Runs prepare steps and the harness under one deadline (limits.timeout_s). */
async function runAgent(task: AcceptedTask, workdir: string, env: Record<string, string>, signal: AbortSignal | undefined) {
  const deadline = Date.now() + task.limits.timeout_s * 1000;
  for (const argv of task.runtime.prepare) {
    const r = await runProcess({ argv, cwd: workdir, env, timeoutMs: Math.max(1, deadline - Date.now()), ...(signal ? { signal } : {}) });
    if (r.timedOut || r.aborted || r.spawnError || r.exitCode !== 0) return { stage: "prepare" as const, run: r, argv };
  }
  const argv = [...task.agent.command, ...task.agent.args];
  const run = await runProcess({ argv, cwd: workdir, env, timeoutMs: Math.max(1, deadline - Date.now()), ...(signal ? { signal } : {}) });
  return { stage: "harness" as const, run, argv };
}

function agentInfo(run: RunResult): TaskResult["agent"] {
  return { exit_code: run.exitCode, signal: run.signal, log_tail: run.logTail.slice(-16_384) };
}

/** Prepare, run the harness, evaluate: everything that happens inside the sandbox. */
async function runInSandbox(task: AcceptedTask, workdir: string, env: Record<string, string>, signal?: AbortSignal): Promise<Outcome> {
  const started = Date.now();
  const { stage, run, argv } = await runAgent(task, workdir, env, signal);
  const runMs = Date.now() - started;
  const base = { agent: agentInfo(run), runMs, evalMs: 0, evaluation: null, reward: null };
  if (run.aborted) return { ...base, status: "cancelled", error: { kind: "cancelled", message: "the rollout was cancelled" } };
  if (run.timedOut) {
    return { ...base, status: "timed_out", error: { kind: "timeout", message: `${stage} exceeded limits.timeout_s (${task.limits.timeout_s}s)` } };
  }
  if (run.spawnError) {
    return { ...base, status: "failed", error: { kind: `${stage}_missing`, message: `cannot start ${argv[0]}: ${run.spawnError}` } };
  }
  if (stage === "prepare") {
    return { ...base, status: "failed", error: { kind: "prepare_failed", message: `${argv.join(" ")} exited with ${run.exitCode ?? run.signal}` } };
  }
  if (!task.evaluator) return { ...base, status: "completed", error: null };

  // An agent that exits non-zero is still evaluated (DESIGN §2): its exit code is in agent.exit_code.
  const evalStart = Date.now();
  const ev = await runProcess({ argv: task.evaluator.command, cwd: workdir, env, timeoutMs: task.evaluator.timeout_s * 1000, ...(signal ? { signal } : {}) });
  const evalMs = Date.now() - evalStart;
  const evaluation = { exit_code: ev.exitCode, stdout_tail: ev.logTail.slice(-4_096) };
  if (ev.aborted) return { ...base, evalMs, evaluation, status: "cancelled", error: { kind: "cancelled", message: "the rollout was cancelled" } };
  if (ev.spawnError || ev.timedOut || ev.exitCode === null) {
    const why = ev.spawnError ?? (ev.timedOut ? `timed out after ${task.evaluator.timeout_s}s` : `killed by ${ev.signal}`);
    return { ...base, evalMs, evaluation, status: "failed", error: { kind: "evaluator_error", message: `evaluator could not score: ${why}` } };
  }
  return { ...base, evalMs, evaluation, status: "completed", error: null, reward: ev.exitCode === 0 ? 1 : 0 };
}

function emptyUsage(): TaskResult["usage"] {
  return { llm_calls: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0 };
}

/**
 * One rollout job (DESIGN §1): open a session, run the agent in a fresh working directory,
 * evaluate, close the session, build the trajectory, store the result, queue the callback.
 * Infrastructure failures throw (BullMQ retries with backoff); agent and evaluator outcomes are
 * results and never retried.
 */
export async function runRollout(deps: RolloutDeps, job: Job<RolloutJob>, signal?: AbortSignal): Promise<void> {
  const record = await deps.tasks.get(job.data.task_id);
  if (!record) {
    deps.log.warn({ task: job.data.task_id }, "rollout job for an unknown task: dropped");
    return;
  }
  if (TERMINAL.has(record.status)) return;
  const attempt = job.attemptsMade + 1;
  const lastAttempt = attempt >= (job.opts.attempts ?? 1);
  try {
    await attemptRollout(deps, record, attempt, signal);
  } catch (err) {
    if (!(err instanceof GatewayUnavailable) || lastAttempt) {
      await finishTask(deps, record, attempt, null, {
        status: "failed",
        reward: null,
        evaluation: null,
        error: { kind: err instanceof GatewayUnavailable ? "infrastructure" : "internal", message: (err as Error).message },
        agent: { exit_code: null, signal: null, log_tail: "" },
        runMs: 0,
        evalMs: 0,
      }, null, emptyUsage());
      if (err instanceof GatewayUnavailable) return;
      throw new UnrecoverableError((err as Error).message);
    }
    throw err;
  }
}

async function attemptRollout(deps: RolloutDeps, record: TaskRecord, attempt: number, signal?: AbortSignal) {
  const task = record.task as AcceptedTask;
  const session = await deps.gateway.openSession({
    sampling: task.sampling,
    limits: {
      ...(task.limits.max_llm_calls ? { max_llm_calls: task.limits.max_llm_calls } : {}),
      ...(task.limits.max_total_tokens ? { max_total_tokens: task.limits.max_total_tokens } : {}),
    },
    ...(task.agent.model ? { model: task.agent.model } : {}),
    ...(task.group_id ? { affinity_key: task.group_id } : {}),
    metadata: { task_id: task.id, attempt },
  });
  await deps.tasks.markRunning(task.id, { worker: deps.workerName, attempt, sessionId: session.id, now: new Date() });
  const workdir = await makeWorkdir(deps.sandboxRoot, task.id, task.runtime.files);
  let outcome: Outcome;
  try {
    const env = sandboxEnv({
      sessionUrl: session.base_url,
      token: session.token,
      sessionId: session.id,
      taskId: task.id,
      instruction: task.instruction,
      workdir,
      path: deps.sandboxPath,
      agentEnv: task.agent.env,
    });
    outcome = await runInSandbox(task, workdir, env, signal);
  } finally {
    await removeWorkdir(workdir).catch(() => undefined);
  }
  await deps.gateway.closeSession(session.id);
  const [state, trajectory] = await Promise.all([
    deps.gateway.session(session.id),
    deps.gateway.trajectory(session.id, task.trajectory.builder).catch((err: Error) => {
      // An invalid trajectory must not pass as a good one: the task fails and says why.
      if (err instanceof GatewayUnavailable && /trajectory_invalid/.test(err.message)) return err;
      throw err;
    }),
  ]);
  if (trajectory instanceof Error) {
    outcome = { ...outcome, status: "failed", error: { kind: "trajectory_invalid", message: trajectory.message } };
  }
  const traj = trajectory instanceof Error ? null : trajectory;
  await finishTask(deps, record, attempt, session.id, outcome, traj, state.counts);
}

async function finishTask(
  deps: RolloutDeps,
  record: TaskRecord,
  attempt: number,
  sessionId: string | null,
  o: Outcome,
  trajectory: Trajectory | null,
  usage: TaskResult["usage"],
) {
  const task = record.task as AcceptedTask;
  const now = new Date();
  const created = Date.parse(record.created_at);
  const started = record.started_at ? Date.parse(record.started_at) : now.getTime() - o.runMs - o.evalMs;
  const result: TaskResult = {
    id: task.id,
    group_id: task.group_id ?? null,
    status: o.status,
    reward: o.reward,
    evaluation: o.evaluation,
    error: o.error,
    session_id: sessionId,
    trajectory,
    usage,
    timings: {
      queued_ms: Math.max(0, started - created),
      run_ms: o.runMs,
      eval_ms: o.evalMs,
      total_ms: Math.max(0, now.getTime() - created),
    },
    attempts: attempt,
    worker: deps.workerName,
    agent: o.agent,
    metadata: task.metadata,
  };
  await deps.tasks.finish(task.id, result, now, deps.resultTtlSeconds);
  deps.log.info({ task: task.id, status: result.status, reward: result.reward }, "rollout finished");
  if (task.callback) {
    const deliveryId = randomUUID();
    await deps.tasks.setCallback(task.id, { state: "pending", delivery_id: deliveryId, attempts: 0, last_error: null, delivered_at: null });
    await deps.callbacks.add("deliver", { task_id: task.id, delivery_id: deliveryId }, { jobId: deliveryId });
  }
}
