import { parseAdminMessage, type AdminMessage, type AdminStore, type RedisClient } from "@rollgate/store";

/**
 * This replica's one subscription to the admin channel, the pub/sub the gateway replicas tell
 * each other things on: every message is handed to each module listening (the pause gate, the
 * rank-health bus), which keeps the kinds it is about. One Redis connection serves them all.
 */
export class AdminChannel {
  private readonly listeners: ((msg: AdminMessage) => void)[] = [];
  private readonly resubscribed: (() => void)[] = [];
  private subscribed: Promise<void> | null = null;

  constructor(
    private readonly admin: AdminStore,
    private readonly subscriber: RedisClient,
  ) {}

  /** Hears every admin message from now on; resolves once the subscription is live. */
  async listen(listener: (msg: AdminMessage) => void): Promise<void> {
    this.listeners.push(listener);
    this.subscribed ??= this.subscribe();
    await this.subscribed;
  }

  /**
   * Called each time the subscription is live again after its connection dropped and came back:
   * Redis keeps nothing published while a subscriber is away, so a listener reads again what
   * those messages would have told it.
   */
  onResubscribed(listener: () => void): void {
    this.resubscribed.push(listener);
  }

  private async subscribe(): Promise<void> {
    this.subscriber.on("message", (_channel, raw: string) => {
      const msg = parseAdminMessage(raw);
      if (msg) for (const l of this.listeners) l(msg);
    });
    let live = false;
    // Each later "ready" is a reconnection: once subscribed again, the listeners catch up.
    this.subscriber.on("ready", () => {
      if (!live) return;
      this.subscriber.subscribe(this.admin.channel()).then(
        () => {
          for (const l of this.resubscribed) l();
        },
        () => undefined /* dropped again: the next "ready" tries again */,
      );
    });
    await this.subscriber.subscribe(this.admin.channel());
    live = true;
  }

  close(): void {
    this.subscriber.disconnect();
  }
}
