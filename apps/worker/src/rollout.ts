import { randomUUID } from "node:crypto";
import { isTerminalStatus, type AcceptedTask, type CallbackState, type LostCalls, type Session, type TaskError, type TaskRecord, type TaskResult, type TerminalStatus, type Trajectory } from "@rollgate/protocol";
import type { CallbackJob, RolloutJob } from "@rollgate/queue";
import type { TaskStore } from "@rollgate/store";
import type { Job, Queue } from "bullmq";
import type { Logger } from "pino";
import { evaluate } from "./evaluators.js";
import type { FailureCounter } from "./failure-counter.js";
import { GatewayRefused, type GatewayClient } from "./gateway-client.js";
import { planHarness } from "./harnesses.js";
import { sandboxEnv } from "./sandbox/environment.js";
import { SandboxUnavailable } from "./sandbox/local-runtime.js";
import type { RunResult } from "./sandbox/process.js";
import { NO_LOST_CALLS, type Sandbox, type SandboxRuntime } from "./sandbox/runtime.js";

export interface RolloutDeps {
  tasks: TaskStore;
  gateway: GatewayClient;
  callbacks: Queue<CallbackJob>;
  workerName: string;
  /** One runtime per `runtime.kind` this worker can run. */
  runtimes: Partial<Record<AcceptedTask["runtime"]["kind"], SandboxRuntime>>;
  sandboxPath: string;
  resultTtlSeconds: number;
  log: Logger;
  /** Side work that may fail without failing the rollout: logged and counted. */
  failures: FailureCounter;
  /**
   * How many of the worker's gateway checks got no answer so far (GatewayReadiness.unanswered):
   * rising while an agent without a relay of its own ran means its calls may have been lost
   * where the gateway could not see them. Without it, only the calls the gateway saw count.
   */
  gatewayUnanswered?: () => number;
}

/**
 * The rollout lost an LLM call to infrastructure and this attempt is given up unscored; thrown so
 * BullMQ runs it again after its backoff (the rollout queue's attempts are the retry budget).
 */
export class LostCallRetry extends Error {
  override name = "LostCallRetry";
}

/** What a session's lost calls say, for the task's error and events. */
export function lostCallCause(lost: LostCalls): string {
  const first = lost.first;
  const what = first ? `${first.message} (${first.kind}, answered ${first.status})` : "an LLM call failed outside the policy";
  return `an LLM call was lost to infrastructure: ${what}${lost.count > 1 ? `; ${lost.count} calls lost in all` : ""}`;
}

const LOG_FLUSH_MS = 2_000;

interface Outcome {
  /** Set when the session lost a call before evaluation: the rollout was not evaluated. */
  lost?: LostCalls;
  /** Calls the agent may have lost where the gateway could not see them (unseenLoss). */
  unseen?: LostCalls;
  status: TerminalStatus;
  reward: number | null;
  evaluation: TaskResult["evaluation"];
  error: TaskError | null;
  agent: TaskResult["agent"];
  runMs: number;
  evalMs: number;
  /**
   * A task without an evaluator has nothing to hold back before its session closes: its harness
   * outcome is checked for lost calls and a diverged replay against the closed session instead of
   * a read of its own (one request less); a completed one gets its `evaluating` event then.
   */
  checkAtClose?: true;
}

const NO_AGENT: TaskResult["agent"] = { exit_code: null, signal: null, log_tail: "" };

function agentInfo(run: RunResult): TaskResult["agent"] {
  return { exit_code: run.exitCode, signal: run.signal, log_tail: run.logTail.slice(-16_384) };
}

function cancelReason(signal: AbortSignal | undefined): string {
  const r: unknown = signal?.reason;
  if (typeof r === "string" && r) return r;
  if (r instanceof Error && r.message) return r.message;
  return "the rollout was cancelled";
}

interface SandboxRun {
  task: AcceptedTask;
  sandbox: Sandbox;
  env: Record<string, string>;
  argv: string[];
  signal: AbortSignal | undefined;
  onOutput: (chunk: Buffer) => void;
  sessionId: string;
  /** The session's token: the agent's to call the engines with, never its grader's. */
  token: string;
}

/**
 * The evaluator's environment: the agent's, without the session's token under any name. Code the
 * grader runs (tests of what the agent wrote) would otherwise make LLM calls into the rollout after
 * the agent ended, recorded as its samples; without the token they are refused (401), not lost.
 */
function evaluatorEnv(env: Record<string, string>, token: string): Record<string, string> {
  return Object.fromEntries(Object.entries(env).filter(([, v]) => !v.includes(token)));
}

/**
 * The calls a rollout lost: those the session recorded (the gateway's failures) and those its
 * sandbox's relay could not deliver (the gateway never saw them). Null when there are none.
 */
export function lostCallsOf(session: LostCalls, sandbox: LostCalls): LostCalls | null {
  const count = session.count + sandbox.count;
  if (count === 0) return null;
  const firsts = [session.first, sandbox.first].filter((f) => f !== null);
  firsts.sort((a, b) => a.at.localeCompare(b.at));
  return { count, first: firsts[0] ?? null };
}

/**
 * Reads the session before evaluating: a rollout that lost a call is never scored, and neither is
 * a branch whose agent left the replayed path (it did not start from the source's state).
 */
async function unscoredBeforeEvaluation(deps: RolloutDeps, sessionId: string, sandbox: Sandbox, unseen: LostCalls): Promise<{ lost: LostCalls | null; diverged: Session["replay_diverged"] }> {
  const session = await deps.gateway.session(sessionId);
  return { lost: lostCallsOf(session.lost_calls, sumLost(sandbox.lostCalls(), unseen)), diverged: session.replay_diverged };
}

function sumLost(a: LostCalls, b: LostCalls): LostCalls {
  return lostCallsOf(a, b) ?? NO_LOST_CALLS;
}

/**
 * An agent that reaches the gateway directly (no relay of its own: a local sandbox without a
 * sealed network, a container on the host network) and fails to connect leaves no trace the
 * gateway could record. When the worker itself could not reach the gateway while such an agent
 * ran, its calls may have been lost that way: the attempt is not scored (it runs again).
 */
function unseenLoss(deps: RolloutDeps, sandbox: Sandbox, before: number | undefined): LostCalls {
  if (sandbox.sessionUrl !== null || before === undefined || !deps.gatewayUnanswered) return NO_LOST_CALLS;
  const missed = deps.gatewayUnanswered() - before;
  if (missed <= 0) return NO_LOST_CALLS;
  const message = `the worker could not reach the gateway while the agent ran (${missed} check${missed > 1 ? "s" : ""} unanswered): its LLM calls may have been lost before the gateway saw them`;
  return { count: 1, first: { at: new Date().toISOString(), kind: "gateway_unreachable", status: 0, message } };
}

/** Prepare, harness and evaluator: everything that happens inside the sandbox. */
async function runInSandbox(deps: RolloutDeps, r: SandboxRun): Promise<Outcome> {
  const { task, sandbox, env, signal } = r;
  const started = Date.now();
  const unansweredBefore = deps.gatewayUnanswered?.();
  const deadline = started + task.limits.timeout_s * 1000;
  const run = (argv: string[]) =>
    sandbox.exec(argv, { env, timeoutMs: Math.max(1, deadline - Date.now()), onOutput: r.onOutput, ...(signal ? { signal } : {}) });
  let stage: "prepare" | "harness" = "prepare";
  let last: RunResult | null = null;
  for (const argv of task.runtime.prepare) {
    last = await run(argv);
    if (last.timedOut || last.aborted || last.spawnError || last.exitCode !== 0) break;
  }
  const prepareOk = !last || (!last.timedOut && !last.aborted && !last.spawnError && last.exitCode === 0);
  if (prepareOk) {
    stage = "harness";
    last = await run(r.argv);
  }
  const result = last!;
  const runMs = Date.now() - started;
  const unseen = unseenLoss(deps, sandbox, unansweredBefore);
  const limits = (await sandbox.limitsReached?.().catch(() => [])) ?? [];
  const agent = limits.length > 0 ? { ...agentInfo(result), limits_reached: limits } : agentInfo(result);
  const base = { agent, runMs, evalMs: 0, evaluation: null, reward: null, ...(unseen.count > 0 ? { unseen } : {}) };
  if (result.aborted) return { ...base, status: "cancelled", error: { kind: "cancelled", message: cancelReason(signal) } };
  const evaluated = task.evaluator !== null && task.evaluator.kind !== "none";
  const checked = stage === "harness" && !evaluated ? ({ checkAtClose: true } as const) : {};
  // After the harness, before anything is scored: an agent that lost a call to infrastructure did
  // not show what the policy does (a timeout it ran into while the engine was away included).
  if (stage === "harness" && evaluated) {
    const { lost, diverged } = await unscoredBeforeEvaluation(deps, r.sessionId, sandbox, unseen);
    if (lost) return { ...base, lost, status: "failed", error: { kind: "infrastructure", message: lostCallCause(lost) } };
    if (diverged) return { ...base, status: "failed", error: { kind: "replay_diverged", call: diverged.call, message: `call ${diverged.call}: ${diverged.message}` } };
  }
  if (result.timedOut) {
    return { ...base, ...checked, status: "timed_out", error: { kind: "timeout", message: `${stage} exceeded limits.timeout_s (${task.limits.timeout_s}s)` } };
  }
  if (result.spawnError) {
    const what = stage === "harness" ? r.argv[0] : "a prepare step";
    return { ...base, ...checked, status: "failed", error: { kind: `${stage}_missing`, message: `cannot start ${what}: ${result.spawnError}` } };
  }
  if (stage === "prepare") {
    return { ...base, status: "failed", error: { kind: "prepare_failed", message: `a prepare step exited with ${result.exitCode ?? result.signal}` } };
  }
  // Nothing to score (evaluate() would answer a null reward): completed, checked once the session closed.
  if (!evaluated) return { ...base, ...checked, status: "completed", error: null };

  // An agent that exits non-zero is still evaluated (docs/data-model.md#outcomes): its exit code is in agent.exit_code.
  // Fenced on this attempt's session: an attempt taken over while it ran writes no event.
  await deps.tasks.appendAttemptEvent(task.id, r.sessionId, "evaluating", { agent_exit_code: result.exitCode });
  // Nothing the agent left running may write while the evaluator reads (a daemon rewriting reward.json).
  await sandbox.stopLeftovers?.();
  const evalStart = Date.now();
  const ev = await evaluate(task.evaluator, {
    sandbox,
    env: evaluatorEnv(env, r.token),
    ...(signal ? { signal } : {}),
    summary: () => ({
      id: task.id,
      group_id: task.group_id ?? null,
      instruction: task.instruction,
      session_id: r.sessionId,
      agent: base.agent,
      metadata: task.metadata,
    }),
  });
  const evalMs = Date.now() - evalStart;
  if (ev.kind === "cancelled") return { ...base, evalMs, evaluation: ev.evaluation, status: "cancelled", error: { kind: "cancelled", message: cancelReason(signal) } };
  if (ev.kind === "broken") return { ...base, evalMs, evaluation: ev.evaluation, status: "failed", error: ev.error };
  return { ...base, evalMs, evaluation: ev.evaluation, status: "completed", error: null, reward: ev.reward };
}

/** How many times a rollout job may lose its worker (stall) before its task ends `failed` (worker_lost). */
export const ROLLOUT_MAX_STALLS = 2;

/**
 * One rollout job (docs/architecture.md#the-life-of-a-task): open a session, run the agent in fresh sandbox folders, evaluate,
 * close the session, build the trajectory, store the result, queue the callback. Infrastructure
 * failures throw so BullMQ retries with backoff: the gateway unreachable or failing, and a
 * session that lost an LLM call (never scored; its session is closed and the next attempt opens a
 * fresh one). Agent and evaluator outcomes are results and are never retried; a gateway that
 * refuses a request (4xx) fails the task at once. A job that runs out of attempts ends the task as
 * `failed` (onRolloutExhausted; a lost call on the last attempt ends it here).
 */
export async function runRollout(deps: RolloutDeps, job: Job<RolloutJob>, signal?: AbortSignal): Promise<void> {
  // Every line about this rollout carries its task id (and the BullMQ job and attempt).
  deps = { ...deps, log: deps.log.child({ task_id: job.data.task_id, job_id: job.id, job_attempt: job.attemptsMade + 1 }) };
  const found = await deps.tasks.getForRun(job.data.task_id);
  if (!found) {
    deps.log.warn("rollout job for an unknown task: dropped");
    return;
  }
  const { record, cancelRequested: cancel } = found;
  // Ended already (a cancel before start, or a worker that died after storing the result): only
  // what follows the result may be missing.
  if (isTerminalStatus(record.status)) {
    await queueFollowUps(deps, record.task as AcceptedTask, record.callback);
    return;
  }
  if (cancel) {
    // Cancelled while its last attempt's worker was gone (dead, or stalled past its job lock):
    // that attempt's session would stay open, its agent free to write into it.
    await closeLeftSession(deps, record, "closing the session of a cancelled task's orphaned attempt");
    await finishTask(deps, record, record.attempts, record.session_id, { ...failedOutcome("cancelled", cancel), status: "cancelled" }, null);
    return;
  }
  // Its workers kept dying (or stalling past their job locks) on it: it ends `failed`
  // (worker_lost) here, in the job, instead of looping. Ended by BullMQ (maxStalledCount), it
  // would be ended by a `failed` handler after the job was marked failed, and a worker killed in
  // between would leave it `running` with no job left to end it (BullMQ's own limit stays above
  // this one, as a last resort: see WorkerSet).
  if (job.stalledCounter > ROLLOUT_MAX_STALLS) {
    await onRolloutExhausted(deps, record.id, new Error(`its workers were lost ${job.stalledCounter} times (the job stalled more than ${ROLLOUT_MAX_STALLS} times)`), "worker_lost");
    return;
  }
  // A task found `running` was started by a worker whose job lock lapsed: dead, or only stalled
  // and still running it. The task is taken back first (queued again, which fences that attempt
  // out: it can no longer store a result or requeue the task), then its session is closed so an
  // orphaned agent cannot keep writing into it, and this attempt opens a fresh one.
  if (record.status === "running" && record.session_id) {
    const orphan = record.session_id;
    const taken = await deps.tasks.requeue(record.id, orphan, { reason: "worker_lost", previous_worker: record.worker, previous_session: orphan });
    await closeSessionLeft(deps, orphan, "closing an orphaned session");
    if (!taken) {
      // The old attempt ended it (or another took it) in between: whatever follows its result.
      const now = await deps.tasks.get(record.id);
      if (now && isTerminalStatus(now.status)) await queueFollowUps(deps, now.task as AcceptedTask, now.callback);
      else deps.log.warn({ status: now?.status, session_id: now?.session_id }, "the task is no longer the orphaned attempt's: left as it is");
      return;
    }
  }
  // A task queued again whose last attempt had a session: that session is closed before this
  // attempt opens its own. Whoever queued it again closed it right after, unless it died in
  // between (a worker that took an orphaned attempt back, one whose session open failed).
  if (record.status === "queued" && record.session_id) await closeSessionLeft(deps, record.session_id, "closing the session of the previous attempt");
  const attempt: Attempt = { number: record.attempts + 1, last: job.attemptsMade + 1 >= (job.opts.attempts ?? 1), sessionId: null, opened: false, running: false };
  try {
    await attemptRollout(deps, record, attempt, signal);
  } catch (err) {
    // A lost call's attempt was given back already (endLostAttempt).
    if (err instanceof LostCallRetry) throw err;
    if (!(err instanceof GatewayRefused)) {
      if (attempt.last) await endLastAttempt(deps, record, attempt, err as Error);
      else await giveBackAttempt(deps, record, attempt, err as Error);
      throw err;
    }
    // The same request would be refused again: the task fails now, saying what the gateway said.
    deps.log.warn({ status: err.status, code: err.code, err: err.message }, "the gateway refused a request: the task fails");
    const sid = attempt.sessionId;
    if (sid) await closeSessionLeft(deps, sid, "closing the session of a refused rollout");
    await finishTask(deps, record, attempt.number, attempt.opened ? sid : null, failedOutcome("gateway_refused", err.message), null, undefined, null, attempt.running ? sid : null);
  }
}

/**
 * An attempt failed on infrastructure within the retry budget (it throws on, so BullMQ runs the job
 * again after its backoff): the task goes back to queued now, saying why, and its session is
 * closed (the open may have reached the gateway even when its answer did not come back). Left
 * running, the next run would take it back as if its worker had been lost.
 */
async function giveBackAttempt(deps: RolloutDeps, record: TaskRecord, attempt: Attempt, err: Error): Promise<void> {
  const sid = attempt.sessionId;
  if (!sid || !attempt.running) return;
  await deps.failures.run(deps.log, "putting back a task whose attempt failed", async () => {
    await deps.tasks.requeue(record.id, sid, { reason: "infrastructure", cause: err.message, attempt: attempt.number, session_id: sid });
    await closeSessionLeft(deps, sid, "closing the session of a failed attempt");
  });
}

/**
 * The job's last attempt failed on infrastructure (it throws on, so BullMQ records the job failed):
 * the task ends `failed` (`infrastructure`) here, in the job, its session closed. Left to the
 * `failed` handler, which runs after the job is marked failed, a worker killed in between would
 * leave the task `running` with no job left to end it; killed here, the job stalls and runs again.
 * A failure here is logged, and the handler tries again.
 */
async function endLastAttempt(deps: RolloutDeps, record: TaskRecord, attempt: Attempt, err: Error): Promise<void> {
  const sid = attempt.sessionId;
  await deps.failures.run(deps.log, "ending a task whose last attempt failed", async () => {
    if (sid) await closeSessionLeft(deps, sid, "closing the session of a failed last attempt");
    await finishTask(deps, record, attempt.number, attempt.opened ? sid : null, failedOutcome("infrastructure", err.message), null, undefined, null, attempt.running ? sid : null);
  });
}

function failedOutcome(kind: string, message: string): Outcome {
  return { status: "failed", reward: null, evaluation: null, error: { kind, message }, agent: NO_AGENT, runMs: 0, evalMs: 0 };
}

/** What a rollout task's `error.kind` says when BullMQ gives up on its job (docs/data-model.md#outcomes). */
export type GaveUpKind = "invalid_job" | "worker_lost" | "infrastructure";

/** BullMQ gave up on the job (attempts used up, or stalled too often): the task must not stay `running`. */
export async function onRolloutExhausted(deps: RolloutDeps, taskId: string, err: Error, kind: GaveUpKind): Promise<void> {
  deps = { ...deps, log: deps.log.child({ task_id: taskId }) };
  const record = await deps.tasks.get(taskId);
  if (!record) return;
  if (isTerminalStatus(record.status)) {
    await queueFollowUps(deps, record.task as AcceptedTask, record.callback);
    return;
  }
  // Given up after its worker was lost again: that attempt's session was never closed.
  await closeLeftSession(deps, record, "closing the session of an attempt given up on");
  await finishTask(deps, record, record.attempts, record.session_id, failedOutcome(kind, err.message), null);
}

/**
 * Closes the session of a task's last attempt, which that attempt may have left open (its worker
 * died or stalled before closing it, or died between taking an orphaned attempt back and closing
 * its session). Earlier attempts' sessions were closed before the next attempt opened its own.
 * Quiet: a failure is logged; closing a closed session changes nothing.
 */
async function closeLeftSession(deps: RolloutDeps, record: TaskRecord, why: string): Promise<void> {
  if (record.session_id) await closeSessionLeft(deps, record.session_id, why);
}

/**
 * Closes a session an attempt may have left open. Quiet: a failure is logged; closing a closed
 * session changes nothing, and one the gateway does not know (404) was never opened (its attempt
 * was marked running and its worker died before the open reached the gateway): nothing to close.
 */
async function closeSessionLeft(deps: RolloutDeps, sessionId: string, why: string): Promise<void> {
  await deps.failures.run(deps.log.child({ session_id: sessionId }), why, async () => {
    try {
      await deps.gateway.closeSession(sessionId);
    } catch (err) {
      if (!(err instanceof GatewayRefused && err.status === 404)) throw err;
    }
  });
}

interface Attempt {
  /** 1 for the first attempt. */
  number: number;
  /** The retry budget is spent: a lost call ends the task instead of being retried. */
  last: boolean;
  /** The session of this attempt, once it was marked running on it (it is opened after that). */
  sessionId: string | null;
  /** The gateway answered the open of that session. */
  opened: boolean;
  /** The task was marked running on this attempt's session: what it stores is fenced on that session. */
  running: boolean;
}

async function attemptRollout(deps: RolloutDeps, record: TaskRecord, attempt: Attempt, signal?: AbortSignal) {
  const task = record.task as AcceptedTask;
  const runtime = deps.runtimes[task.runtime.kind];
  if (!runtime) {
    await finishTask(deps, record, attempt.number, null, failedOutcome("sandbox_unavailable", `this worker cannot run runtime.kind ${task.runtime.kind}`), null);
    return;
  }
  // The session's id is chosen here and the task marked running on it before the session is
  // opened: a worker that dies anywhere after the open reached the gateway (even before its answer
  // came back) leaves a task `running` on that session, which the next worker takes back and
  // whose session it closes. Opened first, a session would be nobody's to close.
  const sessionId = `s-${randomUUID()}`;
  deps = { ...deps, log: deps.log.child({ session_id: sessionId }) };
  const started = await deps.tasks.markRunning(task.id, { worker: deps.workerName, attempt: attempt.number, sessionId, now: new Date() });
  if (!started) {
    // Cancelled (or otherwise ended) while this worker was picking it up, or running under
    // another attempt that took it while this one stalled: leave it as it is.
    deps.log.info("the task ended or was taken over before it started: left as it is");
    return;
  }
  attempt.sessionId = sessionId;
  attempt.running = true;
  let session: Awaited<ReturnType<typeof openAttemptSession>>;
  try {
    session = await openAttemptSession(deps, task, attempt, sessionId);
  } catch (err) {
    // This worker stalled between marking the task running and opening its session, long enough
    // for another worker to take the task over and close the session id it had never seen opened:
    // the gateway refuses to open it now. The task is the other attempt's; this one stops here.
    if (err instanceof GatewayRefused && err.status === 409 && (await deps.tasks.get(task.id))?.session_id !== sessionId) {
      deps.log.warn({ err: err.message }, "this attempt was taken over before it opened its session: it stops, leaving the task to the other attempt");
      return;
    }
    throw err;
  }
  attempt.opened = true;
  const closeQuietly = (why: string) => deps.failures.run(deps.log, why, () => deps.gateway.closeSession(session.id));
  deps.log.info({ attempt: attempt.number, harness: task.agent.harness, runtime: task.runtime.kind }, "rollout started");
  let sandbox: Sandbox;
  try {
    // The token lets a pod runtime put it in a per-pod Secret; the timeout caps a pod's lifetime.
    sandbox = await runtime.create(task.id, task.runtime, {
      session: { id: session.id, url: session.base_url },
      sessionToken: session.token,
      timeoutS: task.limits.timeout_s,
    });
  } catch (err) {
    // A sandbox that cannot start is the rollout's failure, not a retry: it would fail again.
    if (!(err instanceof SandboxUnavailable)) throw err;
    await closeQuietly("closing the session of a sandbox that did not start");
    await finishTask(deps, record, attempt.number, session.id, failedOutcome("sandbox_unavailable", err.message), null, undefined, null, session.id);
    return;
  }
  let logs = "";
  let lastFlush = 0;
  // Only output not stored yet is written (an agent that printed nothing costs no write; the logs
  // route answers "" either way).
  let stored = "";
  const flushLogs = async () => {
    if (logs === stored) return;
    const text = logs;
    await deps.failures.run(deps.log, "storing the agent's output", () => deps.tasks.setLogs(task.id, text, session.id));
    stored = text;
  };
  const onOutput = (chunk: Buffer) => {
    logs = (logs + chunk.toString("utf8")).slice(-256 * 1024);
    if (Date.now() - lastFlush > LOG_FLUSH_MS) {
      lastFlush = Date.now();
      void flushLogs();
    }
  };
  let outcome: Outcome;
  try {
    // A sealed sandbox reaches its session through its relay, at the URL the runtime says.
    const sessionUrl = sandbox.sessionUrl ?? session.base_url;
    const plan = planHarness(task.agent, { instruction: task.instruction, sessionUrl, token: session.token });
    await sandbox.writeHomeFiles(plan.homeFiles);
    const env = sandboxEnv({
      sessionUrl,
      token: session.token,
      sessionId: session.id,
      taskId: task.id,
      instruction: task.instruction,
      home: sandbox.home,
      tmp: sandbox.tmp,
      path: deps.sandboxPath,
      harnessEnv: plan.env,
      agentEnv: task.agent.env,
    });
    outcome = await runInSandbox(deps, { task, sandbox, env, argv: plan.argv, signal, onOutput, sessionId: session.id, token: session.token });
  } finally {
    await flushLogs();
    if (task.runtime.keep) deps.log.info({ sandbox: sandbox.describe() }, "runtime.keep: sandbox kept");
    await sandbox.destroy();
  }
  // The trajectory comes with the close (one request): unused when the attempt turns out lost.
  const state = await deps.gateway.closeSession(session.id, task.trajectory.builder);
  // A call lost before or during evaluation: this attempt shows nothing about the policy.
  const lost = outcome.status === "cancelled" ? null : (outcome.lost ?? lostCallsOf(state.lost_calls, sumLost(sandbox.lostCalls(), outcome.unseen ?? NO_LOST_CALLS)));
  if (lost) {
    await endLostAttempt(deps, record, attempt, session.id, { ...outcome, lost }, state.counts);
    return;
  }
  /** A completed rollout without an evaluator: its `evaluating` event, written with its result. */
  let evaluating: TaskEventBefore | null = null;
  if (outcome.checkAtClose && outcome.status !== "cancelled") {
    const diverged = state.replay_diverged;
    if (diverged) outcome = { ...outcome, status: "failed", error: { kind: "replay_diverged", call: diverged.call, message: `call ${diverged.call}: ${diverged.message}` } };
    else if (outcome.status === "completed") evaluating = { type: "evaluating", data: { agent_exit_code: outcome.agent.exit_code } };
  }
  const invalid = state.trajectory_error;
  // An invalid trajectory must not pass as a good one: the task fails and says why.
  if (invalid) outcome = { ...outcome, status: "failed", reward: null, error: { kind: "trajectory_invalid", message: `${invalid.type}: ${invalid.message}` } };
  // A gateway that does not know `?trajectory=` answered the session alone: asked the old way.
  const trajectory = invalid ? null : (state.trajectory ?? (await deps.gateway.trajectory(session.id, task.trajectory.builder)));
  await finishTask(deps, record, attempt.number, session.id, outcome, trajectory, state.counts, evaluating, session.id);
}

/**
 * Opens the session the task was marked running on, under the id it was marked with. A failure
 * throws (the open may have reached the gateway and only its answer been lost: runRollout closes
 * the session either way).
 */
function openAttemptSession(deps: RolloutDeps, task: AcceptedTask, attempt: Attempt, sessionId: string) {
  return deps.gateway.openSession({
    id: sessionId,
    sampling: task.sampling,
    limits: {
      ...(task.limits.max_llm_calls ? { max_llm_calls: task.limits.max_llm_calls } : {}),
      ...(task.limits.max_total_tokens ? { max_total_tokens: task.limits.max_total_tokens } : {}),
    },
    ...(task.agent.model ? { model: task.agent.model } : {}),
    ...(task.group_id ? { affinity_key: task.group_id } : {}),
    ...(task.branch ? { replay: { session_id: task.branch.session_id, calls: task.branch.at_call, train: task.branch.train_replayed } } : {}),
    metadata: { task_id: task.id, attempt: attempt.number },
  });
}

/** An event stored in the same step as the task's result, just before its terminal event. */
type TaskEventBefore = NonNullable<Parameters<TaskStore["finish"]>[5]>;

/**
 * An attempt that lost an LLM call is never scored. Within the retry budget the task goes back to
 * the queue (its closed session stays on record; the next attempt opens a fresh one) and the job
 * fails so BullMQ runs it again after its backoff; on the last attempt the task ends `failed`
 * with `error.kind: "infrastructure"` and the cause, `reward: null`.
 */
async function endLostAttempt(deps: RolloutDeps, record: TaskRecord, attempt: Attempt, sessionId: string, o: Outcome & { lost: LostCalls }, usage: TaskResult["usage"]) {
  const cause = lostCallCause(o.lost);
  if (!attempt.last) {
    const requeued = await deps.tasks.requeue(record.id, sessionId, { reason: "lost_call", cause, attempt: attempt.number, session_id: sessionId, lost_calls: o.lost.count });
    if (requeued) {
      deps.log.warn({ attempt: attempt.number, lost_calls: o.lost }, "rollout lost an LLM call: not scored; it runs again");
      throw new LostCallRetry(cause);
    }
  }
  const failed: Outcome = { ...o, status: "failed", reward: null, evaluation: null, error: { kind: "infrastructure", message: cause } };
  await finishTask(deps, record, attempt.number, sessionId, failed, null, usage, null, sessionId);
}

async function finishTask(
  deps: RolloutDeps,
  record: TaskRecord,
  attempt: number,
  sessionId: string | null,
  o: Outcome,
  trajectory: Trajectory | null,
  usage: TaskResult["usage"] = { llm_calls: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0 },
  before: TaskEventBefore | null = null,
  /** The session of the attempt storing this result (fenced: see TaskStore.finish); null for results no attempt ran. */
  attemptSession: string | null = null,
) {
  const task = record.task as AcceptedTask;
  const now = new Date();
  const created = Date.parse(record.created_at);
  const total = Math.max(0, now.getTime() - created);
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
    timings: { queued_ms: Math.max(0, total - o.runMs - o.evalMs), run_ms: o.runMs, eval_ms: o.evalMs, total_ms: total },
    attempts: attempt,
    worker: deps.workerName,
    agent: o.agent,
    metadata: task.metadata,
  };
  const callback: CallbackState | null = task.callback
    ? { state: "pending", delivery_id: randomUUID(), attempts: 0, last_error: null, delivered_at: null }
    : null;
  const stored = await deps.tasks.finish(task.id, result, now, deps.resultTtlSeconds, callback, before, attemptSession);
  if (!stored) {
    const current = await deps.tasks.get(task.id);
    // Someone else ended it first (a cancel of a queued task): one result only, but what follows
    // it may still be this worker's to queue (the canceller re-queued a job this one already held).
    if (current && isTerminalStatus(current.status)) await queueFollowUps(deps, task, current.callback);
    // Not ended: another attempt took the task over while this one ran (this job's lock lapsed).
    // Its result is not the task's, nor does it count the task as ended in its group.
    else deps.log.warn({ status: result.status, current_session: current?.session_id ?? null }, "this attempt was taken over by another attempt (its job lock lapsed): its result is dropped");
    return;
  }
  deps.log.info({ status: result.status, reward: result.reward, error: result.error?.kind }, "rollout finished");
  await queueFollowUps(deps, task, callback);
  // The task index would otherwise keep every task ever submitted (records expire, entries did not).
  await deps.failures.run(deps.log, "pruning the task index", () => deps.tasks.pruneIndex(deps.resultTtlSeconds, now));
}

/**
 * What follows a terminal result: its callback delivery (when one is pending) and, once the whole
 * group has ended, the group's. Idempotent (fixed job ids, a group counts each task once), so a
 * job run again after its worker died mid-way, or one the gateway re-queued for a task it
 * cancelled, sends what the first run could not.
 */
export async function queueFollowUps(deps: RolloutDeps, task: AcceptedTask, callback: CallbackState | null): Promise<void> {
  if (task.callback && callback?.state === "pending" && callback.delivery_id) {
    await deps.callbacks.add("deliver", { task_id: task.id, delivery_id: callback.delivery_id }, { jobId: callback.delivery_id });
  }
  const groupDelivery = task.group_id ? await deps.tasks.groupTaskFinished(task.group_id, task.id, deps.resultTtlSeconds) : null;
  if (task.group_id && groupDelivery) {
    const deliveryId = groupDelivery;
    await deps.callbacks.add("deliver-group", { group_id: task.group_id, delivery_id: deliveryId }, { jobId: deliveryId });
  }
}
