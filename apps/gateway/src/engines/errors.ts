/** An engine call that failed; `status` is what the agent is told (502 unreachable, 4xx passed on). */
export class EngineError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly kind: "unreachable" | "rejected" | "bad_response",
  ) {
    super(message);
    this.name = "EngineError";
  }
}

/**
 * What a failed request to an engine becomes: the error itself when `signal` (the agent's) aborted
 * it, else the engine is unreachable (502, so the call counts as lost and another rank may serve).
 */
export function unreachable(url: string, err: unknown, signal?: AbortSignal): unknown {
  if (signal?.aborted) return err;
  return new EngineError(`engine ${url} is unreachable: ${(err as Error).message}`, 502, "unreachable");
}
