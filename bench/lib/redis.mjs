import { randomUUID } from "node:crypto";
import { Redis } from "ioredis";
import { REDIS_URL, atInterrupt } from "./procs.mjs";

/** Prefixes handed out and not yet dropped: removed on SIGINT/SIGTERM too (see procs.mjs). */
/** @type {Set<string>} */
export const livePrefixes = new Set();

/**
 * A key prefix nobody else uses (ROLLGATE_KEY_PREFIX, BullMQ prefix).
 * @param {string} name
 */
export function uniquePrefix(name) {
  const p = `bench-${name}-${randomUUID().slice(0, 8)}`;
  livePrefixes.add(p);
  return p;
}

export function redisClient() {
  return new Redis(REDIS_URL, { maxRetriesPerRequest: 2 });
}

/**
 * Deletes every key under a prefix (plain and hash-tagged forms); returns how many.
 * @param {string} prefix
 */
export async function dropPrefix(prefix) {
  livePrefixes.delete(prefix);
  const redis = redisClient();
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

atInterrupt(() => Promise.all([...livePrefixes].map((p) => dropPrefix(p))));
