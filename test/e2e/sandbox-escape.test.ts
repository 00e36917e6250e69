/**
 * A hostile agent in a local bubblewrap sandbox, for real: engine-sim, the gateway and a worker
 * run as processes on real Redis (the gateway without an API key, so only the sandbox stands
 * between the agent and the trainer routes). The agent is a small program
 * (apps/worker/src/sandbox/__fixtures__/escape-probe.mjs) that makes its LLM calls through the
 * gateway, streamed and not, then tries every way out: Redis, engine-sim's port, the gateway's
 * port, its trainer and admin routes, another session and that session's relay socket (the
 * worker's listening socket for another sandbox), the metadata address, the worker's
 * environment and its config and key files. Every attempt must fail; the calls must succeed.
 *
 * A worker that cannot seal the network (no bubblewrap on its PATH) says so when it starts and
 * fails a task that needs a sealed network with `sandbox_unavailable`.
 */
import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { chmodSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { startChild, type StartedChild } from "@rollgate/testkit";
import type { CompletionRecord, TaskRecord } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { REPO_ROOT } from "../support/cluster.js";
import { poll } from "../support/poll.js";
import { TEST_REDIS_URL, dropPrefix, uniquePrefix } from "../support/redis.js";

const PROBE = readFileSync(path.join(REPO_ROOT, "apps/worker/src/sandbox/__fixtures__/escape-probe.mjs"), "utf8");
const sealable = spawnSync("bwrap", ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-net", "true"]).status === 0;
const WHY_NOT = "bubblewrap with network namespaces is not available on this machine (CI installs it)";

const prefix = uniquePrefix("escape");
const WORKER_SECRET = `worker-secret-${randomUUID()}`;
const sandboxRoot = mkdtempSync(path.join(os.tmpdir(), "rg-escape-sandboxes-"));
// A root worker's sandboxes run as an unprivileged user, who must pass through it (as through /tmp).
chmodSync(sandboxRoot, 0o711);
// The worker's configuration: a key file and an env file beside it, where a worker keeps them.
const configDir = mkdtempSync("/var/tmp/rg-escape-worker-config-");
const keyFile = path.join(configDir, "worker.key");
const envFile = path.join(configDir, "worker.env");
let engine: StartedChild;
let gateway: StartedChild;
let worker: StartedChild;

beforeAll(async () => {
  writeFileSync(keyFile, `-----BEGIN PRIVATE KEY-----\n${WORKER_SECRET}\n`, { mode: 0o600 });
  writeFileSync(envFile, `REDIS_URL=${TEST_REDIS_URL}\nWORKER_SECRET=${WORKER_SECRET}\n`, { mode: 0o600 });
  if (!sealable) return;
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "1"], {});
  gateway = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 1, profile: "qwen3" }]),
  });
  worker = await startApp("worker", [], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_GATEWAY_URL: gateway.ready,
    ROLLGATE_WORKER_NAME: "escape-w",
    ROLLGATE_WORKER_CONCURRENCY: "2",
    ROLLGATE_SANDBOX_ROOT: sandboxRoot,
    WORKER_SECRET,
    ROLLGATE_WORKER_KEY_FILE: keyFile,
    ROLLGATE_WORKER_ENV_FILE: envFile,
  });
}, 90_000);

afterAll(async () => {
  await Promise.all([worker, gateway, engine].map((c) => c && stopChild(c.proc, 5_000)));
  await dropPrefix(prefix);
  rmSync(sandboxRoot, { recursive: true, force: true });
  rmSync(configDir, { recursive: true, force: true });
});

async function api(url: string, p: string, init: { method?: string; body?: unknown } = {}) {
  const res = await fetch(`${url}${p}`, {
    method: init.method ?? (init.body !== undefined ? "POST" : "GET"),
    headers: init.body !== undefined ? { "content-type": "application/json" } : {},
    ...(init.body !== undefined ? { body: JSON.stringify(init.body) } : {}),
  });
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  return { status: res.status, body: (await res.json()) as any };
}

async function submit(url: string, task: Record<string, unknown>): Promise<string> {
  const res = await api(url, "/v1/tasks", { body: { evaluator: { kind: "none" }, limits: { timeout_s: 90 }, ...task } });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  return res.body.id as string;
}

const terminal = (url: string, id: string, timeoutMs = 60_000) =>
  poll(async () => (await api(url, `/v1/tasks/${id}`)).body as TaskRecord, (t) => t.result !== null, timeoutMs, 200);

function results(logTail: string): Record<string, Record<string, unknown>> {
  const out: Record<string, Record<string, unknown>> = {};
  for (const line of logTail.split("\n").filter((l) => l.startsWith('{"probe"'))) {
    const o = JSON.parse(line) as Record<string, unknown>;
    out[o.probe as string] = o;
  }
  return out;
}

describe.skipIf(!sealable)(`a hostile agent in a sealed local sandbox${sealable ? "" : ` (skipped: ${WHY_NOT})`}`, () => {
  it("makes its LLM calls through the gateway (streamed and not), and every way out fails", async () => {
    // Another rollout, still running while the attacker looks for its relay.
    const other = await submit(gateway.ready, { instruction: "wait", agent: { harness: "command", command: ["sleep", "60"] }, runtime: { isolation: "bwrap" } });
    const otherRecord = await poll(async () => (await api(gateway.ready, `/v1/tasks/${other}`)).body as TaskRecord, (t) => t.status === "running" && !!t.session_id, 30_000, 200);
    const otherRelay = await poll(
      async () => readdirSync(sandboxRoot).find((d) => d.startsWith(`rollgate-relay-${other}`)),
      (d) => d !== undefined,
      10_000,
      100,
    );
    const otherSocket = path.join(sandboxRoot, otherRelay!, "gateway.sock");

    const enginePort = new URL(engine.ready).port;
    const gatewayPort = new URL(gateway.ready).port;
    const redisPort = new URL(TEST_REDIS_URL).port || "6379";
    const auth = { authorization: "Bearer $OPENAI_API_KEY" };
    const chat = (stream: boolean) => ({ model: "m", messages: [{ role: "user", content: `hello\n#sim: [{"text": "hi ${stream ? "streamed" : "plain"}"}]` }], max_tokens: 16, stream });
    const plan = [
      { kind: "http", name: "chat", url: "$OPENAI_BASE_URL/chat/completions", method: "POST", headers: auth, body: chat(false) },
      { kind: "http", name: "chat stream", url: "$OPENAI_BASE_URL/chat/completions", method: "POST", headers: auth, body: chat(true) },
      { kind: "tcp", name: "redis", host: "127.0.0.1", port: Number(redisPort) },
      { kind: "tcp", name: "engine", host: "127.0.0.1", port: Number(enginePort) },
      { kind: "tcp", name: "gateway port", host: "127.0.0.1", port: Number(gatewayPort) },
      { kind: "tcp", name: "metadata", host: "169.254.169.254", port: 80 },
      { kind: "tcp", name: "other relay", path: otherSocket },
      { kind: "http", name: "engine route via relay", url: "$ORIGIN/pause", method: "POST" },
      { kind: "http", name: "tasks", url: "$ORIGIN/v1/tasks" },
      { kind: "http", name: "submit a task", url: "$ORIGIN/v1/tasks", method: "POST", body: { instruction: "x", agent: { harness: "command", command: ["true"] } } },
      { kind: "http", name: "admin engines", url: "$ORIGIN/admin/engines" },
      { kind: "http", name: "admin pause", url: "$ORIGIN/admin/inference/pause", method: "POST", body: { mode: "abort" } },
      { kind: "http", name: "admin weights", url: "$ORIGIN/admin/weights", method: "POST", body: { version: "hacked" } },
      { kind: "http", name: "metrics", url: "$ORIGIN/metrics" },
      { kind: "http", name: "own session record", url: "$ORIGIN/v1/sessions/$ROLLGATE_SESSION_ID" },
      { kind: "http", name: "other session", url: `$ORIGIN/s/${otherRecord.session_id}/v1/models`, headers: auth },
      { kind: "http", name: "climb out", url: "$ORIGIN", rawPath: "/s/$ROLLGATE_SESSION_ID/../../v1/tasks" },
      { kind: "http", name: "proxy to the gateway", url: `${gateway.ready}/v1/tasks`, proxy: "$ORIGIN" },
      { kind: "tunnel", name: "tunnel to redis", target: `127.0.0.1:${redisPort}`, proxy: "$ORIGIN" },
      { kind: "environ", name: "environ", needleReversed: [...WORKER_SECRET].reverse().join("") },
      { kind: "read", name: "worker environ", path: `/proc/${worker.proc.pid}/environ` },
      { kind: "read", name: "key file", path: keyFile },
      { kind: "read", name: "env file", path: envFile },
    ];
    const id = await submit(gateway.ready, {
      instruction: "escape",
      agent: { harness: "command", command: ["node", "probe.mjs"], env: { PROBE_PLAN: JSON.stringify(plan) } },
      runtime: { isolation: "bwrap", files: { "probe.mjs": PROBE } },
    });
    const r = await terminal(gateway.ready, id);
    expect(r.status, JSON.stringify(r.result?.error)).toBe("completed");
    expect(r.result!.agent.exit_code, r.result!.agent.log_tail).toBe(0);
    const res = results(r.result!.agent.log_tail);

    // Its own calls work, and were recorded.
    expect(res.chat!.status, JSON.stringify(res.chat)).toBe(200);
    expect(JSON.parse(res.chat!.body as string).choices[0].message.content).toBe("hi plain");
    expect(res["chat stream"]!.status).toBe(200);
    expect(res["chat stream"]!.body).toMatch(/^data: /);
    expect(res["chat stream"]!.body).toContain("streamed");
    expect(res["chat stream"]!.body).toContain("[DONE]");
    const records = (await api(gateway.ready, `/v1/sessions/${r.session_id}/completions`)).body.completions as CompletionRecord[];
    expect(records).toHaveLength(2);
    expect(r.result!.usage.llm_calls).toBe(2);

    // Every way out fails.
    for (const name of ["redis", "engine", "gateway port", "metadata"]) {
      expect(res[name], name).toMatchObject({ connected: false });
      expect(["ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH"], `${name}: ${String(res[name]!.code)}`).toContain(res[name]!.code);
    }
    expect(res["other relay"]).toMatchObject({ connected: false, code: "ENOENT" });
    for (const name of ["engine route via relay", "tasks", "submit a task", "admin engines", "admin pause", "admin weights", "metrics", "own session record", "other session", "climb out", "proxy to the gateway", "tunnel to redis"]) {
      expect(res[name]!.status, `${name}: ${JSON.stringify(res[name])}`).toBe(403);
    }
    expect(res.environ).toMatchObject({ holding: 0 });
    for (const name of ["worker environ", "key file", "env file"]) expect(res[name], name).toMatchObject({ read: false, code: "ENOENT" });

    // None of it happened: no task was submitted from inside, inference is not paused, the weights are as they were.
    const tasks = (await api(gateway.ready, "/v1/tasks")).body.tasks as TaskRecord[];
    expect(tasks.map((t) => t.id).sort()).toEqual([id, other].sort());
    expect((await api(gateway.ready, "/admin/inference")).body).toMatchObject({ paused: null });
    expect((await api(gateway.ready, "/admin/weights")).body.version).not.toBe("hacked");

    expect((await api(gateway.ready, `/v1/tasks/${other}`, { method: "DELETE" })).status).toBe(202);
    await terminal(gateway.ready, other);
    // Both sandboxes and both relays are gone.
    await poll(async () => readdirSync(sandboxRoot), (l) => l.length === 0, 10_000, 200);
  }, 120_000);

  it("an unmodified SDK agent (the example ReAct agent on the openai SDK) does its task in a sealed sandbox, with a token-exact trajectory", async () => {
    const task = JSON.parse(readFileSync(path.join(REPO_ROOT, "examples/react-agent/task.json"), "utf8")) as Record<string, unknown>;
    const id = await submit(gateway.ready, { ...task, runtime: { isolation: "bwrap" } });
    const r = await terminal(gateway.ready, id);
    expect(r.status, r.result?.agent.log_tail).toBe("completed");
    expect(r.result!.reward).toBe(1);
    expect(r.result!.usage.llm_calls).toBe(2);
    expect(r.result!.trajectory!.traces).toHaveLength(1);
    expect(r.result!.trajectory!.stats).toMatchObject({ breaks: [] });
  }, 60_000);
});

describe("a worker that cannot seal the network", () => {
  it("says so when it starts, and fails a task that needs a sealed sandbox with sandbox_unavailable (not a crash)", async () => {
    const p = uniquePrefix("nobwrap");
    const sim = engine ?? (await startApp("engine-sim", ["--port", "0", "--dp", "1"], {}));
    const gw = await startApp("gateway", ["--port", "0"], { ROLLGATE_KEY_PREFIX: p, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: sim.ready, dp_size: 1 }]) });
    // No bubblewrap on its PATH: nothing can be sealed here.
    const w = await startChild(
      "worker-nobwrap",
      process.execPath,
      [path.join(REPO_ROOT, "apps/worker/dist/main.js")],
      {
        env: { ...process.env, PATH: "/nonexistent", REDIS_URL: TEST_REDIS_URL, LOG_LEVEL: "warn", ROLLGATE_KEY_PREFIX: p, ROLLGATE_GATEWAY_URL: gw.ready, ROLLGATE_WORKER_NAME: "nobwrap-w" },
        ready: /^(sandbox: .*)$/,
      },
    );
    try {
      expect(w.ready).toMatch(/bubblewrap cannot start a sandbox here/);
      expect(w.ready).toMatch(/runtime\.isolation "bwrap" are refused \(sandbox_unavailable\)/);
      const sealed = await submit(gw.ready, { instruction: "x", agent: { harness: "command", command: ["true"] }, runtime: { isolation: "bwrap" } });
      const plain = await submit(gw.ready, { instruction: "x", agent: { harness: "command", command: ["true"] } });
      const r = await terminal(gw.ready, sealed);
      expect(r.status).toBe("failed");
      expect(r.result!.error).toMatchObject({ kind: "sandbox_unavailable", message: expect.stringMatching(/runtime\.isolation is bwrap but bubblewrap cannot start a sandbox here/) });
      expect(r.result!.reward).toBeNull();
      // The worker is still up and runs what it can.
      expect((await terminal(gw.ready, plain)).status).toBe("completed");
      // A local sandbox without isolation cannot be sealed at all: refused when submitted.
      const res = await api(gw.ready, "/v1/tasks", { body: { instruction: "x", agent: { harness: "command", command: ["true"] }, runtime: { network: "sealed" } } });
      expect(res.status).toBe(400);
      expect(res.body.error.message).toMatch(/runtime\.network.*needs runtime\.isolation "bwrap"/);
    } finally {
      await stopChild(w.proc, 5_000);
      await stopChild(gw.proc, 5_000);
      if (!engine) await stopChild(sim.proc, 5_000);
      await dropPrefix(p);
    }
  }, 90_000);
});
