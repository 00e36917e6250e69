/**
 * The rank-health bus on real Redis: a rank one replica announces down (or up again) is heard at
 * once by every replica, the announcing one included; pause messages on the same admin channel are
 * not rank changes, and rank changes do not pause anything.
 */
import { randomUUID } from "node:crypto";
import { afterAll, describe, expect, it } from "vitest";
import { adminReplica } from "../__fixtures__/admin-replica.js";
import { dropPrefixes } from "../__fixtures__/harness.js";
import { RankHealthBus } from "./rank-health.js";

const prefix = `test-rankhealth-${randomUUID().slice(0, 8)}`;
afterAll(() => dropPrefixes([prefix]));

/** One replica as app.ts wires it: one admin channel heard by its pause gate and its rank-health bus. */
async function replica() {
  const r = await adminReplica(prefix);
  const bus = new RankHealthBus(r.admin, r.channel);
  const heard: [string, boolean][] = [];
  bus.onChange((member, down) => heard.push([member, down]));
  await bus.start();
  return { ...r, bus, heard };
}

describe("RankHealthBus", () => {
  it("tells every replica at once when a rank goes down and when it comes back", async () => {
    const a = await replica();
    const b = await replica();
    try {
      await a.bus.announce("0:1", true);
      await expect.poll(() => b.heard).toEqual([["0:1", true]]);
      await expect.poll(() => a.heard).toEqual([["0:1", true]]);
      await b.bus.announce("0:1", false);
      await expect.poll(() => a.heard).toEqual([
        ["0:1", true],
        ["0:1", false],
      ]);
      // A rank change pauses nothing.
      expect(a.gate.paused).toBeNull();
      expect(b.gate.paused).toBeNull();
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("hears only rank changes on the admin channel, not pauses, resumes or weight versions", async () => {
    const a = await replica();
    const b = await replica();
    try {
      await a.admin.pause({ mode: "abort", since: new Date().toISOString(), id: "p1" });
      await a.admin.publish({ type: "weights", version: "w9" });
      await expect.poll(() => b.gate.weights).toBe("w9");
      expect(b.gate.paused?.id).toBe("p1");
      await a.admin.resume();
      await a.bus.announce("1:0", true);
      await expect.poll(() => b.heard).toEqual([["1:0", true]]);
      expect(b.gate.paused).toBeNull();
    } finally {
      await a.close();
      await b.close();
    }
  });
});
