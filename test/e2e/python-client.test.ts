/**
 * examples/python/trainer_client.py, run by the machine's python3 against a real cluster: it
 * submits a GRPO group, receives every signed callback (and the group's), refuses a forged one,
 * and prints a summary.
 */
import { spawn, spawnSync } from "node:child_process";
import path from "node:path";
import readline from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO_ROOT, startCluster, type RunningCluster } from "../support/cluster.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const python = spawnSync("python3", ["--version"], { encoding: "utf8" });
const skip = python.status !== 0 ? "python3 is not installed" : null;
if (skip) console.warn(`[python-client.test] SKIPPED: ${skip}`);
const SCRIPT = path.join(REPO_ROOT, "examples/python/trainer_client.py");

describe.skipIf(skip !== null)("the stdlib Python trainer client", () => {
  const prefix = uniquePrefix("pyclient");
  const apiKey = "py-key";
  let cluster: RunningCluster;
  beforeAll(async () => {
    cluster = await startCluster({ ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_API_KEY: apiKey });
  }, 90_000);
  afterAll(async () => {
    await cluster?.stop();
    await dropPrefix(prefix);
  });

  it("submits a GRPO group, verifies every callback's signature, refuses a forgery, and prints the summary", async () => {
    const proc = spawn("python3", [SCRIPT, "--url", cluster.url, "--n", "3", "--json", "--timeout", "90"], {
      env: { ...process.env, ROLLGATE_API_KEY: apiKey },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const stdout: string[] = [];
    const stderr: string[] = [];
    readline.createInterface({ input: proc.stdout! }).on("line", (l) => stdout.push(l));
    let forged: Promise<number> | undefined;
    readline.createInterface({ input: proc.stderr! }).on("line", (l) => {
      stderr.push(l);
      const m = /^callbacks: (\S+)/.exec(l);
      // A forged delivery: right shape, wrong signature. The client must answer 401 and ignore it.
      if (m)
        forged = fetch(m[1]!, {
          method: "POST",
          headers: { "content-type": "application/json", "x-rollgate-event": "task.completed", "x-rollgate-delivery": "forged-1", "x-rollgate-signature": `sha256=${"0".repeat(64)}` },
          body: JSON.stringify({ id: "not-yours", status: "completed", reward: 1 }),
        }).then((r) => r.status);
    });
    const code = await new Promise<number | null>((resolve) => proc.on("exit", (c) => resolve(c)));
    expect(code, `${stderr.join("\n")}\n${cluster.output()}`).toBe(0);
    expect(await forged).toBe(401);
    const summary = JSON.parse(stdout.at(-1)!);
    expect(summary.n).toBe(3);
    expect(summary.task_callbacks).toBe(3);
    expect(summary.group_callback).toBe(true);
    expect(summary.group_tasks).toBe(3);
    expect(summary.rejected_signatures).toBe(1);
    expect(summary.statuses.completed).toBe(3);
    expect(summary.rewards).toEqual([1, 1, 1]);
    expect(summary.trainable_tokens).toBeGreaterThan(0);
    expect(summary.tasks.map((t: { id: string }) => t.id)).toEqual([0, 1, 2].map((k) => `${summary.group_id}-${k}`));
  }, 120_000);

  it("says what the gateway answered when the request is refused", () => {
    const res = spawnSync("python3", [SCRIPT, "--url", cluster.url, "--n", "2"], { encoding: "utf8", env: { ...process.env, ROLLGATE_API_KEY: "wrong" }, timeout: 30_000 });
    expect(res.status).toBe(2);
    expect(res.stderr).toContain("HTTP 401");
    expect(res.stderr).toContain("unauthorized");
  });
});
