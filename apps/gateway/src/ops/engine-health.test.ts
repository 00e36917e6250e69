/**
 * Rank health probes against engine-sim with real Redis: a failing rank is drained after the
 * configured failures, and nothing is probed (so nothing is drained) while inference is paused:
 * probes are generations a paused engine would hold until resume.
 */
import { buildEngineSim } from "@rollgate/engine-sim";
import { createRedis } from "@rollgate/queue";
import { RankRouter } from "@rollgate/store";
import type { FastifyInstance } from "fastify";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dropPrefixes, listenLocal, TEST_REDIS_URL } from "../__fixtures__/harness.js";
import { EngineRegistry } from "../engines/registry.js";
import { EngineHealth } from "./engine-health.js";

const prefix = `test-health-${Math.random().toString(36).slice(2, 8)}`;
const redis = createRedis(TEST_REDIS_URL, "producer");
let sim: FastifyInstance;
let simUrl: string;

beforeAll(async () => {
  sim = buildEngineSim({ dpSize: 2 });
  simUrl = await listenLocal(sim);
  // Rank 1 answers 503 to everything.
  await fetch(`${simUrl}/sim/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rank: 1, mode: "down" }) });
});

afterAll(async () => {
  await sim.close();
  await dropPrefixes([prefix, `${prefix}-calls`, `${prefix}-off`, `${prefix}-race`]);
  redis.disconnect();
});

describe("EngineHealth", () => {
  const make = (paused: () => boolean) => {
    const registry = new EngineRegistry([{ kind: "vllm", url: simUrl, dp_size: 2 }], 10_000);
    return new EngineHealth(registry, new RankRouter(redis, prefix), 1, pino({ level: "silent" }), async () => undefined, paused);
  };

  it("probes nothing while inference is paused, then drains the failing rank once resumed", async () => {
    let paused = true;
    const health = make(() => paused);
    await health.checkAll();
    expect(health.isDown("0:1")).toBe(false);
    expect(health.snapshot().every((h) => h.lastCheck === null)).toBe(true);
    paused = false;
    await health.checkAll();
    expect(health.isDown("0:1")).toBe(true);
    expect(health.isDown("0:0")).toBe(false);
  });

  describe("a call that found its rank unreachable (ROLLGATE_HEALTH_FAILURES 2)", () => {
    const withRounds = (intervalS: number, keyPrefix: string, paused = () => false) => {
      const registry = new EngineRegistry([{ kind: "vllm", url: simUrl, dp_size: 2 }], 10_000);
      const health = new EngineHealth(registry, new RankRouter(redis, keyPrefix), 2, pino({ level: "silent" }), async () => undefined, paused);
      health.start(intervalS);
      health.stop();
      return health;
    };

    it("has its rank probed now: a probe that confirms it drains the rank (the call counted as one failure); a rank that answers stays", async () => {
      const health = withRounds(600, `${prefix}-calls`);
      await health.callFailed("0:1");
      expect(health.isDown("0:1")).toBe(true);
      expect(await new RankRouter(redis, `${prefix}-calls`).downRanks()).toEqual(new Set(["0:1"]));
      await health.callFailed("0:0");
      expect(health.isDown("0:0")).toBe(false);
      expect(health.snapshot().find((h) => h.member === "0:0")).toMatchObject({ healthy: true, consecutiveFailures: 0 });
    });

    it("stays drained here when a round read the shared set before the drain was written there", async () => {
      const keyPrefix = `${prefix}-race`;
      const registry = new EngineRegistry([{ kind: "vllm", url: simUrl, dp_size: 2 }], 10_000);
      // The round runs while the drain is being announced: its read of the shared set comes
      // before the drain's write, as it does when a readiness round overlaps a failed call's probe.
      let health: EngineHealth | null = null;
      const announce = async (member: string, down: boolean) => {
        if (member === "0:1" && down) await health!.checkAll({ drain: false });
      };
      health = new EngineHealth(registry, new RankRouter(redis, keyPrefix), 2, pino({ level: "silent" }), announce);
      health.start(600);
      health.stop();
      await health.callFailed("0:1");
      expect(await new RankRouter(redis, keyPrefix).downRanks()).toEqual(new Set(["0:1"]));
      expect(health.isDown("0:1")).toBe(true);
    });

    it("drains nothing without periodic rounds (nothing would bring the rank back) or while inference is paused", async () => {
      await withRounds(0, `${prefix}-off`).callFailed("0:1");
      await withRounds(600, `${prefix}-off`, () => true).callFailed("0:1");
      expect(await new RankRouter(redis, `${prefix}-off`).downRanks()).toEqual(new Set());
    });
  });
});
