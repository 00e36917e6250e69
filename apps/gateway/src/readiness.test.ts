/**
 * `/readyz` means able to serve: 503 with the reason per engine until every configured engine has
 * a rank that answers and a known served model, 200 after. The gateway in-process on the real
 * Redis, engine-sim started later on the port the gateway was told.
 */
import { buildEngineSim, getSimState } from "@rollgate/engine-sim";
import type { Readiness } from "@rollgate/protocol";
import { freePort } from "@rollgate/testkit";
import type { FastifyInstance } from "fastify";
import { afterAll, describe, expect, it } from "vitest";
import { startSimFleet, type SimFleet } from "./__fixtures__/harness.js";

async function readiness(app: FastifyInstance): Promise<{ status: number; body: Readiness }> {
  const res = await app.inject({ url: "/readyz" });
  return { status: res.statusCode, body: res.json() as Readiness };
}

async function until(app: FastifyInstance, status: number, also: (r: Readiness) => boolean = () => true, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  let last = await readiness(app);
  while ((last.status !== status || !also(last.body)) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    last = await readiness(app);
  }
  return last;
}

const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const close of closers.reverse()) await close();
});

describe("/readyz", () => {
  it("is 503 with the reason per engine while the engine does not answer, and 200 once it does", async () => {
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    const fleet: SimFleet = await startSimFleet("ready");
    closers.push(() => fleet.close());
    // Periodic probes off: readiness probes run on their own until the engine is ready.
    const app = await fleet.gateway({ engines: [{ kind: "vllm", url, dp_size: 2 }], env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
    closers.push(() => app.close());

    const before = await until(app, 503);
    expect(before.status).toBe(503);
    expect(before.body).toMatchObject({ status: "unavailable", redis: "ok" });
    expect(before.body.engines).toEqual([expect.objectContaining({ engine: 0, kind: "vllm", url, ready: false, model: null, ranks: 2, healthy_ranks: 0 })]);
    expect(before.body.reason).toContain(`engine 0 (vllm ${url}): no rank answers`);
    expect(before.body.engines[0]!.reason).toMatch(/rank 0: .*(ECONNREFUSED|not probed yet)/);
    expect(before.body.engines[0]!.reason).toMatch(/model (unknown|not read yet)/);

    const sim = buildEngineSim({ dpSize: 2, model: "Qwen/Qwen3-8B" });
    await sim.listen({ port, host: "127.0.0.1" });
    closers.push(() => sim.close());
    // Ready once one rank answers; the other is probed until it has answered too.
    const after = await until(app, 200, (r) => r.engines[0]!.healthy_ranks === 2);
    expect(after.status).toBe(200);
    expect(after.body).toEqual({
      status: "ready",
      reason: null,
      redis: "ok",
      engines: [{ engine: 0, kind: "vllm", url, ready: true, model: "Qwen/Qwen3-8B", ranks: 2, healthy_ranks: 2, reason: null }],
    });
  });

  it("goes back to 503 when every rank of an engine is drained, and to 200 when one answers again", async () => {
    const fleet = await startSimFleet("ready-drain", { dpSize: 2 });
    closers.push(() => fleet.close());
    const app = await fleet.gateway({ env: { ROLLGATE_HEALTH_INTERVAL_S: "0.2", ROLLGATE_HEALTH_FAILURES: "1" } });
    closers.push(() => app.close());
    expect((await until(app, 200)).status).toBe(200);

    getSimState(fleet.sim).setFault({ mode: "down" });
    const drained = await until(app, 503);
    expect(drained.status).toBe(503);
    expect(drained.body.engines[0]).toMatchObject({ ready: false, healthy_ranks: 0, model: "Qwen/Qwen3-8B" });
    expect(drained.body.engines[0]!.reason).toMatch(/rank 0: drained \(503/);

    getSimState(fleet.sim).setFault({ mode: "none" });
    expect((await until(app, 200, (r) => r.engines[0]!.healthy_ranks === 2)).body.engines[0]).toMatchObject({ ready: true, healthy_ranks: 2 });
  });
});
