/**
 * An engine call that failed; `status` is what the agent is told (502 unreachable, 4xx passed on).
 * `message` names the engine (logs, lost-call marks, the trainer's view); `forAgent` is what the
 * agent reads: the same without the engine's address, since the agent runs in a sandbox that is
 * not to learn where the cluster's engines are.
 */
export class EngineError extends Error {
  readonly forAgent: string;

  constructor(
    message: string,
    readonly status: number,
    readonly kind: "unreachable" | "rejected" | "bad_response",
    forAgent?: string,
    /**
     * The engine did nothing for the call: it could not be reached (no response headers) or it
     * answered 503 (down). Such a call may be made again on another rank (chat-call.ts).
     */
    readonly beforeAnswer = false,
  ) {
    super(message);
    this.name = "EngineError";
    this.forAgent = forAgent ?? message;
  }
}

/**
 * An engine that sends more of an answer after it said the answer ended (text, tokens or another
 * finish after its finish): what came after is no part of the policy's turn, and the agent may
 * already have taken the turn as ended, so the answer is broken, not longer.
 */
export function outputAfterFinish(): EngineError {
  return new EngineError("the engine sent more of its answer after its finish", 502, "bad_response");
}

/**
 * What an engine's answer that broke off after its headers becomes (its connection closed or reset,
 * or nothing came for the engine timeout): the error itself when `signal` (the agent's, or a pause's)
 * ended it, else the engine is unreachable, as if it had never answered (502, a lost call, and a
 * call a pause cut may go on on another rank). Not an internal error of the gateway.
 */
export function brokeOff(url: string, err: unknown, signal?: AbortSignal): unknown {
  if (err instanceof EngineError || signal?.aborted) return err;
  const e = err as { message?: string; code?: unknown };
  const code = typeof e.code === "string" ? ` (${e.code})` : "";
  return new EngineError(`engine ${url} broke off its answer: ${e.message}`, 502, "unreachable", `the engine broke off its answer${code}`);
}

/**
 * What a failed request to an engine becomes: the error itself when `signal` (the agent's) aborted
 * it, else the engine is unreachable (502, so the call counts as lost and another rank may serve).
 */
export function unreachable(url: string, err: unknown, signal?: AbortSignal): unknown {
  if (signal?.aborted) return err;
  const e = err as { message?: string; code?: unknown };
  // The cause's message names the address it tried (ECONNREFUSED 10.0.0.5:8000): the agent gets its code only.
  const code = typeof e.code === "string" ? ` (${e.code})` : "";
  // Past the engine timeout with no headers, the engine took the call and may still run it: not "before its answer".
  const tookIt = e.code === "UND_ERR_HEADERS_TIMEOUT";
  return new EngineError(`engine ${url} is unreachable: ${e.message}`, 502, "unreachable", `the engine is unreachable${code}`, !tookIt);
}
