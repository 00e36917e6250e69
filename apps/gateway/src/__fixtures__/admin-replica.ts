import { duplicateClient } from "@rollgate/queue";
import { AdminStore } from "@rollgate/store";
import { Redis } from "ioredis";
import { pino, type Logger } from "pino";
import { AdminChannel } from "../ops/admin-channel.js";
import { PauseGate } from "../ops/pause-gate.js";
import { TEST_REDIS_URL } from "./harness.js";

/**
 * One gateway replica's admin side on real Redis, wired as app.ts wires it: its own connections,
 * one admin-channel subscription, and the pause gate on it, started. `close` ends it all.
 */
export async function adminReplica(prefix: string, opts: { log?: Logger; onFailure?: ConstructorParameters<typeof PauseGate>[4] } = {}) {
  const redis = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 1 });
  const admin = new AdminStore(redis, prefix);
  const channel = new AdminChannel(admin, duplicateClient(redis));
  const gate = new PauseGate(admin, channel, opts.log ?? pino({ level: "silent" }), async () => null, opts.onFailure);
  await gate.start();
  return {
    redis,
    admin,
    channel,
    gate,
    close: async () => {
      await gate.stop();
      channel.close();
      redis.disconnect();
    },
  };
}
