/**
 * Tests need a real Redis. When REDIS_URL is not set and nothing answers at 127.0.0.1:6379, start a
 * private redis-server for the run (if one is installed) so `npm test` works on a fresh machine.
 */
import { DEFAULT_REDIS_URL, redisAnswers, startPrivateRedis, type PrivateRedis } from "@rollgate/testkit";

let own: PrivateRedis | null = null;

export async function setup(): Promise<void> {
  if (process.env.REDIS_URL || (await redisAnswers(DEFAULT_REDIS_URL))) return;
  try {
    own = await startPrivateRedis();
  } catch (err) {
    throw new Error(`tests need Redis: set REDIS_URL, start one at ${DEFAULT_REDIS_URL}, or install redis-server (${(err as Error).message})`);
  }
  process.env.REDIS_URL = own.url;
  console.log(`[tests] no Redis at ${DEFAULT_REDIS_URL}: started a private redis-server at ${own.url}`);
}

export async function teardown(): Promise<void> {
  await own?.stop();
}
