import { parseAdminMessage, type AdminMessage, type AdminStore, type RedisClient } from "@rollgate/store";

/**
 * This replica's one subscription to the admin channel, the pub/sub the gateway replicas tell
 * each other things on: every message is handed to each module listening (the pause gate, the
 * rank-health bus), which keeps the kinds it is about. One Redis connection serves them all.
 */
export class AdminChannel {
  private readonly listeners: ((msg: AdminMessage) => void)[] = [];
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

  private async subscribe(): Promise<void> {
    this.subscriber.on("message", (_channel, raw: string) => {
      const msg = parseAdminMessage(raw);
      if (msg) for (const l of this.listeners) l(msg);
    });
    await this.subscriber.subscribe(this.admin.channel());
  }

  close(): void {
    this.subscriber.disconnect();
  }
}
