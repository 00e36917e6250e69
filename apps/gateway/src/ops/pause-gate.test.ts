/**
 * The pause gate's background writes on real Redis: a report of the in-flight count that Redis
 * refuses is logged with what it was and counted, not swallowed.
 */
import { randomUUID } from "node:crypto";
import { Writable } from "node:stream";
import { duplicateClient } from "@rollgate/queue";
import { AdminStore } from "@rollgate/store";
import { Redis } from "ioredis";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { TEST_REDIS_URL, dropPrefixes } from "../__fixtures__/harness.js";
import { PauseGate } from "./pause-gate.js";

const prefix = `test-pausegate-${randomUUID().slice(0, 8)}`;
afterAll(() => dropPrefixes([prefix]));

function captureLog() {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString("utf8").split("\n").filter(Boolean)) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { log: pino({ level: "info" }, sink), lines };
}

describe("PauseGate", () => {
  it("logs and counts an in-flight report Redis did not take, with the replica and the count", async () => {
    const redis = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 1 });
    const subscriber = duplicateClient(redis);
    const { log, lines } = captureLog();
    const failures: string[] = [];
    const gate = new PauseGate(new AdminStore(redis, prefix), subscriber, log, async () => null, (op) => failures.push(op));
    await gate.start();
    expect(failures).toEqual([]);

    // Redis goes away for this replica: its connection is closed, so every write is refused.
    redis.disconnect();
    const slot = await gate.enter(new AbortController().signal, "0:0");
    await expect.poll(() => failures, { timeout: 5_000 }).toContain("report_inflight");
    const line = lines.find((l) => l.operation === "report_inflight");
    expect(line).toMatchObject({ level: 40, replica: gate.replicaId, inflight: 1, msg: expect.stringContaining("failed") });
    expect(String(line!.err)).toMatch(/closed/i);
    slot.release();
    await gate.stop();
    expect(failures).toContain("forget_replica");
  });
});
