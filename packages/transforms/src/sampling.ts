import type { SamplingParams } from "@rollgate/protocol";

/**
 * The session's (task's) sampling wins over what the agent sent: a trainer pins temperature and
 * top_p for the policy, and agents must not change them. `max_tokens` is a ceiling, not a value.
 */
export function applySessionSampling(client: SamplingParams, session: SamplingParams): SamplingParams {
  const merged: SamplingParams = { ...client, ...session };
  if (client.max_tokens !== undefined && session.max_tokens !== undefined) {
    merged.max_tokens = Math.min(client.max_tokens, session.max_tokens);
  }
  return merged;
}
