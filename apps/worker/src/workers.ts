import { QueueName, queuePrefix, type CallbackJob, type RolloutJob } from "@rollgate/queue";
import { Worker } from "bullmq";
import type { Redis } from "ioredis";
import type { Logger } from "pino";
import { deliverCallback, type CallbackDeps } from "./callbacks.js";
import { runRollout, type RolloutDeps } from "./rollout.js";

export interface WorkerSetOptions {
  connection: Redis;
  keyPrefix: string;
  concurrency: number;
  rollout: RolloutDeps;
  callback: CallbackDeps;
  log: Logger;
}

/**
 * The single owner of every BullMQ Worker in this process: rollouts and callback deliveries.
 * A rollout's lock is renewed by BullMQ while it runs (lockDuration is a visibility window, not
 * a job timeout), so a 30-minute agent keeps its job as long as the event loop is free.
 */
export class WorkerSet {
  private readonly workers: Worker[] = [];

  constructor(private readonly o: WorkerSetOptions) {
    const rollouts = new Worker<RolloutJob>(
      QueueName.rollouts,
      (job, _token, signal) => runRollout(o.rollout, job, signal),
      {
        connection: o.connection,
        prefix: queuePrefix(o.keyPrefix, QueueName.rollouts),
        concurrency: o.concurrency,
        lockDuration: 60_000,
        maxStalledCount: 2,
      },
    );
    const callbacks = new Worker<CallbackJob>(
      QueueName.callbacks,
      (job) => deliverCallback(o.callback, job),
      {
        connection: o.connection,
        prefix: queuePrefix(o.keyPrefix, QueueName.callbacks),
        concurrency: Math.max(4, o.concurrency),
      },
    );
    for (const w of [rollouts, callbacks]) {
      w.on("error", (err) => o.log.warn({ err: err.message, queue: w.name }, "worker error"));
      w.on("failed", (job, err) => o.log.warn({ queue: w.name, job: job?.id, err: err.message, attempts: job?.attemptsMade }, "job failed"));
      w.on("stalled", (jobId) => o.log.warn({ queue: w.name, job: jobId }, "job stalled; it will be retried"));
      this.workers.push(w);
    }
  }

  async waitUntilReady(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.waitUntilReady()));
  }

  /** Stops taking jobs and lets running ones finish (BullMQ waits for them). */
  async close(force = false): Promise<void> {
    await Promise.all(this.workers.map((w) => w.close(force)));
  }
}
