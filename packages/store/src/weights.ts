import type { RedisClient } from "./client.js";
import { keys, type Keys } from "./keys.js";

/** The policy weight version stamped on every completion (set by the admin route). */
export class WeightStore {
  private readonly k: Keys;
  constructor(
    private readonly redis: RedisClient,
    prefix: string,
  ) {
    this.k = keys(prefix);
  }
  async get(): Promise<string | null> {
    return this.redis.get(this.k.weightVersion());
  }
  async set(version: string): Promise<void> {
    await this.redis.set(this.k.weightVersion(), version);
  }
}
