/** A build refused because a record or a trace breaks an invariant a trainer relies on. */
export class TrajectoryInvariantError extends Error {
  override readonly name = "TrajectoryInvariantError";
  readonly record_id: string | null;
  readonly trace_index: number | null;
  /** Offending token position (in the record's output / prompt, or the trace's response), when known. */
  readonly position: number | null;
  readonly rule: string;

  constructor(
    rule: string,
    message: string,
    where: { record_id?: string | null; trace_index?: number | null; position?: number | null } = {},
  ) {
    const rec = where.record_id ?? null;
    const trace = where.trace_index ?? null;
    const prefix = rec !== null ? `record ${rec}` : trace !== null ? `trace ${trace}` : "trajectory";
    super(`${prefix}: ${message} [${rule}]`);
    this.rule = rule;
    this.record_id = rec;
    this.trace_index = trace;
    this.position = where.position ?? null;
  }
}
