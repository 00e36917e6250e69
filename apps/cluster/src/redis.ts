import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { parseRedisUrl } from "@rollgate/queue";
import { Cluster, Redis } from "ioredis";

export const DEFAULT_REDIS_URL = "redis://127.0.0.1:6379";

export async function redisAnswers(url: string, timeoutMs = 2_000): Promise<boolean> {
  const target = parseRedisUrl(url);
  const client =
    target.kind === "cluster"
      ? new Cluster(target.nodes, { lazyConnect: true, clusterRetryStrategy: () => null, redisOptions: { connectTimeout: timeoutMs, maxRetriesPerRequest: 0 } })
      : new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: timeoutMs, retryStrategy: () => null });
  client.on("error", () => undefined);
  try {
    await client.connect();
    await client.ping();
    return true;
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (addr && typeof addr === "object" ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

export interface PrivateRedis {
  url: string;
  stop: () => Promise<void>;
}

function hasRedisServer(): boolean {
  return spawnSync("redis-server", ["--version"], { stdio: "ignore" }).status === 0;
}

/**
 * Starts a throwaway redis-server on a free port in its own temp dir (AOF on, like production).
 * `onSpawn` gets its stop function at once, so a stop during start-up can reach it.
 */
export async function startPrivateRedis(onSpawn?: (stop: () => Promise<void>) => void): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = mkdtempSync(path.join(os.tmpdir(), "rollgate-redis-"));
  const proc: ChildProcess = spawn(
    "redis-server",
    ["--port", String(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "yes", "--maxmemory-policy", "noeviction"],
    { stdio: "ignore" },
  );
  const url = `redis://127.0.0.1:${port}`;
  const stop = () =>
    new Promise<void>((resolve) => {
      const done = () => {
        rmSync(dir, { recursive: true, force: true });
        resolve();
      };
      if (proc.exitCode !== null || proc.signalCode !== null) return done();
      proc.once("exit", done);
      proc.kill("SIGTERM");
    });
  onSpawn?.(stop);
  const deadline = Date.now() + 10_000;
  while (!(await redisAnswers(url, 500))) {
    if (Date.now() > deadline || proc.exitCode !== null) {
      proc.kill("SIGKILL");
      throw new Error(`could not start redis-server on port ${port}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url, stop };
}

/**
 * docs/operations.md#running-the-cluster: use REDIS_URL when given (and say so plainly if it does not answer); otherwise the
 * default local Redis; otherwise a private redis-server if one is installed; otherwise explain.
 */
export async function resolveRedis(
  explicitUrl: string | undefined,
  say: (msg: string) => void,
  onSpawn?: (stop: () => Promise<void>) => void,
): Promise<{ url: string; stop?: () => Promise<void> }> {
  if (explicitUrl) {
    if (await redisAnswers(explicitUrl)) return { url: explicitUrl };
    throw new Error(`nothing answers at REDIS_URL=${explicitUrl}; start Redis there or unset REDIS_URL`);
  }
  if (await redisAnswers(DEFAULT_REDIS_URL)) return { url: DEFAULT_REDIS_URL };
  if (!hasRedisServer()) {
    throw new Error(
      `no Redis at ${DEFAULT_REDIS_URL} and no redis-server on the PATH: install Debian's redis-server package ` +
        `(apt-get install redis-server), run "docker compose up redis", or set REDIS_URL`,
    );
  }
  const priv = await startPrivateRedis(onSpawn);
  say(`no Redis at ${DEFAULT_REDIS_URL}: started a private redis-server at ${priv.url} (stopped with the cluster)`);
  return priv;
}
