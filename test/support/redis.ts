import { randomUUID } from "node:crypto";
import { Redis } from "ioredis";

/** The Redis every test uses: .ci/run passes a private one's URL when 127.0.0.1:6379 is not there. */
export const TEST_REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";

/** A key prefix no other test shares (for ROLLGATE_KEY_PREFIX, BullMQ prefixes and store keys). */
export function uniquePrefix(name: string): string {
  return `test-${name}-${randomUUID().slice(0, 8)}`;
}

/** Deletes every key under a prefix (plain and hash-tagged forms). */
export async function dropPrefix(prefix: string): Promise<void> {
  const redis = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 2 });
  try {
    for (const pattern of [`${prefix}:*`, `{${prefix}:*`]) {
      let cursor = "0";
      do {
        const [next, found] = await redis.scan(cursor, "MATCH", pattern, "COUNT", 1000);
        cursor = next;
        if (found.length > 0) await redis.del(...found);
      } while (cursor !== "0");
    }
  } finally {
    redis.disconnect();
  }
}
