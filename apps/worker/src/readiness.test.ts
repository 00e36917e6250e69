/**
 * The readiness watcher's decisions: told once at the first answer and at every change; a gateway
 * that cannot be asked is not ready, and says why.
 */
import type { Readiness } from "@rollgate/protocol";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { GatewayReadiness, type ReadinessState } from "./readiness.js";

const answer = (ready: boolean, reason: string | null = null): Readiness => ({ status: ready ? "ready" : "unavailable", reason, redis: "ok", engines: [] });

describe("GatewayReadiness", () => {
  it("tells its listeners at the first answer and at every change, not on repeats", async () => {
    const answers: (Readiness | Error)[] = [answer(false, "engine 0: no rank answers"), answer(false, "engine 0: no rank answers"), new Error("gateway unreachable"), answer(true), answer(true), answer(false, "redis: down")];
    const source = {
      readiness: async () => {
        const next = answers.shift()!;
        if (next instanceof Error) throw next;
        return next;
      },
    };
    const seen: ReadinessState[] = [];
    const watcher = new GatewayReadiness(source, pino({ level: "silent" }), 60_000);
    watcher.onChange((s) => seen.push(s));
    for (let i = 0; i < 6; i++) await watcher.check();
    expect(seen).toEqual([
      { ready: false, reason: "engine 0: no rank answers" },
      { ready: true, reason: null },
      { ready: false, reason: "redis: down" },
    ]);
    expect(watcher.current).toEqual({ ready: false, reason: "redis: down" });
  });

  it("a gateway that cannot be asked is not ready, with the error as the reason", async () => {
    const watcher = new GatewayReadiness({ readiness: () => Promise.reject(new Error("gateway http://gw:8080 unreachable: ECONNREFUSED")) }, pino({ level: "silent" }), 60_000);
    expect(await watcher.check()).toEqual({ ready: false, reason: "gateway http://gw:8080 unreachable: ECONNREFUSED" });
  });
});
