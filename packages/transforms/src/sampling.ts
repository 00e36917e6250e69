import type { SamplingParams } from "@rollgate/protocol";

/**
 * The session's (task's) sampling wins over what the agent sent: a trainer pins temperature and
 * top_p for the policy, and agents must not change them. `max_tokens` is a ceiling, not a value.
 * Stop strings are the one thing both sides add to: the agent's are part of its protocol (a ReAct
 * agent stops the model before it writes an observation), and replacing them with the session's
 * would let the model run on past where the agent's own loop expects it to end.
 */
export function applySessionSampling(client: SamplingParams, session: SamplingParams): SamplingParams {
  const merged: SamplingParams = { ...client, ...session };
  if (client.max_tokens !== undefined && session.max_tokens !== undefined) {
    merged.max_tokens = Math.min(client.max_tokens, session.max_tokens);
  }
  if (client.stop !== undefined && session.stop !== undefined) {
    merged.stop = [...new Set([...session.stop, ...client.stop])];
  }
  return merged;
}
