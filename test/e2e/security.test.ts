/**
 * Sandboxes, callbacks and limits through the whole system (real processes, real Redis): the
 * agent's environment holds only the variables of docs/agent-environment.md#environment-variables, output is bounded, a fork bomb or an
 * agent ignoring SIGTERM leaves no process behind, a symlink cannot make an evaluator read a host
 * file, callbacks and http evaluators cannot reach link-local / metadata addresses, the session
 * limits stop a real agent, and no token reaches the apps' logs (LOG_LEVEL debug).
 */
import { spawnSync } from "node:child_process";
import { createHmac, randomInt, randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import type { TaskRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { poll, terminalTask } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

const prefix = uniquePrefix("security");
const API_KEY = `key-${randomUUID()}`;
const WORKER_SECRET = `worker-secret-${randomUUID()}`;
let engine: StartedChild;
let gateway: StartedChild;
let worker: StartedChild;
const logs: string[] = [];
const hostDir = mkdtempSync(path.join(os.tmpdir(), "rg-sec-host-"));

function capture(c: StartedChild) {
  c.proc.stderr!.on("data", (b: Buffer) => logs.push(b.toString("utf8")));
  c.proc.stdout!.on("data", (b: Buffer) => logs.push(b.toString("utf8")));
}

beforeAll(async () => {
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
  gateway = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_API_KEY: API_KEY,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]),
    LOG_LEVEL: "debug",
  });
  worker = await startApp("worker", [], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_API_KEY: API_KEY,
    ROLLGATE_GATEWAY_URL: gateway.ready,
    ROLLGATE_WORKER_NAME: "sec-w",
    ROLLGATE_WORKER_CONCURRENCY: "4",
    ROLLGATE_CALLBACK_BACKOFF_MS: "100",
    WORKER_SECRET,
    AWS_SECRET_ACCESS_KEY: WORKER_SECRET,
    LOG_LEVEL: "debug",
  });
  capture(gateway);
  capture(worker);
}, 90_000);

afterAll(async () => {
  await Promise.all([worker, gateway, engine].map((c) => c && stopChild(c.proc, 5_000)));
  await dropPrefix(prefix);
  rmSync(hostDir, { recursive: true, force: true });
});

async function api(p: string, init: { method?: string; body?: unknown } = {}) {
  const res = await fetch(`${gateway.ready}${p}`, {
    method: init.method ?? (init.body !== undefined ? "POST" : "GET"),
    headers: { authorization: `Bearer ${API_KEY}`, ...(init.body !== undefined ? { "content-type": "application/json" } : {}) },
    ...(init.body !== undefined ? { body: JSON.stringify(init.body) } : {}),
  });
  const text = await res.text();
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  let body: any = text;
  try {
    body = JSON.parse(text);
  } catch {
    // text
  }
  return { status: res.status, body };
}

async function submit(task: Record<string, unknown>): Promise<string> {
  const res = await api("/v1/tasks", { body: { evaluator: { kind: "none" }, limits: { timeout_s: 60 }, ...task } });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  return res.body.id as string;
}

const terminal = (id: string, timeoutMs = 60_000) => terminalTask(api, id, timeoutMs, 200);

function survivors(marker: string): string[] {
  return spawnSync("pgrep", ["-f", marker]).stdout.toString().trim().split("\n").filter(Boolean);
}

let dumpedToken = "";

describe("the sandbox", () => {
  it("gives the agent exactly the documented environment (docs/agent-environment.md): none of the worker's own variables or secrets", async () => {
    const id = await submit({ instruction: "dump the environment", agent: { harness: "command", command: ["env"], env: { MY_TASK_VAR: "1" } } });
    const r = await terminal(id);
    expect(r.status).toBe("completed");
    const env = Object.fromEntries(
      r.result!.agent.log_tail
        .split("\n")
        .filter((l) => /^[A-Za-z_][A-Za-z0-9_]*=/.test(l))
        .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]),
    );
    expect(Object.keys(env).sort()).toEqual(
      [
        "PATH", "HOME", "TMPDIR", "LANG",
        "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY",
        "ROLLGATE_SESSION_ID", "ROLLGATE_TASK_ID", "ROLLGATE_INSTRUCTION", "MY_TASK_VAR",
      ].sort(),
    );
    const values = Object.values(env).join("\n");
    for (const secret of [API_KEY, WORKER_SECRET, "redis://"]) expect(values).not.toContain(secret);
    expect(env.OPENAI_API_KEY).toBe(env.ANTHROPIC_API_KEY);
    expect(env.ROLLGATE_TASK_ID).toBe(id);
    dumpedToken = env.OPENAI_API_KEY!;
    expect(dumpedToken.length).toBeGreaterThan(20);
  });

  it("bounds what it keeps of an agent's output (20 MB printed: a 16 KiB tail in the result, 256 KiB of live logs)", async () => {
    const id = await submit({
      instruction: "flood",
      agent: { harness: "command", command: ["bash", "-c", "head -c 10000000 /dev/zero | tr '\\0' o; head -c 10000000 /dev/zero | tr '\\0' e >&2; echo END"] },
    });
    const r = await terminal(id);
    expect(r.status).toBe("completed");
    expect(r.result!.agent.log_tail.length).toBeLessThanOrEqual(16_384);
    expect(r.result!.agent.log_tail).toContain("END");
    const live = await api(`/v1/tasks/${id}/logs`);
    expect(String(live.body).length).toBeLessThanOrEqual(256 * 1024);
  });

  it("a bounded fork bomb that ignores SIGTERM is gone after the timeout: no process left", async () => {
    const marker = String(9_000_000 + randomInt(900_000));
    // 2^7 shells, each ending as `sleep <marker>`; every one ignores SIGTERM. ulimit caps it (for non-root).
    const script = `ulimit -u 4096 2>/dev/null; trap '' TERM; f(){ if [ "$1" -gt 0 ]; then f $(($1-1)) & f $(($1-1)) & fi; exec sleep ${marker}; }; f 7`;
    const id = await submit({ instruction: "bomb", agent: { harness: "command", command: ["bash", "-c", script] }, limits: { timeout_s: 4 } });
    await poll(async () => survivors(marker).length, (n) => n >= 100, 20_000, 200);
    expect(survivors(marker).length).toBeGreaterThanOrEqual(100);
    const r = await terminal(id, 30_000);
    expect(r.status).toBe("timed_out");
    const left = await poll(async () => survivors(marker), (s) => s.length === 0, 10_000, 200);
    expect(left).toEqual([]);
  }, 60_000);

  it("an agent that ignores SIGTERM is gone after a cancel: no process left", async () => {
    const marker = String(8_000_000 + randomInt(900_000));
    const id = await submit({
      instruction: "stubborn",
      agent: { harness: "command", command: ["bash", "-c", `trap '' TERM; sleep ${marker} & sleep ${marker} & wait; wait`] },
      limits: { timeout_s: 120 },
    });
    await poll(async () => survivors(marker).length, (n) => n >= 2, 20_000, 200);
    expect((await api(`/v1/tasks/${id}`, { method: "DELETE" })).status).toBe(202);
    const r = await terminal(id, 30_000);
    expect(r.status).toBe("cancelled");
    expect(await poll(async () => survivors(marker), (s) => s.length === 0, 10_000, 200)).toEqual([]);
  }, 60_000);

  it("a symlink to a host file reads as absent to the evaluator; runtime.files cannot climb out", async () => {
    const hostFile = path.join(hostDir, "host-secret.txt");
    writeFileSync(hostFile, "host secret");
    const id = await submit({
      instruction: "link",
      agent: { harness: "command", command: ["true"] },
      runtime: { files: { "ok.txt": "fine" }, prepare: [["ln", "-s", hostFile, "answer.txt"]] },
      evaluator: { kind: "file", path: "answer.txt", regex: "secret" },
    });
    const r = await terminal(id);
    expect(r.status).toBe("completed");
    expect(r.result!.reward).toBe(0);
    expect(r.result!.evaluation!.details).toMatchObject({ exists: false, matched: false });
    for (const p of ["../escape.txt", "/etc/escape.txt", "a/../../escape.txt"]) {
      const res = await api("/v1/tasks", { body: { instruction: "x", agent: { harness: "command", command: ["true"] }, runtime: { files: { [p]: "x" } } } });
      expect(res.status).toBe(400);
      expect(res.body.error.message).toContain("runtime.files");
    }
  });
});

describe("where the worker may send requests", () => {
  it("delivers to an allowed (loopback) trainer with a valid HMAC, and never sends to link-local / metadata: delivery state failed, with the reason", async () => {
    const trainer = await startTrainer();
    try {
      const secret = "s3cret";
      const ok = await submit({ instruction: "x", agent: { harness: "command", command: ["true"] }, callback: { url: trainer.url, secret } });
      const metaIds = [];
      for (const url of ["http://169.254.169.254/latest/meta-data/iam/", "http://metadata.google.internal/computeMetadata/v1/", "http://[fd00:ec2::254]/latest/"]) {
        metaIds.push([url, await submit({ instruction: "x", agent: { harness: "command", command: ["true"] }, callback: { url, secret } })] as const);
      }
      const [got] = await trainer.waitFor(1, 30_000);
      expect(got!.headers["x-rollgate-signature"]).toBe(`sha256=${createHmac("sha256", secret).update(got!.rawBody).digest("hex")}`);
      expect(JSON.parse(got!.rawBody).id).toBe(ok);
      for (const [url, id] of metaIds) {
        const r = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.callback?.state === "failed", 20_000, 200);
        expect(r.status).toBe("completed");
        expect(r.callback, url).toMatchObject({ state: "failed", attempts: 1, last_error: expect.stringMatching(/denie/) });
        expect(r.callback!.last_error).toContain("callback.url");
      }
    } finally {
      await trainer.close();
    }
  });

  it("an http evaluator aimed at the metadata address fails the task with the reason", async () => {
    const id = await submit({ instruction: "x", agent: { harness: "command", command: ["true"] }, evaluator: { kind: "http", url: "http://169.254.169.254/latest/meta-data/" } });
    const r = await terminal(id);
    expect(r.status).toBe("failed");
    expect(r.result!.error).toMatchObject({ kind: "evaluator_error", message: expect.stringMatching(/evaluator\.url.*denie/) });
  });
});

describe("session limits stop a real agent", () => {
  const steps = (n: number) => JSON.stringify(Array.from({ length: n }, (_, i) => ({ tool_calls: [{ name: "shell", arguments: { command: `echo step${i}` } }] })));

  it("max_llm_calls: the third call is refused in OpenAI's shape; the agent sees it and the result counts 2 calls", async () => {
    const id = await submit({
      instruction: `loop\n#sim: ${steps(5)}`,
      agent: { harness: "command", command: ["rollgate-example-agent"] },
      limits: { timeout_s: 60, max_llm_calls: 2 },
    });
    const r = await terminal(id);
    expect(r.status).toBe("completed");
    expect(r.result!.usage.llm_calls).toBe(2);
    expect(r.result!.agent.exit_code).not.toBe(0);
    expect(r.result!.agent.log_tail).toMatch(/max_llm_calls/);
    expect(r.result!.trajectory!.traces.flatMap((t) => t.completion_ids)).toHaveLength(2);
  });

  it("max_total_tokens: a call whose prompt does not fit in what is left is refused; the session never passes the limit", async () => {
    const task = (limits: Record<string, number>) =>
      submit({ instruction: `loop\n#sim: ${steps(5)}`, agent: { harness: "command", command: ["rollgate-example-agent"] }, limits: { timeout_s: 60, ...limits } });
    // What the first call uses, measured on a run stopped after it.
    const probe = (await terminal(await task({ max_llm_calls: 1 }))).result!.usage;
    const first = probe.prompt_tokens + probe.completion_tokens;
    const r = await terminal(await task({ max_total_tokens: first + 5 }));
    expect(r.result!.usage.llm_calls).toBe(1);
    expect(r.result!.usage.prompt_tokens + r.result!.usage.completion_tokens).toBe(first);
    expect(r.result!.agent.log_tail).toMatch(/max_total_tokens/);
  });
});

describe("logs", () => {
  it("no session token or API key appears in the gateway's or worker's output (LOG_LEVEL debug)", async () => {
    expect(dumpedToken).not.toBe("");
    const all = logs.join("");
    expect(all.length).toBeGreaterThan(1000);
    expect(all).not.toContain(dumpedToken);
    expect(all).not.toContain(API_KEY);
    expect(all).not.toContain(WORKER_SECRET);
  });
});
