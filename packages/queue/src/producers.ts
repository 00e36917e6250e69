import { Queue } from "bullmq";
import type { RedisClient } from "./connection.js";
import type { CallbackJob, RolloutJob } from "./jobs.js";
import { QueueName, queuePrefix } from "./names.js";

export interface QueueOptions {
  connection: RedisClient;
  keyPrefix: string;
}

/**
 * Rollout jobs retry only infrastructure failures (the worker throws for those); agent and
 * evaluator outcomes are results, never retries. Job id = task id, so re-submission is idempotent.
 */
export function rolloutQueue({ connection, keyPrefix }: QueueOptions): Queue<RolloutJob> {
  return new Queue<RolloutJob>(QueueName.rollouts, {
    connection,
    prefix: queuePrefix(keyPrefix, QueueName.rollouts),
    defaultJobOptions: {
      attempts: 3,
      backoff: { type: "exponential", delay: 2_000, jitter: 0.5 },
      removeOnComplete: { count: 1_000 },
      removeOnFail: { count: 10_000 },
    },
  });
}

export interface CallbackQueueOptions extends QueueOptions {
  attempts: number;
  backoffMs: number;
}

/** Callback deliveries: exponential backoff until a 2xx or the attempts run out. */
export function callbackQueue({ connection, keyPrefix, attempts, backoffMs }: CallbackQueueOptions): Queue<CallbackJob> {
  return new Queue<CallbackJob>(QueueName.callbacks, {
    connection,
    prefix: queuePrefix(keyPrefix, QueueName.callbacks),
    defaultJobOptions: {
      attempts,
      backoff: { type: "exponential", delay: backoffMs, jitter: 0.2 },
      removeOnComplete: { count: 1_000 },
      removeOnFail: { count: 10_000 },
    },
  });
}
