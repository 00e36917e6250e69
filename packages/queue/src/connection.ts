import type { RedisClient } from "@rollgate/store";
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from "ioredis";

/**
 * Who holds the connection decides how it behaves when Redis is away:
 * - `worker`: BullMQ workers block on Redis and must retry forever (maxRetriesPerRequest: null).
 * - `producer`: HTTP handlers fail fast so the caller gets an error instead of a hung request.
 */
export type ConnectionRole = "worker" | "producer";

export type RedisTarget =
  | { kind: "single"; url: string }
  | { kind: "cluster"; nodes: { host: string; port: number }[]; username?: string; password?: string; tls: boolean };

/**
 * `redis://` or `rediss://` (a database number in the path is honoured) name one server;
 * `redis+cluster://[user:pass@]h1:p1,h2:p2` (or `rediss+cluster://`) names a Redis Cluster by its
 * seed nodes. Throws a plain message for anything else.
 */
export function parseRedisUrl(url: string): RedisTarget {
  const m = /^(rediss?)\+cluster:\/\/(?:([^:@/]*)(?::([^@/]*))?@)?([^/?#]+)\/?$/.exec(url);
  if (m) {
    const nodes = m[4]!.split(",").map((hp) => {
      const [host, port] = hp.split(":");
      const p = Number(port ?? "6379");
      if (!host || !Number.isInteger(p) || p <= 0 || p > 65535) throw new Error(`bad cluster node "${hp}" in REDIS_URL`);
      return { host, port: p };
    });
    return {
      kind: "cluster",
      nodes,
      ...(m[2] ? { username: decodeURIComponent(m[2]) } : {}),
      ...(m[3] ? { password: decodeURIComponent(m[3]) } : {}),
      tls: m[1] === "rediss",
    };
  }
  if (/^rediss?:\/\//.test(url)) return { kind: "single", url };
  throw new Error(`REDIS_URL must be redis://, rediss:// or redis+cluster://h1:p1,h2:p2 (got ${url})`);
}

export function createRedis(url: string, role: ConnectionRole, extra: RedisOptions = {}): RedisClient {
  const options: RedisOptions =
    role === "worker"
      ? { maxRetriesPerRequest: null, enableReadyCheck: true }
      : { maxRetriesPerRequest: 2, enableOfflineQueue: true, connectTimeout: 5_000 };
  const target = parseRedisUrl(url);
  if (target.kind === "single") {
    // ioredis reads host, port, password and the database number (`/2`) from the URL.
    return new Redis(url, { ...options, ...extra, lazyConnect: false });
  }
  const clusterOptions: ClusterOptions = {
    redisOptions: {
      ...options,
      ...extra,
      ...(target.username ? { username: target.username } : {}),
      ...(target.password ? { password: target.password } : {}),
      ...(target.tls ? { tls: {} } : {}),
    },
    // A master failover takes a few seconds (node timeout + election): ride it out rather than
    // fail the commands issued meanwhile (about 15 s of redirections and retries).
    maxRedirections: 64,
    retryDelayOnFailover: 250,
    retryDelayOnClusterDown: 500,
    retryDelayOnTryAgain: 250,
    enableReadyCheck: true,
  };
  return new Cluster(target.nodes, clusterOptions);
}

/** Resolves once Redis answers PING, or rejects with a plain message after `timeoutMs`. */
export async function waitForRedis(redis: RedisClient, timeoutMs = 5_000): Promise<void> {
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

/** A second connection like `client` (pub/sub needs its own). */
export function duplicateClient(client: RedisClient): RedisClient {
  return client instanceof Cluster ? client.duplicate() : client.duplicate();
}
