import { readFileSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";

/**
 * What a local sandbox's folders (and a sealed one's relay folder) say about the worker that made
 * them, so that a worker starting on the same ROLLGATE_SANDBOX_ROOT can tell what a dead worker
 * left (its folders, its capped tmpfs still mounted and holding memory) from what a live one is
 * using. Several workers may share a root: a pid alone could be reused, so the process's start time
 * is kept with it; a worker on another host (a shared volume), or in another pid namespace (another
 * container with the same host name: its pids are not ours to look up), cannot be checked, and is
 * left alone.
 */
export const OWNER_FILE = ".rollgate-owner";

interface Owner {
  host: string;
  boot: string;
  /** The pid namespace the pid is in (`pid:[inode]`). */
  pidns: string;
  pid: number;
  start: string;
}

function bootId(): string {
  try {
    return readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  } catch {
    return "";
  }
}

function pidNamespace(): string {
  try {
    return readlinkSync("/proc/self/ns/pid");
  } catch {
    return "";
  }
}

/** The start time (clock ticks since boot) of a process, or null when there is no such process. */
function startTime(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces and parentheses): the 22nd is the start time.
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19] ?? null;
  } catch {
    return null;
  }
}

let self: string | undefined;

function thisWorker(): string {
  self ??= JSON.stringify({ host: os.hostname(), boot: bootId(), pidns: pidNamespace(), pid: process.pid, start: startTime(process.pid) ?? "" } satisfies Owner);
  return self;
}

/** Marks `dir` as this worker's (synchronous: one small write, beside mkdtempSync). */
export function markOwner(dir: string): void {
  writeFileSync(path.join(dir, OWNER_FILE), thisWorker(), { mode: 0o644 });
}

/** Unmarks it: a kept sandbox (`runtime.keep`) is never swept; a removed one has its folder empty again. */
export function unmarkOwner(dir: string): void {
  rmSync(path.join(dir, OWNER_FILE), { force: true });
}

/** Whether the worker that marked a folder is gone for sure (another host's, or a marker that does not parse: not sure). */
export function ownerDead(marker: string): boolean {
  let o: Partial<Owner>;
  try {
    o = JSON.parse(marker) as Partial<Owner>;
  } catch {
    return false;
  }
  if (typeof o.pid !== "number" || typeof o.start !== "string" || o.host !== os.hostname()) return false;
  // A host that booted again: every process of the earlier boot is gone (and its tmpfs with them).
  if (o.boot && o.boot !== bootId()) return true;
  // Another container of this host name sees other pids: its worker cannot be looked up from here.
  if (o.pidns !== pidNamespace()) return false;
  const now = startTime(o.pid);
  return now === null || now !== o.start;
}
