import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseRedisUrl } from "@rollgate/queue";
import { Cluster, Redis } from "ioredis";
import { freePort } from "./ports.js";

export const DEFAULT_REDIS_URL = "redis://127.0.0.1:6379";

/** Whether a Redis (a single server or a cluster) answers PING at `url`. */
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

export interface PrivateRedis {
  url: string;
  stop: () => Promise<void>;
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
