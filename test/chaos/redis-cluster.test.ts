/**
 * rollgate on a real three-master Redis Cluster: a batch of tasks runs through gateway, workers
 * and engine-sim while the master that holds the rollouts queue is killed; its replica takes over
 * and no task is lost.
 */
import { spawnSync } from "node:child_process";
import type { TaskRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { uniquePrefix } from "../support/redis.js";
import { startRedisCluster, type LocalRedisCluster } from "../support/redis-cluster.js";

const hasRedis = ["redis-server", "redis-cli"].every((bin) => spawnSync(bin, ["--version"]).status === 0);
const prefix = uniquePrefix("rcluster");
let rc: LocalRedisCluster;
const procs: StartedChild[] = [];
let gatewayUrl = "";
const api = apiClient(() => gatewayUrl);

// ROLLGATE_TEST_LOG_LEVEL=info (or debug) makes the apps log more than warnings (every child's
// output goes to stderr); DEBUG=ioredis:cluster* adds ioredis' own account of slots and redirections.
const childLogLevel: Record<string, string> = process.env.ROLLGATE_TEST_LOG_LEVEL ? { LOG_LEVEL: process.env.ROLLGATE_TEST_LOG_LEVEL } : {};

describe.skipIf(!hasRedis)("Redis Cluster", () => {
  beforeAll(async () => {
    rc = await startRedisCluster();
    const env = { REDIS_URL: rc.url, ROLLGATE_KEY_PREFIX: prefix, ...childLogLevel };
    const engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
    procs.push(engine);
    const gw = await startApp("gateway", ["--port", "0"], {
      ...env,
      ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]),
      ROLLGATE_HEALTH_INTERVAL_S: "0",
    });
    procs.push(gw);
    gatewayUrl = gw.ready;
    for (let i = 0; i < 2; i++) {
      procs.push(await startApp("worker", [], { ...env, ROLLGATE_GATEWAY_URL: gw.ready, ROLLGATE_WORKER_NAME: `cw${i}`, ROLLGATE_WORKER_CONCURRENCY: "3" }));
    }
  }, 90_000);

  afterAll(async () => {
    for (const p of procs.reverse()) await stopChild(p.proc, 5_000);
    await rc?.stop();
  });

  it("runs a batch while a master dies: its replica takes over and every task ends completed", async () => {
    const task = {
      instruction: 'wait then answer\n#sim: [{"text": "done"}]',
      agent: { harness: "command", command: ["bash", "-c", "sleep 0.5; rollgate-example-agent"] },
      evaluator: { kind: "command", command: ["true"] },
      limits: { timeout_s: 60 },
    };
    const res = await api("/v1/tasks/batch", { body: { group_id: "g-rc", n: 30, task } });
    expect(res.status).toBe(202);
    const ids = (res.body.tasks as { id: string }[]).map((t) => t.id);

    // Mid-batch: kill the master that owns the rollouts queue's slot.
    await poll(async () => (await api("/v1/tasks?group_id=g-rc&status=completed&limit=1000")).body.tasks.length, (n) => n >= 5, 30_000);
    const victim = rc.masterFor(`{${prefix}:q:rollouts}:rollouts:wait`);
    // Only a replica that is in sync can take over (and has the queue to take over with).
    await rc.awaitReplicaInSync(victim);
    rc.kill(victim);
    const { how, ms } = await rc.awaitFailover(victim);
    console.log(`[redis-cluster] master ${victim} killed; its replica took over (${how}) ${ms} ms later`);

    const records = await poll(
      async () => Promise.all(ids.map(async (id) => (await api(`/v1/tasks/${id}`)).body as TaskRecord)),
      // A 503 while the cluster elects a new master has no result: keep waiting through it.
      (rs) => rs.every((r) => r?.result != null),
      120_000,
      500,
    );
    const statuses = records.map((r) => r.status);
    expect(statuses.filter((s) => s === "completed")).toHaveLength(30);
    expect(records.every((r) => r.result!.reward === 1)).toBe(true);
  }, 180_000);
});
