import type { AdminStore, LoadedEngines } from "@rollgate/store";
import type { Logger } from "pino";
import type { AdminChannel } from "./admin-channel.js";

/**
 * This replica's view of which engines the gateway itself loaded the current weights onto
 * (`POST /admin/inference/weights` with `load`, each engine reporting the new version back): only
 * there does an engine's own weight version name the weights, so only there is it held against the
 * version the gateway stamps (chat-call.ts). Read at start, after every weights message (the route
 * writes the record before it moves the version) and after the admin channel reconnects; kept in
 * memory so an engine call's check costs no Redis round trip.
 */
export class LoadedWeights {
  private loaded: LoadedEngines | null = null;
  private reads = 0;

  constructor(
    private readonly admin: AdminStore,
    private readonly channel: AdminChannel,
    private readonly log: Logger,
  ) {}

  async start(): Promise<void> {
    await this.channel.listen((msg) => {
      if (msg.type === "weights") void this.read();
    });
    this.channel.onResubscribed(() => void this.read());
    await this.read();
  }

  /** Whether the gateway loaded `version` onto engine `engine`, which must then report it as its own. */
  loadedOn(engine: number, version: string): boolean {
    return this.loaded !== null && this.loaded.version === version && this.loaded.engines.includes(engine);
  }

  private async read(): Promise<void> {
    const n = ++this.reads;
    try {
      const loaded = await this.admin.loadedEngines();
      // Only the latest read counts: an older one answering last would bring back a record replaced since.
      if (n === this.reads) this.loaded = loaded;
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "cannot read which engines the weights were loaded onto: engines' own weight versions go unchecked until the next weights message");
    }
  }
}
