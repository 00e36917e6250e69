import { Queue } from "bullmq";
import type { RedisClient } from "@rollgate/store";
import type { CallbackJob, RolloutJob } from "./jobs.js";
import { QueueName, queuePrefix } from "./names.js";

export interface QueueOptions {
  connection: RedisClient;
  keyPrefix: string;
}

export interface RolloutQueueOptions extends QueueOptions {
  /** The infrastructure retry budget: attempts in all (default 3). */
  attempts?: number;
  /** Delay before the second attempt, doubled for each later one (default 2000 ms). */
  backoffMs?: number;
}

/**
 * Rollout jobs retry only infrastructure failures (the worker throws for those: the gateway
 * unreachable or failing, a session that lost an LLM call); agent and evaluator outcomes are
 * results, never retries. Job id = task id, so re-submission is idempotent. The budget travels
 * with each job (its `attempts`), so workers need no setting of their own.
 */
export function rolloutQueue({ connection, keyPrefix, attempts = 3, backoffMs = 2_000 }: RolloutQueueOptions): Queue<RolloutJob> {
  return new Queue<RolloutJob>(QueueName.rollouts, {
    connection,
    prefix: queuePrefix(keyPrefix, QueueName.rollouts),
    defaultJobOptions: {
      attempts,
      backoff: { type: "exponential", delay: backoffMs, jitter: 0.5 },
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
