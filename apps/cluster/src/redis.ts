import { spawnSync } from "node:child_process";
import { DEFAULT_REDIS_URL, redisAnswers, startPrivateRedis } from "@rollgate/testkit";

function hasRedisServer(): boolean {
  return spawnSync("redis-server", ["--version"], { stdio: "ignore" }).status === 0;
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
