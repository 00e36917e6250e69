/**
 * Telling a dead worker's sandbox folders from a live one's (owner.ts) and the sweep
 * (leftovers.ts) on real folders and real processes. The SIGKILLed worker with its mounted
 * tmpfs is test/e2e/sandbox-leftovers.test.ts.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import type { RuntimeSpec } from "@rollgate/protocol";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { sweepLeftovers } from "./leftovers.js";
import { LocalRuntime } from "./local-runtime.js";
import { OWNER_FILE, ownerDead } from "./owner.js";
import { removeDeadWorkersFilters } from "./seccomp.js";

const spec = (keep: boolean): RuntimeSpec => ({ kind: "local", files: { "a.txt": "A" }, prepare: [], image: null, keep, isolation: "none", egress: [] });

let root: string;
beforeEach(() => {
  root = mkdtempSync(path.join(os.tmpdir(), "rg-leftovers-unit-"));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

/** A process that has run and exited: its pid names no process now (or, reused, one with another start time). */
async function deadPid(): Promise<number> {
  const p = spawn("true");
  await new Promise((r) => p.once("exit", r));
  return p.pid!;
}

/** A folder in the root as the worker with this marker would have left it. */
function leftover(name: string, marker: string | null): string {
  const dir = path.join(root, name);
  mkdirSync(path.join(dir, "work"), { recursive: true });
  writeFileSync(path.join(dir, "work", "f.txt"), "x");
  if (marker !== null) writeFileSync(path.join(dir, OWNER_FILE), marker);
  return dir;
}

describe("sandbox folders' owner", () => {
  it("a sandbox being used is marked as this worker's, which is alive; its marker goes with it", async () => {
    const rt = new LocalRuntime({ root, spawner: null });
    const sb = await rt.create("t-own", spec(false));
    const marker = readFileSync(path.join(sb.describe(), OWNER_FILE), "utf8");
    expect(JSON.parse(marker)).toMatchObject({ host: os.hostname(), pid: process.pid });
    expect(ownerDead(marker)).toBe(false);
    expect(await sweepLeftovers(root)).toBe(0);
    expect(existsSync(path.join(sb.describe(), "work", "a.txt"))).toBe(true);
    await sb.destroy();
    expect(existsSync(sb.describe())).toBe(false);
  });

  it("removes a dead worker's folders (an exited pid, or a reused pid with another start time), not a live one's, another host's or container's, or unmarked ones", async () => {
    // A kept sandbox (runtime.keep) is unmarked at destroy: never swept, whoever made it.
    const keptSandbox = await new LocalRuntime({ root, spawner: null }).create("t-kept", spec(true));
    await keptSandbox.destroy();
    expect(existsSync(path.join(keptSandbox.describe(), OWNER_FILE))).toBe(false);
    const self = { host: os.hostname(), boot: readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim(), pidns: readlinkSync("/proc/self/ns/pid") };
    const ownStart = readFileSync(`/proc/${process.pid}/stat`, "utf8").split(") ")[1]!.split(" ")[19]!;
    const exited = leftover("rollgate-t-exited-aaaaaa", JSON.stringify({ ...self, pid: await deadPid(), start: "1" }));
    const reused = leftover("rollgate-relay-t-reused-bbbbbb", JSON.stringify({ ...self, pid: process.pid, start: String(Number(ownStart) - 1) }));
    const rebooted = leftover("rollgate-t-rebooted-cccccc", JSON.stringify({ ...self, boot: "another-boot", pid: process.pid, start: ownStart }));
    const live = leftover("rollgate-t-live-dddddd", JSON.stringify({ ...self, pid: process.pid, start: ownStart }));
    const otherHost = leftover("rollgate-t-elsewhere-eeeeee", JSON.stringify({ ...self, host: "another-host", pid: await deadPid(), start: "1" }));
    // Another container with this host name, sharing the root: its pids are not this namespace's.
    const otherContainer = leftover("rollgate-t-container-hhhhhh", JSON.stringify({ ...self, pidns: "pid:[1]", pid: await deadPid(), start: "1" }));
    const unmarked = leftover("rollgate-t-unmarked-ffffff", null);
    const garbled = leftover("rollgate-t-garbled-gggggg", "not json");
    const notOurs = leftover("something-else", JSON.stringify({ ...self, pid: await deadPid(), start: "1" }));

    expect(await sweepLeftovers(root)).toBe(3);
    for (const gone of [exited, reused, rebooted]) expect(existsSync(gone), gone).toBe(false);
    for (const kept of [keptSandbox.describe(), live, otherHost, otherContainer, unmarked, garbled, notOurs]) expect(existsSync(path.join(kept, "work")), kept).toBe(true);
  });

  it("the seccomp filter folders of dead workers go, by the same marker; a live one's and another container's stay", async () => {
    const self = { host: os.hostname(), boot: readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim(), pidns: readlinkSync("/proc/self/ns/pid") };
    const ownStart = readFileSync(`/proc/${process.pid}/stat`, "utf8").split(") ")[1]!.split(" ")[19]!;
    const dead = leftover("rollgate-seccomp-1-aaaaaa", JSON.stringify({ ...self, pid: await deadPid(), start: "1" }));
    const live = leftover("rollgate-seccomp-2-bbbbbb", JSON.stringify({ ...self, pid: process.pid, start: ownStart }));
    const otherContainer = leftover("rollgate-seccomp-3-cccccc", JSON.stringify({ ...self, pidns: "pid:[1]", pid: await deadPid(), start: "1" }));
    const unmarked = leftover("rollgate-seccomp-4-dddddd", null);
    removeDeadWorkersFilters(root);
    expect(existsSync(dead)).toBe(false);
    for (const kept of [live, otherContainer, unmarked]) expect(existsSync(kept), kept).toBe(true);
  });
});
