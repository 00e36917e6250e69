import { DEFAULT_REDIS_URL, dropPrefix as dropKeys, uniquePrefix as newPrefix } from "@rollgate/testkit";

/** The Redis every test uses: .ci/run passes a private one's URL when 127.0.0.1:6379 is not there. */
export const TEST_REDIS_URL = process.env.REDIS_URL ?? DEFAULT_REDIS_URL;

/** A key prefix no other test shares (for ROLLGATE_KEY_PREFIX, BullMQ prefixes and store keys). */
export function uniquePrefix(name: string): string {
  return newPrefix("test", name);
}

/** Deletes every key under a prefix (plain and hash-tagged forms). */
export async function dropPrefix(prefix: string): Promise<void> {
  await dropKeys(TEST_REDIS_URL, prefix);
}
