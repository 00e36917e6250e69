import { z } from "zod";

/** A rollout job carries only the task id: the task itself lives in the task store. */
export const RolloutJob = z.object({ task_id: z.string() });
export type RolloutJob = z.infer<typeof RolloutJob>;

/** A callback delivery; `delivery_id` is stable across retries (the X-Rollgate-Delivery header). */
export const CallbackJob = z.object({ task_id: z.string(), delivery_id: z.string() });
export type CallbackJob = z.infer<typeof CallbackJob>;
