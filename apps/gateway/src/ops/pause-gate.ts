import { randomUUID } from "node:crypto";
import type { AdminMessage, AdminStore, PauseState } from "@rollgate/store";
import type { Logger } from "pino";
import type { AdminChannel } from "./admin-channel.js";

export interface GateSlot {
  /** Aborts when the client goes away. */
  signal: AbortSignal;
  /**
   * True when a pause started while this slot was in flight: an engine answer that ended with
   * finish_reason "abort" was then cut by the pause (the engine's own pause route), not refused.
   */
  pausedDuring: () => boolean;
  release: () => void;
}

const REPORT_MS = 3_000;
/** Call starts and ends within this window share one report (the pause route polls every 100 ms). */
const REPORT_COALESCE_MS = 20;

/**
 * This replica's view of the inference pause (docs/operations.md#pause-resume-and-weights): engine calls wait while paused
 * (they are not failed), and the replica's in-flight count is reported to Redis so the pause
 * route can tell when every replica has drained. State comes from a Redis key at start (a replica
 * started while paused is paused) and from the admin channel after (its pause, resume and weights
 * messages; rank health has its own bus, rank-health.ts).
 */
export class PauseGate {
  readonly replicaId = `gw-${randomUUID().slice(0, 8)}`;
  private state: PauseState | null = null;
  /** The policy weight version, kept current by the admin channel (read once at start). */
  private weightVersion: string | null = null;
  private waiters: (() => void)[] = [];
  private readonly inflight = new Set<{ paused: boolean; rank: string }>();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly admin: AdminStore,
    private readonly channel: AdminChannel,
    private readonly log: Logger,
    private readonly readWeights: () => Promise<string | null> = async () => null,
    /** Told of a background write that failed (the caller counts it); the gate logs it itself. */
    private readonly onFailure: (operation: "report_inflight" | "forget_replica") => void = () => undefined,
  ) {}

  /**
   * A failed background write: logged with what it was and counted. A missed in-flight report
   * makes a drain-mode pause wait on a stale count until the next report (REPORT_MS) succeeds.
   */
  private failed(operation: "report_inflight" | "forget_replica", err: unknown): void {
    this.log.warn({ err: (err as Error).message, operation, replica: this.replicaId, inflight: this.inflight.size }, "pause gate: a write to Redis failed");
    this.onFailure(operation);
  }

  async start(): Promise<void> {
    // Subscribed before the state is read: a pause published in between is not missed.
    await this.channel.listen((msg) => this.onMessage(msg));
    this.channel.onResubscribed(() => void this.resync());
    this.state = await this.admin.pauseState();
    this.weightVersion = await this.readWeights();
    await this.report();
    this.timer = setInterval(() => void this.report(), REPORT_MS);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    if (this.reportSoon) clearTimeout(this.reportSoon);
    this.release();
    await this.admin.forgetReplica(this.replicaId).catch((err: unknown) => this.failed("forget_replica", err));
  }

  get paused(): PauseState | null {
    return this.state;
  }

  /**
   * Whether an engine answer that ended with finish_reason "abort" was cut by a pause: the slot
   * heard the pause, or (the message still on its way) Redis already holds the pause state.
   */
  async cutByPause(slot: GateSlot): Promise<boolean> {
    if (slot.pausedDuring() || this.state) return true;
    return (await this.admin.pauseState().catch(() => null)) !== null;
  }

  private weightWaiters: { version: string; wake: () => void }[] = [];

  /**
   * Resolves once this replica has heard the weights message for `version` (or after `timeoutMs`):
   * the admin route that moved the version answers only then, so a token that arrives after its
   * answer is stamped with the new version, not the old one the message had not yet replaced.
   */
  heardWeights(version: string, timeoutMs = 2_000): Promise<void> {
    if (this.weightVersion === version) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(() => wake(), timeoutMs).unref();
      const wake = () => {
        clearTimeout(timer);
        resolve();
      };
      this.weightWaiters.push({ version, wake });
    });
  }

  /** The weight version to stamp on a call starting now (no Redis round trip on the hot path). */
  get weights(): string | null {
    return this.weightVersion;
  }

  get inflightCount(): number {
    return this.inflight.size;
  }

  /** This replica's in-flight engine calls per rank member. */
  inflightByRank(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const slot of this.inflight) out[slot.rank] = (out[slot.rank] ?? 0) + 1;
    return out;
  }

  private reportSoon: NodeJS.Timeout | null = null;

  /** A report of the current counts shortly: a burst of call starts and ends costs one write. */
  private scheduleReport(): void {
    if (this.reportSoon) return;
    this.reportSoon = setTimeout(() => {
      this.reportSoon = null;
      void this.report();
    }, REPORT_COALESCE_MS);
  }

  private async report(): Promise<void> {
    await this.admin.reportInflight(this.replicaId, this.inflight.size, this.inflightByRank()).catch((err: unknown) => this.failed("report_inflight", err));
  }

  /** Pause and resume messages heard, and weights messages heard (resync: what a read may not overwrite). */
  private pauseHeard = 0;
  private weightsHeard = 0;

  private onMessage(msg: AdminMessage): void {
    if (msg.type === "pause") {
      this.pauseHeard++;
      this.enterPause(msg.state);
    } else if (msg.type === "weights") {
      this.weightsHeard++;
      this.setWeights(msg.version);
    } else if (msg.type === "resume") {
      this.pauseHeard++;
      if (this.state && this.state.id !== msg.id) return;
      this.resumed();
    }
  }

  private enterPause(state: PauseState): void {
    this.state = state;
    this.log.info({ mode: state.mode }, "inference paused");
    for (const slot of this.inflight) slot.paused = true;
  }

  private resumed(): void {
    this.state = null;
    this.log.info("inference resumed");
    this.release();
  }

  private setWeights(version: string | null): void {
    this.weightVersion = version;
    const waiting = this.weightWaiters;
    this.weightWaiters = waiting.filter((w) => w.version !== version);
    for (const w of waiting) if (w.version === version) w.wake();
  }

  /**
   * The admin subscription is live again after its connection dropped: the pause state and the
   * weight version are read again (a pause, resume or weights message published meanwhile was
   * never delivered: this replica would stay paused after a resume, call engines through a pause,
   * or stamp tokens with a version the trainer moved on from). A message heard while the read is
   * under way is newer than it: the read does not overwrite what it told.
   */
  private async resync(): Promise<void> {
    const heard = { pause: this.pauseHeard, weights: this.weightsHeard };
    try {
      const [state, version] = await Promise.all([this.admin.pauseState(), this.readWeights()]);
      if (this.pauseHeard === heard.pause) {
        if (state && state.id !== this.state?.id) this.enterPause(state);
        else if (!state && this.state) this.resumed();
      }
      if (this.weightsHeard === heard.weights && version !== this.weightVersion) this.setWeights(version);
      this.log.info({ paused: state !== null, weight_version: version }, "admin channel subscribed again: pause state and weight version read again");
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "admin channel subscribed again, but the pause state could not be read again");
    }
  }

  private release(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const wake of w) wake();
  }

  /**
   * Waits until inference is not paused, then counts the call as in flight. In an abort-mode
   * pause the engines cut in-flight calls themselves (finish_reason "abort", partial tokens); the
   * caller then leaves its slot, waits here for resume and continues the answer. `rank`: the rank
   * member the call goes to (in-flight counts per rank are reported with the total).
   */
  async enter(clientSignal: AbortSignal, rank: string): Promise<GateSlot> {
    while (this.state) {
      if (clientSignal.aborted) throw clientSignal.reason;
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        clientSignal.addEventListener("abort", () => resolve(), { once: true });
      });
    }
    // The slot's signal is the client's own: nothing here aborts a call (the engines cut calls in
    // an abort-mode pause), so a controller of its own that only followed the client's was a
    // second AbortSignal and listener per call.
    const slot = { paused: false, rank };
    this.inflight.add(slot);
    this.scheduleReport();
    return {
      signal: clientSignal,
      pausedDuring: () => slot.paused,
      release: () => {
        if (this.inflight.delete(slot)) this.scheduleReport();
      },
    };
  }
}
