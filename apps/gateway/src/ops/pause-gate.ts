import { randomUUID } from "node:crypto";
import { parseAdminMessage, type AdminStore, type PauseState } from "@rollgate/store";
import type { RedisClient } from "@rollgate/queue";
import type { Logger } from "pino";

/** Why an engine call was aborted: the caller sends it again after resume. */
export class PausedAbort extends Error {
  constructor() {
    super("aborted by an inference pause");
    this.name = "PausedAbort";
  }
}

export interface GateSlot {
  /** Aborts when the client goes away, or (non-streamed calls) when an abort-mode pause starts. */
  signal: AbortSignal;
  /** True when this slot was aborted by a pause (send the call again once resumed). */
  abortedByPause: () => boolean;
  release: () => void;
}

const REPORT_MS = 3_000;

/**
 * This replica's view of the inference pause (DESIGN §2 admin): engine calls wait while paused
 * (they are not failed), and the replica's in-flight count is reported to Redis so the pause
 * route can tell when every replica has drained. State comes from a Redis key at start (a replica
 * started while paused is paused) and from the admin channel after.
 */
export class PauseGate {
  readonly replicaId = `gw-${randomUUID().slice(0, 8)}`;
  private state: PauseState | null = null;
  /** The policy weight version, kept current by the admin channel (read once at start). */
  private weightVersion: string | null = null;
  private waiters: (() => void)[] = [];
  private readonly inflight = new Set<{ controller: AbortController; abortable: boolean; byPause: boolean }>();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly admin: AdminStore,
    private readonly subscriber: RedisClient,
    private readonly log: Logger,
    private readonly readWeights: () => Promise<string | null> = async () => null,
  ) {}

  async start(): Promise<void> {
    this.subscriber.on("message", (_channel, raw: string) => this.onMessage(raw));
    await this.subscriber.subscribe(this.admin.channel());
    this.state = await this.admin.pauseState();
    this.weightVersion = await this.readWeights();
    await this.report();
    this.timer = setInterval(() => void this.report(), REPORT_MS);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.release();
    this.subscriber.disconnect();
    await this.admin.forgetReplica(this.replicaId).catch(() => undefined);
  }

  get paused(): PauseState | null {
    return this.state;
  }

  /** The weight version to stamp on a call starting now (no Redis round trip on the hot path). */
  get weights(): string | null {
    return this.weightVersion;
  }

  get inflightCount(): number {
    return this.inflight.size;
  }

  private async report(): Promise<void> {
    await this.admin.reportInflight(this.replicaId, this.inflight.size).catch(() => undefined);
  }

  private onMessage(raw: string): void {
    const msg = parseAdminMessage(raw);
    if (!msg) return;
    if (msg.type === "pause") {
      this.state = msg.state;
      this.log.info({ mode: msg.state.mode }, "inference paused");
      if (msg.state.mode === "abort") {
        for (const slot of this.inflight) {
          if (!slot.abortable) continue;
          slot.byPause = true;
          slot.controller.abort(new PausedAbort());
        }
      }
    } else if (msg.type === "weights") {
      this.weightVersion = msg.version;
    } else if (msg.type === "resume") {
      if (this.state && this.state.id !== msg.id) return;
      this.state = null;
      this.log.info("inference resumed");
      this.release();
    }
  }

  private release(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const wake of w) wake();
  }

  /**
   * Waits until inference is not paused, then counts the call as in flight. `abortable`: a
   * non-streamed call can be aborted by an abort-mode pause and sent again, invisibly to the agent;
   * a stream that already reached the agent cannot, so it drains instead.
   */
  async enter(clientSignal: AbortSignal, abortable: boolean): Promise<GateSlot> {
    while (this.state) {
      if (clientSignal.aborted) throw clientSignal.reason;
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        clientSignal.addEventListener("abort", () => resolve(), { once: true });
      });
    }
    const controller = new AbortController();
    const onClient = () => controller.abort(clientSignal.reason);
    clientSignal.addEventListener("abort", onClient, { once: true });
    const slot = { controller, abortable, byPause: false };
    this.inflight.add(slot);
    void this.report();
    return {
      signal: controller.signal,
      abortedByPause: () => slot.byPause,
      release: () => {
        clientSignal.removeEventListener("abort", onClient);
        if (this.inflight.delete(slot)) void this.report();
      },
    };
  }
}
