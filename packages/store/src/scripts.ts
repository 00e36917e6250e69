import { createHash } from "node:crypto";
import type { RedisClient } from "./client.js";

const shas = new Map<string, string>();

/**
 * Runs a Lua script by its SHA (EVALSHA), sending the body only when the server does not know it
 * yet (NOSCRIPT: a new or restarted node, or another cluster node): per-call scripts then cost a
 * 40-byte hash on the wire instead of their whole text.
 */
export async function runScript(redis: RedisClient, script: string, keys: string[], args: string[]): Promise<unknown> {
  let sha = shas.get(script);
  if (!sha) shas.set(script, (sha = createHash("sha1").update(script).digest("hex")));
  try {
    return await redis.evalsha(sha, keys.length, ...keys, ...args);
  } catch (err) {
    if (!String((err as Error).message).startsWith("NOSCRIPT")) throw err;
    return redis.eval(script, keys.length, ...keys, ...args);
  }
}
