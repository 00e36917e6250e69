/**
 * The pause gate on real Redis: calls wait while any replica has inference paused and go on at
 * resume, the weight version follows the admin channel, rank-health messages leave the gate
 * alone; and a report of the in-flight count that Redis refuses is logged with what it was and
 * counted, not swallowed.
 */
import { randomUUID } from "node:crypto";
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { adminReplica } from "../__fixtures__/admin-replica.js";
import { dropPrefixes } from "../__fixtures__/harness.js";

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
  it("holds new calls while another replica has inference paused, lets them go at resume, and follows the weight version", async () => {
    const p = `${prefix}-gate`;
    const here = await adminReplica(p);
    const other = await adminReplica(p);
    try {
      const inFlight = await here.gate.enter(new AbortController().signal, "0:0");
      await other.admin.pause({ mode: "abort", since: new Date().toISOString(), id: "p1" });
      await expect.poll(() => here.gate.paused?.id).toBe("p1");
      // The call already in flight heard the pause: an "abort" answer it gets was cut by it.
      expect(inFlight.pausedDuring()).toBe(true);
      expect(await here.gate.cutByPause(inFlight)).toBe(true);
      inFlight.release();

      let entered = false;
      const waiting = here.gate.enter(new AbortController().signal, "0:0").then((slot) => {
        entered = true;
        return slot;
      });
      await other.admin.publish({ type: "weights", version: "w2" });
      await expect.poll(() => here.gate.weights).toBe("w2");
      // A rank going down is no business of the gate's: the call still waits.
      await other.admin.publish({ type: "rank", member: "0:0", down: true });
      await new Promise((r) => setTimeout(r, 100));
      expect(entered).toBe(false);
      expect(here.gate.paused?.id).toBe("p1");

      await other.admin.resume();
      const slot = await waiting;
      expect(here.gate.paused).toBeNull();
      expect(slot.pausedDuring()).toBe(false);
      expect(here.gate.inflightByRank()).toEqual({ "0:0": 1 });
      slot.release();
      expect(here.gate.inflightCount).toBe(0);
    } finally {
      await here.close();
      await other.close();
    }
  });

  it("a replica that starts while inference is paused is paused", async () => {
    const p = `${prefix}-late`;
    const first = await adminReplica(p);
    await first.admin.pause({ mode: "drain", since: new Date().toISOString(), id: "p2" });
    const late = await adminReplica(p);
    try {
      expect(late.gate.paused).toMatchObject({ mode: "drain", id: "p2" });
      const client = new AbortController();
      const waiting = late.gate.enter(client.signal, "0:0");
      // A client that goes away while it waits leaves with its reason.
      client.abort(new Error("client left"));
      await expect(waiting).rejects.toThrow("client left");
    } finally {
      await first.admin.resume();
      await late.close();
      await first.close();
    }
  });

  it("logs and counts an in-flight report Redis did not take, with the replica and the count", async () => {
    const { log, lines } = captureLog();
    const failures: string[] = [];
    const { redis, gate, close } = await adminReplica(prefix, { log, onFailure: (op) => failures.push(op) });
    expect(failures).toEqual([]);

    // Redis goes away for this replica: its connection is closed, so every write is refused.
    redis.disconnect();
    const slot = await gate.enter(new AbortController().signal, "0:0");
    await expect.poll(() => failures, { timeout: 5_000 }).toContain("report_inflight");
    const line = lines.find((l) => l.operation === "report_inflight");
    expect(line).toMatchObject({ level: 40, replica: gate.replicaId, inflight: 1, msg: expect.stringContaining("failed") });
    expect(String(line!.err)).toMatch(/closed/i);
    slot.release();
    await close();
    expect(failures).toContain("forget_replica");
  });
});
