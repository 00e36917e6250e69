import { dropPrefix as dropKeys, uniquePrefix as newPrefix } from "@rollgate/testkit";
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
  const p = newPrefix("bench", name);
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
export function dropPrefix(prefix) {
  livePrefixes.delete(prefix);
  return dropKeys(REDIS_URL, prefix);
}

atInterrupt(() => Promise.all([...livePrefixes].map((p) => dropPrefix(p))));
