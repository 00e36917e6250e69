import type { AdminStore } from "@rollgate/store";
import type { AdminChannel } from "./admin-channel.js";

/**
 * The rank-health bus between gateway replicas: a replica whose health probes mark a rank down
 * (or up again) tells the others at once, so they stop routing to it (and move its sessions on
 * their next call) without waiting for their own probes. Every replica also re-reads the shared
 * down set each health round (engine-health.ts); this is the fast path.
 */
export class RankHealthBus {
  private readonly listeners: ((member: string, down: boolean) => void)[] = [];

  constructor(
    private readonly admin: AdminStore,
    private readonly channel: AdminChannel,
  ) {}

  /** Starts hearing the other replicas (and this one's own announcements). */
  async start(): Promise<void> {
    await this.channel.listen((msg) => {
      if (msg.type === "rank") for (const l of this.listeners) l(msg.member, msg.down);
    });
  }

  /** Tells every replica that a rank member went down or came back. */
  async announce(member: string, down: boolean): Promise<void> {
    await this.admin.publish({ type: "rank", member, down });
  }

  /** Told of each rank a replica announced down or up. */
  onChange(listener: (member: string, down: boolean) => void): void {
    this.listeners.push(listener);
  }
}
