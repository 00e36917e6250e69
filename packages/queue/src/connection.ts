import { Redis, type RedisOptions } from "ioredis";

/**
 * Who holds the connection decides how it behaves when Redis is away:
 * - `worker`: BullMQ workers block on Redis and must retry forever (maxRetriesPerRequest: null).
 * - `producer`: HTTP handlers fail fast so the caller gets a 503 instead of a hung request.
 */
export type ConnectionRole = "worker" | "producer";

export function createRedis(url: string, role: ConnectionRole, extra: RedisOptions = {}): Redis {
  const options: RedisOptions =
    role === "worker"
      ? { maxRetriesPerRequest: null, enableReadyCheck: true }
      : { maxRetriesPerRequest: 2, enableOfflineQueue: true, connectTimeout: 5_000 };
  // ioredis reads host, port, password and the database number (`/2`) from the URL.
  return new Redis(url, { ...options, ...extra, lazyConnect: false });
}

/** Resolves once Redis answers PING, or rejects with a plain message after `timeoutMs`. */
export async function waitForRedis(redis: Redis, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    try {
      await redis.ping();
      return;
    } catch (err) {
      lastError = err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  throw new Error(`Redis did not answer within ${timeoutMs} ms: ${String(lastError)}`);
}
