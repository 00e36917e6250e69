/**
 * Chaos: the Redis every app uses (a redis-server this test starts on its own port, AOF fsynced
 * on every write) is SIGKILLed mid-batch and restarted on the same port and folder. The gateway
 * and workers reconnect by themselves; queued tasks survive the restart; every task ends
 * terminal and none is stuck; the apps stay up and the gateway is ready again.
 */
import { spawnSync } from "node:child_process";
import type { StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { uniquePrefix } from "../support/redis.js";
import { byStatus, readTasks, startOwnRedis, waitAllTerminal, type OwnRedis } from "./support.js";

const hasRedisServer = spawnSync("redis-server", ["--version"]).status === 0;
const prefix = uniquePrefix("chaos-redis");
const procs: StartedChild[] = [];
let redis: OwnRedis;
let gatewayUrl = "";
const api = apiClient(() => gatewayUrl);

beforeAll(async () => {
  if (!hasRedisServer) return;
  redis = await startOwnRedis();
  const env = { REDIS_URL: redis.url, ROLLGATE_KEY_PREFIX: prefix };
  const engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
  procs.push(engine);
  const gw = await startApp("gateway", ["--port", "0"], { ...env, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]) });
  procs.push(gw);
  gatewayUrl = gw.ready;
  for (let i = 0; i < 2; i++) {
    procs.push(
      await startApp("worker", [], {
        ...env,
        ROLLGATE_GATEWAY_URL: gw.ready,
        ROLLGATE_WORKER_NAME: `rw${i}`,
        ROLLGATE_WORKER_CONCURRENCY: "3",
        ROLLGATE_JOB_LOCK_MS: "5000",
        ROLLGATE_STALLED_INTERVAL_MS: "2000",
      }),
    );
  }
}, 60_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => stopChild(p.proc, 5_000)));
  await redis?.stop();
});

describe.skipIf(!hasRedisServer)("Redis restarted during a batch (needs redis-server)", () => {
  it("apps reconnect on their own; queued tasks survive; every task ends terminal", async () => {
    const task = {
      instruction: 'answer\n#sim: [{"text": "done"}]',
      agent: { harness: "command", command: ["bash", "-c", "sleep 0.$((RANDOM % 9 + 1)); rollgate-example-agent"] },
      evaluator: { kind: "command", command: ["true"] },
      limits: { timeout_s: 60 },
    };
    const res = await api("/v1/tasks/batch", { body: { group_id: "g-redis", n: 40, task } });
    expect(res.status).toBe(202);
    const ids = (res.body.tasks as { id: string }[]).map((t) => t.id);

    await poll(async () => byStatus(await readTasks(api, ids)).completed ?? 0, (c) => c >= 6, 60_000, 300);
    const before = byStatus(await readTasks(api, ids));
    expect(before.queued ?? 0).toBeGreaterThan(0); // some tasks are still queued when Redis dies
    await redis.kill();
    // Down for a few seconds: the gateway says so, nobody crashes.
    await new Promise((r) => setTimeout(r, 3_000));
    const down = await fetch(`${gatewayUrl}/readyz`).catch(() => null);
    expect(down?.status).toBe(503);
    await redis.start();

    expect((await poll(async () => (await fetch(`${gatewayUrl}/readyz`)).status, (s) => s === 200, 30_000, 300))).toBe(200);
    const records = await waitAllTerminal(api, ids, 180_000);
    const counts = byStatus(records);
    console.log(`chaos redis: before the kill ${JSON.stringify(before)}; after ${JSON.stringify(counts)}`);
    expect(records.filter((r) => r.result !== null)).toHaveLength(40);
    expect(counts.queued ?? 0).toBe(0);
    expect(counts.running ?? 0).toBe(0);
    // The tasks still queued at the kill survived it and ran: most of the batch completes.
    expect(counts.completed ?? 0).toBeGreaterThanOrEqual(30);
    for (const r of records) if (r.status !== "completed") expect(r.result!.error).not.toBeNull();
    for (const p of procs) expect(p.proc.exitCode, `${p.name} exited`).toBeNull();

    // And the fleet still takes new work.
    const after = await api("/v1/tasks", { body: task });
    const done = await waitAllTerminal(api, [after.body.id as string], 60_000);
    expect(done[0]!.status).toBe("completed");
  }, 300_000);
});
