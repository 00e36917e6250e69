/**
 * Redis with a password, as docker-compose.yml (and deploy/k8s/redis.yaml) run it: a private
 * redis-server started with the compose file's own arguments (its ACL: "default" off, rollgate's
 * user limited to its key prefix and no dangerous command), and a gateway, a worker and
 * engine-sim that reach it through REDIS_URL with the user and password. A rollout runs end to
 * end through that user; what the ACL forbids is refused by Redis itself.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { freePort, type StartedChild } from "@rollgate/testkit";
import type { TaskRecord } from "@rollgate/protocol";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { startApp, stopChild } from "../support/apps.js";
import { REPO_ROOT } from "../support/cluster.js";
import { poll } from "../support/poll.js";
import { uniquePrefix } from "../support/redis.js";

const hasRedisServer = spawnSync("redis-server", ["--version"]).status === 0;
const prefix = uniquePrefix("acl");
const password = randomBytes(24).toString("hex");
let dir = "";
let redis: ChildProcess | null = null;
let redisUrl = "";
let engine: StartedChild;
let gateway: StartedChild;
let worker: StartedChild;

/** The redis service's command in docker-compose.yml, with the password and the tests' key prefix put in. */
function composeRedisArgs(): string[] {
  const doc = parse(readFileSync(path.join(REPO_ROOT, "docker-compose.yml"), "utf8"), { merge: true }) as { services: { redis: { command: string[] } } };
  return doc.services.redis.command.slice(1).map((a) =>
    a
      .replace(/\$\{REDIS_PASSWORD[^}]*\}/, password)
      .replace(/^~rg:\*$/, `~${prefix}:*`)
      .replace(/^~\{rg:\*$/, `~{${prefix}:*`)
      .replace(/^&rg:\*$/, `&${prefix}:*`),
  );
}

beforeAll(async () => {
  if (!hasRedisServer) return;
  dir = mkdtempSync(path.join(os.tmpdir(), "rg-acl-redis-"));
  const port = await freePort();
  // Compose's own arguments; then a private port, folder and no persistence for the test.
  redis = spawn("redis-server", [...composeRedisArgs(), "--port", String(port), "--bind", "127.0.0.1", "--dir", dir, "--appendonly", "no", "--save", ""], { stdio: "ignore" });
  redisUrl = `redis://rollgate:${password}@127.0.0.1:${port}`;
  await poll(
    async () => {
      const c = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
      c.on("error", () => undefined); // not up yet
      try {
        await c.connect();
        return await c.ping();
      } catch {
        return "";
      } finally {
        c.disconnect();
      }
    },
    (p) => p === "PONG",
    15_000,
    100,
  );
  const common = { REDIS_URL: redisUrl, ROLLGATE_KEY_PREFIX: prefix };
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "1"], {});
  gateway = await startApp("gateway", ["--port", "0"], { ...common, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 1 }]) });
  worker = await startApp("worker", [], { ...common, ROLLGATE_GATEWAY_URL: gateway.ready, ROLLGATE_WORKER_NAME: "acl-w" });
}, 90_000);

afterAll(async () => {
  await Promise.all([worker, gateway, engine].map((c) => c && stopChild(c.proc, 5_000)));
  redis?.kill("SIGKILL");
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe.skipIf(!hasRedisServer)(`Redis with compose's password and ACL${hasRedisServer ? "" : " (skipped: no redis-server binary to start a private Redis with those arguments)"}`, () => {
  it("runs a rollout end to end as rollgate's ACL user", async () => {
    const submit = await fetch(`${gateway.ready}/v1/tasks`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        instruction: 'say hi\n#sim: [{"text": "hi"}]',
        agent: { harness: "command", command: ["rollgate-example-agent"] },
        evaluator: { kind: "none" },
        limits: { timeout_s: 60 },
      }),
    });
    expect(submit.status).toBe(202);
    const { id } = (await submit.json()) as { id: string };
    const r = await poll(async () => (await (await fetch(`${gateway.ready}/v1/tasks/${id}`)).json()) as TaskRecord, (t) => t.result !== null, 60_000, 200);
    expect(r.status, JSON.stringify(r.result?.error)).toBe("completed");
    expect(r.result!.usage.llm_calls).toBe(1);
    expect(r.result!.trajectory!.traces).toHaveLength(1);
  }, 90_000);

  it("refuses what the ACL forbids: no password, other keys, admin and dangerous commands", async () => {
    const port = new URL(redisUrl).port;
    const refusals = async (url: string) => {
      const errors: string[] = [];
      const client = new Redis(url, { maxRetriesPerRequest: 0, lazyConnect: true, retryStrategy: () => null });
      client.on("error", (e: Error) => errors.push(e.message));
      await client.connect().catch((e: Error) => errors.push(e.message));
      await client.get(`${prefix}:x`).catch((e: Error) => errors.push(e.message));
      client.disconnect();
      return errors.join("\n");
    };
    expect(await refusals(`redis://127.0.0.1:${port}`)).toMatch(/NOAUTH/);
    expect(await refusals(`redis://rollgate:not-the-password@127.0.0.1:${port}`)).toMatch(/WRONGPASS/);

    const c = new Redis(redisUrl, { maxRetriesPerRequest: 0 });
    try {
      await c.set(`${prefix}:mine`, "1");
      expect(await c.get(`${prefix}:mine`)).toBe("1");
      await expect(c.get("other-deployment:task")).rejects.toThrow(/NOPERM/);
      for (const cmd of [["flushall"], ["flushdb"], ["config", "get", "requirepass"], ["keys", "*"], ["client", "kill", "id", "1"], ["save"], ["acl", "list"], ["shutdown"], ["module", "list"], ["replicaof", "no", "one"]]) {
        await expect(c.call(cmd[0]!, ...cmd.slice(1)), cmd.join(" ")).rejects.toThrow(/NOPERM/);
      }
      await expect(c.publish("other-deployment:admin", "x")).rejects.toThrow(/NOPERM/);
      // What BullMQ and the queue board need of the dangerous ones.
      expect(await c.info("server")).toMatch(/redis_version/);
      expect(await c.call("client", "list")).toMatch(/user=rollgate/);
    } finally {
      c.disconnect();
    }
  });
});
