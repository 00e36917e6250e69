import { z } from "zod";

/** A rollout job carries only the task id: the task itself lives in the task store. */
export const RolloutJob = z.object({ task_id: z.string() });
export type RolloutJob = z.infer<typeof RolloutJob>;

/**
 * A callback delivery: one task's result, or (with `group_id`) a whole GRPO group's results once
 * every task of the group ended. `delivery_id` is stable across retries (X-Rollgate-Delivery).
 */
export const CallbackJob = z.union([
  z.object({ task_id: z.string(), delivery_id: z.string() }),
  z.object({ group_id: z.string(), delivery_id: z.string() }),
]);
export type CallbackJob = z.infer<typeof CallbackJob>;
