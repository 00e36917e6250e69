import { issuesMessage } from "@rollgate/protocol";
import { CallbackJob, QueueName, RolloutJob, duplicateClient, queuePrefix } from "@rollgate/queue";
import type { RedisClient } from "@rollgate/store";
import { DelayedError, UnrecoverableError, Worker, type Job } from "bullmq";
import type { Logger } from "pino";
import type { z } from "zod";
import { CALLBACK_MAX_STALLS, deliverCallback, markDeliveryLost, type CallbackDeps } from "./callbacks.js";
import type { GatewayReadiness } from "./readiness.js";
import { ROLLOUT_MAX_STALLS, onRolloutExhausted, runRollout, type GaveUpKind, type RolloutDeps } from "./rollout.js";

export interface WorkerSetOptions {
  connection: RedisClient;
  keyPrefix: string;
  concurrency: number;
  lockMs: number;
  stalledIntervalMs: number;
  rollout: RolloutDeps;
  callback: CallbackDeps;
  log: Logger;
  /** When given, rollouts are taken only while the gateway is ready; otherwise the queue holds them. */
  readiness?: GatewayReadiness;
}

/** A job whose payload does not match its schema: it fails at once, with the reason, and is not retried. */
export class InvalidJob extends UnrecoverableError {
  override name = "InvalidJob";
}

/**
 * Why BullMQ gave up on a rollout job, from typed facts, never from the error's text: a bad payload
 * (InvalidJob); a job that stalled more than maxStalledCount times, so its workers died (BullMQ's
 * stalled checker marks the job with `deferredFailure`, and the next worker to take it fails it
 * with an UnrecoverableError without running it); else infrastructure (its attempts are used up).
 */
export function gaveUpKind(job: Job | undefined, err: Error): GaveUpKind {
  if (err instanceof InvalidJob) return "invalid_job";
  if (err instanceof UnrecoverableError && job?.deferredFailure) return "worker_lost";
  return "infrastructure";
}

/** The payload of a job as its schema reads it, or InvalidJob naming what is wrong. */
export function parseJob<S extends z.ZodType>(schema: S, queue: string, data: unknown): z.infer<S> {
  const parsed = schema.safeParse(data);
  if (!parsed.success) throw new InvalidJob(`invalid ${queue} job payload: ${issuesMessage(parsed.error)}`);
  return parsed.data;
}


/** How long a rollout taken just as the gateway stopped being ready waits before it is offered again. */
const NOT_READY_DELAY_MS = 1_000;

/**
 * The single owner of every BullMQ Worker in this process: rollouts and callback deliveries.
 * A rollout's lock is renewed by BullMQ while it runs (lockDuration is a visibility window, not a
 * job timeout), so a 30-minute agent keeps its job as long as the event loop is free; a worker
 * that dies stops renewing, and the stalled check hands the job to another worker.
 *
 * With a readiness watcher, the rollout Worker runs only while the gateway is ready: it is paused
 * (running rollouts go on, no new one is taken) when the gateway stops being ready, and resumed
 * when it is ready again. Callback deliveries do not need the engines and always run.
 */
export class WorkerSet {
  readonly rollouts: Worker<RolloutJob>;
  private readonly callbacks: Worker<CallbackJob>;
  private subscriber: RedisClient | null = null;
  private invalidJobs = 0;

  constructor(private readonly o: WorkerSetOptions) {
    this.rollouts = new Worker<RolloutJob>(QueueName.rollouts, (job, token, signal) => this.rollout(job, token, signal), {
      connection: o.connection,
      prefix: queuePrefix(o.keyPrefix, QueueName.rollouts),
      concurrency: o.concurrency,
      lockDuration: o.lockMs,
      stalledInterval: o.stalledIntervalMs,
      // The rollout itself ends a task whose job stalled more than ROLLOUT_MAX_STALLS times (in
      // the job, so no worker death can come between the job's end and the task's); BullMQ fails
      // the job only if the workers doing that keep dying too (then the `failed` handler ends it).
      maxStalledCount: ROLLOUT_MAX_STALLS + 2,
      // With a readiness watcher, the first "ready" starts it.
      autorun: !o.readiness,
    });
    this.callbacks = new Worker<CallbackJob>(
      QueueName.callbacks,
      (job) => deliverCallback(o.callback, { ...job, data: parseJob(CallbackJob, QueueName.callbacks, job.data) } as Job<CallbackJob>),
      {
        connection: o.connection,
        prefix: queuePrefix(o.keyPrefix, QueueName.callbacks),
        concurrency: Math.max(4, o.concurrency),
        // A delivery whose worker died goes to another as soon as a rollout would; sending it again
        // is safe (same delivery id), so it may stall many times before it is given up.
        lockDuration: o.lockMs,
        stalledInterval: o.stalledIntervalMs,
        // deliverCallback gives up a delivery that stalled more than CALLBACK_MAX_STALLS times (in
        // the job); BullMQ fails the job only if the workers doing that keep dying too.
        maxStalledCount: CALLBACK_MAX_STALLS + 2,
      },
    );
    for (const w of [this.rollouts, this.callbacks] as Worker[]) {
      w.on("error", (err) => o.log.warn({ err: err.message, queue: w.name }, "worker error"));
      // A rollout job's id is its task id.
      w.on("stalled", (jobId) => o.log.warn({ queue: w.name, job: jobId, ...(w === this.rollouts ? { task_id: jobId } : {}) }, "job stalled: it goes back to the queue"));
    }
    this.callbacks.on("failed", (job, err) => {
      if (err instanceof InvalidJob) this.noteInvalid(QueueName.callbacks, job, err);
      // Stalled too often (its workers kept dying): deliverCallback never ran to say so, and the
      // delivery must not stay `pending` with nothing left to send it.
      else if (job && gaveUpKind(job, err) === "worker_lost") {
        void markDeliveryLost(o.rollout.tasks, job, `the workers delivering it were lost ${CALLBACK_MAX_STALLS + 3} times: ${err.message}`).catch((e: Error) =>
          o.log.error({ job: job.id, err: e.message }, "cannot mark a lost callback delivery failed"),
        );
      }
    });
    this.rollouts.on("failed", (job, err) => {
      if (err instanceof InvalidJob) this.noteInvalid(QueueName.rollouts, job, err);
      else o.log.warn({ task_id: job?.data.task_id, job: job?.id, err: err.message, attempts: job?.attemptsMade }, "rollout job failed");
      // An unrecoverable failure (a bad payload, a job stalled too often) is never retried either.
      const exhausted = !job || err instanceof UnrecoverableError || job.attemptsMade >= (job.opts.attempts ?? 1);
      // A bad payload may lack the task id: the job id is the task id.
      const taskId = (typeof job?.data?.task_id === "string" ? job.data.task_id : undefined) ?? job?.id;
      if (exhausted && taskId) void onRolloutExhausted(o.rollout, taskId, err, gaveUpKind(job, err)).catch((e: Error) => o.log.error({ task_id: taskId, err: e.message }, "cannot end an exhausted task"));
    });
    o.readiness?.onChange((state) => {
      if (state.ready) void this.rollouts.resume();
      else void this.rollouts.pause(true).catch((err: Error) => o.log.warn({ err: err.message }, "cannot pause the rollout worker"));
    });
  }

  private async rollout(job: Job<RolloutJob>, token: string | undefined, signal: AbortSignal | undefined): Promise<void> {
    parseJob(RolloutJob, QueueName.rollouts, job.data);
    if (this.o.readiness && !this.o.readiness.current.ready && token) {
      // Taken in the moment the gateway stopped being ready: back to the queue, no attempt spent.
      await job.moveToDelayed(Date.now() + NOT_READY_DELAY_MS, token);
      throw new DelayedError();
    }
    return runRollout(this.o.rollout, job, signal);
  }

  private noteInvalid(queue: string, job: Job | undefined, err: Error): void {
    this.invalidJobs++;
    this.o.log.error({ queue, job: job?.id, data: job?.data as unknown, err: err.message, invalid_jobs: this.invalidJobs }, "job with an invalid payload: failed without retries");
  }

  /** Listens for cancel requests (DELETE /v1/tasks/:id) and aborts the rollout if it runs here. */
  async listenForCancels(channel: string): Promise<void> {
    const subscriber = duplicateClient(this.o.connection);
    this.subscriber = subscriber;
    subscriber.on("error", (err: Error) => this.o.log.warn({ err: err.message }, "cancel subscriber error"));
    subscriber.on("message", (_ch: string, taskId: string) => {
      if (this.rollouts.cancelJob(taskId, "cancelled by DELETE /v1/tasks/:id")) this.o.log.info({ task_id: taskId }, "cancelling rollout");
    });
    await subscriber.subscribe(channel);
  }

  async waitUntilReady(): Promise<void> {
    await Promise.all([this.rollouts.waitUntilReady(), this.callbacks.waitUntilReady()]);
  }

  /**
   * Graceful stop: take no new jobs, let running rollouts finish for `graceMs`, then cancel them
   * (each ends as `cancelled` with the reason) and wait for them to record it.
   */
  async close(graceMs: number): Promise<void> {
    this.o.readiness?.stop();
    const closing = Promise.all([this.rollouts.close(), this.callbacks.close()]);
    const timer = setTimeout(() => {
      this.o.log.warn({ graceMs }, "shutdown grace over: cancelling running rollouts");
      this.rollouts.cancelAllJobs("worker shutting down");
    }, graceMs);
    await closing;
    clearTimeout(timer);
    if (this.subscriber) this.subscriber.disconnect();
  }
}
