/**
 * A worker killed mid-rollout (SIGKILL, the OOM killer) cannot remove its sandboxes: their folders
 * stay in ROLLGATE_SANDBOX_ROOT and, with ROLLGATE_SANDBOX_DISK_MB, their capped tmpfs stays
 * mounted, holding its memory. The next worker on that root removes them, and leaves alone the
 * sandboxes of a worker that is still running there. Real engine-sim, gateway, worker processes
 * and Redis; bubblewrap sandboxes.
 */
import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import type { StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const root0 = process.getuid?.() === 0;
const sealable = spawnSync("bwrap", ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-net", "true"]).status === 0;
const prefix = uniquePrefix("leftovers");
const sandboxRoot = mkdtempSync(path.join(os.tmpdir(), "rg-leftovers-"));
// A root worker's sandboxes run as an unprivileged user, who must pass through it.
chmodSync(sandboxRoot, 0o711);
const children: StartedChild[] = [];
let gateway: StartedChild;

function mountsUnderRoot(): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((l) => l.split(" ")[4] ?? "")
    .filter((mp) => mp.startsWith(sandboxRoot + "/"));
}

/** The folders in the root that the worker with this pid marked as its own. */
function foldersOf(pid: number): string[] {
  return readdirSync(sandboxRoot).filter((name) => {
    try {
      return (JSON.parse(readFileSync(path.join(sandboxRoot, name, ".rollgate-owner"), "utf8")) as { pid: number }).pid === pid;
    } catch {
      return false;
    }
  });
}

function startWorker(name: string): Promise<StartedChild> {
  return startApp("worker", [], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_GATEWAY_URL: gateway.ready,
    ROLLGATE_WORKER_NAME: name,
    ROLLGATE_WORKER_CONCURRENCY: "1",
    ROLLGATE_SANDBOX_ROOT: sandboxRoot,
    // The capped tmpfs is a root worker's only (quota.ts).
    ...(root0 ? { ROLLGATE_SANDBOX_DISK_MB: "8" } : {}),
  }).then((c) => (children.push(c), c));
}

/** A rollout whose agent writes into its sandbox and then waits (until its worker is gone). */
async function submitWaiting(): Promise<string> {
  const res = await fetch(`${gateway.ready}/v1/tasks`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      instruction: "wait",
      agent: { harness: "command", command: ["sh", "-c", "echo written > note.txt; sleep 300"] },
      runtime: { isolation: "bwrap" },
      evaluator: { kind: "file", path: "note.txt", equals: "written" },
      limits: { timeout_s: 600 },
    }),
  });
  expect(res.status).toBe(202);
  return ((await res.json()) as { id: string }).id;
}

beforeAll(async () => {
  if (!sealable) return;
  const engine = await startApp("engine-sim", ["--port", "0", "--dp", "1"], {});
  children.push(engine);
  gateway = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 1, profile: "qwen3" }]),
  });
  children.push(gateway);
}, 90_000);

afterAll(async () => {
  await Promise.all(children.map((c) => stopChild(c.proc, 5_000)));
  // What the test's own still-running worker left: its tmpfs first, then the folders.
  for (const mp of mountsUnderRoot().sort((a, b) => b.length - a.length)) spawnSync("umount", ["-l", mp]);
  rmSync(sandboxRoot, { recursive: true, force: true });
  await dropPrefix(prefix);
});

describe.skipIf(!sealable)("a worker killed mid-rollout", () => {
  it(`leaves its sandboxes' folders${root0 ? " and mounted capped tmpfs" : ""} to the next worker on the same root, which removes them and not a live worker's`, async () => {
    const live = await startWorker("leftovers-live");
    await submitWaiting();
    // Each sandbox has its folder, and a sealed one a relay folder too.
    const liveFolders = await poll(async () => foldersOf(live.proc.pid!), (f) => f.length === 2, 30_000, 100);
    expect(liveFolders).toHaveLength(2);
    if (root0) expect(await poll(async () => mountsUnderRoot(), (m) => m.length === 1, 30_000, 100)).toHaveLength(1);

    const doomed = await startWorker("leftovers-doomed");
    await submitWaiting();
    const doomedFolders = await poll(async () => foldersOf(doomed.proc.pid!), (f) => f.length === 2, 30_000, 100);
    expect(doomedFolders).toHaveLength(2);
    if (root0) expect(await poll(async () => mountsUnderRoot(), (m) => m.length === 2, 30_000, 100)).toHaveLength(2);
    // It wrote into its sandbox before the worker died.
    const doomedSandbox = doomedFolders.find((f) => !f.startsWith("rollgate-relay-"))!;
    expect(await poll(async () => existsSync(path.join(sandboxRoot, doomedSandbox, ...(root0 ? ["data"] : []), "work", "note.txt")), Boolean, 30_000, 100)).toBe(true);

    const died = new Promise((r) => doomed.proc.once("exit", r));
    doomed.proc.kill("SIGKILL");
    await died;
    expect(foldersOf(doomed.proc.pid!)).toEqual(doomedFolders);

    await startWorker("leftovers-next");
    // Removed before the new worker says it is ready (and takes a job).
    for (const f of doomedFolders) expect(existsSync(path.join(sandboxRoot, f)), f).toBe(false);
    const mounts = mountsUnderRoot();
    expect(mounts.filter((m) => doomedFolders.some((f) => m.startsWith(path.join(sandboxRoot, f) + "/")))).toEqual([]);
    // The live worker's rollout goes on in its sandbox, untouched.
    expect(foldersOf(live.proc.pid!).sort()).toEqual(liveFolders.sort());
    if (root0) expect(mounts).toEqual([path.join(sandboxRoot, liveFolders.find((f) => !f.startsWith("rollgate-relay-"))!, "data")]);
  }, 120_000);
});
