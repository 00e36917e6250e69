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
