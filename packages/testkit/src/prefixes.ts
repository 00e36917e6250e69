import { randomUUID } from "node:crypto";
import { Redis } from "ioredis";

/**
 * A key prefix nobody else uses, `<owner>-<name>-<8 hex>` (owner: "test", "bench"): for
 * ROLLGATE_KEY_PREFIX, BullMQ prefixes and store keys. CI finds what the tests left by the owner.
 */
export function uniquePrefix(owner: string, name: string): string {
  return `${owner}-${name}-${randomUUID().slice(0, 8)}`;
}

/** Deletes every key under a prefix (plain `p:…` and hash-tagged `{p:…` and `{p}…`); returns how many. */
export async function dropPrefix(redisUrl: string, prefix: string): Promise<number> {
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 2 });
  let n = 0;
  try {
    for (const pattern of [`${prefix}:*`, `{${prefix}:*`, `{${prefix}}*`]) {
      let cursor = "0";
      do {
        const [next, found] = await redis.scan(cursor, "MATCH", pattern, "COUNT", 1000);
        cursor = next;
        if (found.length > 0) n += await redis.unlink(...found);
      } while (cursor !== "0");
    }
  } finally {
    redis.disconnect();
  }
  return n;
}
