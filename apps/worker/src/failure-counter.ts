import type { Logger } from "pino";

/**
 * Side work a rollout does not stop for (closing a session it is giving up, flushing the agent's
 * output to the task store): a failure is logged with the rollout's context and counted per kind
 * of work, never dropped. The totals are in every such log line (`failures`) and logged when the
 * worker stops.
 */
export class FailureCounter {
  private readonly counts = new Map<string, number>();

  /** Runs `work`; a failure is logged on `log` (which carries the task and session ids) and counted under `what`. */
  async run(log: Logger, what: string, work: () => Promise<unknown>): Promise<void> {
    try {
      await work();
    } catch (err) {
      const failures = (this.counts.get(what) ?? 0) + 1;
      this.counts.set(what, failures);
      log.warn({ what, err: (err as Error).message, failures }, `${what} failed; the rollout goes on`);
    }
  }

  totals(): Record<string, number> {
    return Object.fromEntries(this.counts);
  }
}
