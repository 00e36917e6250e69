import { z } from "zod";

/**
 * The first LLM call of a session that failed for a reason outside the policy (engine unreachable
 * or 5xx, no healthy rank, served model unknown, Redis unavailable, a gateway error, missing token
 * ids or logprobs): what the agent was answered and why.
 */
export const LostCall = z.object({
  at: z.string(),
  /** The failure's machine kind, e.g. `engine_unreachable`, `engine_bad_response`, `storage_unavailable`, `internal_error`, `left_during_pause`. */
  kind: z.string(),
  /** The HTTP status the agent got. */
  status: z.number().int(),
  message: z.string(),
});
export type LostCall = z.infer<typeof LostCall>;

/** Calls a session lost to infrastructure: a rollout with any is never scored. */
export const LostCalls = z.object({ count: z.number().int().nonnegative(), first: LostCall.nullable() });
export type LostCalls = z.infer<typeof LostCalls>;
