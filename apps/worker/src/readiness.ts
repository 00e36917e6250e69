import type { Readiness } from "@rollgate/protocol";
import type { Logger } from "pino";

/** While the gateway is not ready, it is asked at least this often. */
const NOT_READY_POLL_MS = 500;

/** What the watcher needs of the gateway client. */
export interface ReadinessSource {
  readiness(): Promise<Readiness>;
}

export interface ReadinessState {
  ready: boolean;
  /** Why not (the gateway's reasons, or why it could not be asked); null when ready. */
  reason: string | null;
}

/**
 * Watches the gateway's `/readyz`: a worker takes rollouts only while the gateway can serve
 * (Redis answers, every engine has a rank that answers and a known model). Until then the queue
 * holds the tasks: nothing starts, so nothing fails. A gateway that cannot be reached is not ready.
 */
export class GatewayReadiness {
  private state: ReadinessState = { ready: false, reason: "not asked yet" };
  private timer: NodeJS.Timeout | null = null;
  private readonly listeners = new Set<(s: ReadinessState) => void>();
  private checked = false;
  private stopped = true;
  private failedChecks = 0;

  constructor(
    private readonly source: ReadinessSource,
    private readonly log: Logger,
    private readonly everyMs: number,
  ) {}

  get current(): ReadinessState {
    return this.state;
  }

  /**
   * How many checks so far could not get an answer from the gateway (unreachable, cut off). A
   * rollout compares it before and after its agent ran: an agent that talks to the gateway
   * directly (no relay of its own to count them) may have lost calls the gateway never saw.
   */
  get unanswered(): number {
    return this.failedChecks;
  }

  /** Called on every change (and once after the first check). */
  onChange(listener: (s: ReadinessState) => void): void {
    this.listeners.add(listener);
  }

  /** Asks once now, then every `everyMs` (more often while not ready, so held work starts soon after). */
  async start(): Promise<void> {
    this.stopped = false;
    await this.check();
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(): void {
    if (this.stopped) return;
    const delay = this.state.ready ? this.everyMs : Math.min(this.everyMs, NOT_READY_POLL_MS);
    this.timer = setTimeout(() => {
      void this.check().finally(() => this.schedule());
    }, delay);
    this.timer.unref();
  }

  async check(): Promise<ReadinessState> {
    let next: ReadinessState;
    try {
      const r = await this.source.readiness();
      next = r.status === "ready" ? { ready: true, reason: null } : { ready: false, reason: r.reason ?? "not ready" };
    } catch (err) {
      this.failedChecks++;
      next = { ready: false, reason: (err as Error).message };
    }
    const changed = !this.checked || next.ready !== this.state.ready;
    this.checked = true;
    this.state = next;
    if (changed) {
      if (next.ready) this.log.info("gateway ready: taking rollouts");
      else this.log.warn({ reason: next.reason }, "gateway not ready: holding rollouts in the queue until it is");
      for (const l of this.listeners) l(next);
    }
    return next;
  }
}
