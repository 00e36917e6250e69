import { Worker } from "bullmq";
import { QueueName, duplicateClient, queuePrefix, type CallbackJob, type RedisClient, type RolloutJob } from "@rollgate/queue";
import type { Logger } from "pino";
import { deliverCallback, type CallbackDeps } from "./callbacks.js";
import { onRolloutExhausted, runRollout, type RolloutDeps } from "./rollout.js";

export interface WorkerSetOptions {
  connection: RedisClient;
  keyPrefix: string;
  concurrency: number;
  lockMs: number;
  stalledIntervalMs: number;
  rollout: RolloutDeps;
  callback: CallbackDeps;
  log: Logger;
}

/**
 * The single owner of every BullMQ Worker in this process: rollouts and callback deliveries.
 * A rollout's lock is renewed by BullMQ while it runs (lockDuration is a visibility window, not a
 * job timeout), so a 30-minute agent keeps its job as long as the event loop is free; a worker
 * that dies stops renewing, and the stalled check hands the job to another worker.
 */
export class WorkerSet {
  readonly rollouts: Worker<RolloutJob>;
  private readonly callbacks: Worker<CallbackJob>;
  private subscriber: RedisClient | null = null;

  constructor(private readonly o: WorkerSetOptions) {
    this.rollouts = new Worker<RolloutJob>(QueueName.rollouts, (job, _token, signal) => runRollout(o.rollout, job, signal), {
      connection: o.connection,
      prefix: queuePrefix(o.keyPrefix, QueueName.rollouts),
      concurrency: o.concurrency,
      lockDuration: o.lockMs,
      stalledInterval: o.stalledIntervalMs,
      maxStalledCount: 2,
    });
    this.callbacks = new Worker<CallbackJob>(QueueName.callbacks, (job) => deliverCallback(o.callback, job), {
      connection: o.connection,
      prefix: queuePrefix(o.keyPrefix, QueueName.callbacks),
      concurrency: Math.max(4, o.concurrency),
    });
    for (const w of [this.rollouts, this.callbacks] as Worker[]) {
      w.on("error", (err) => o.log.warn({ err: err.message, queue: w.name }, "worker error"));
      // A rollout job's id is its task id.
      w.on("stalled", (jobId) => o.log.warn({ queue: w.name, job: jobId, ...(w === this.rollouts ? { task_id: jobId } : {}) }, "job stalled: it goes back to the queue"));
    }
    this.rollouts.on("failed", (job, err) => {
      o.log.warn({ task_id: job?.data.task_id, job: job?.id, err: err.message, attempts: job?.attemptsMade }, "rollout job failed");
      const exhausted = !job || job.attemptsMade >= (job.opts.attempts ?? 1) || /stalled/i.test(err.message);
      const taskId = job?.data.task_id ?? job?.id;
      if (exhausted && taskId) void onRolloutExhausted(o.rollout, taskId, err).catch((e: Error) => o.log.error({ task_id: taskId, err: e.message }, "cannot end an exhausted task"));
    });
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
