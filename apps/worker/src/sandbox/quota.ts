import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);

/**
 * A cap on what one sandbox keeps in its own folders (working directory, HOME, TMPDIR): bytes and
 * files (inodes). Without it they are folders of ROLLGATE_SANDBOX_ROOT, and an agent that writes
 * without end (or makes files without end) fills the worker's disk, for every rollout on it.
 *
 * The folders then live on a tmpfs of their own, mounted by the worker (which needs root, or
 * CAP_SYS_ADMIN): its `size` and `nr_inodes` are the caps, and a write past them fails in the
 * sandbox (ENOSPC) while the worker's disk and the other rollouts' folders are untouched. A tmpfs
 * is memory, taken only as the agent writes: at most `bytes` per running sandbox.
 */
export interface DiskQuota {
  bytes: number;
  inodes: number;
}

/** The worker cannot make the capped tmpfs here (it is not root): the rollout fails `sandbox_unavailable`, not retried. */
export class QuotaUnavailable extends Error {}

function stderrOf(err: unknown): string {
  return ((err as { stderr?: string }).stderr ?? "").trim() || (err as Error).message;
}

/** Mounts the capped tmpfs at `dir` (an empty folder), root's and passable by all, with no devices and no set-uid programs. */
export async function mountQuota(dir: string, q: DiskQuota): Promise<void> {
  try {
    await run("mount", ["-t", "tmpfs", "-o", `size=${q.bytes},nr_inodes=${q.inodes},mode=0711,nosuid,nodev`, "rollgate-sandbox", dir]);
  } catch (err) {
    throw new QuotaUnavailable(`cannot mount the sandbox's capped tmpfs (ROLLGATE_SANDBOX_DISK_MB needs a worker that may mount: root): ${stderrOf(err)}`);
  }
}

/** Unmounts it (and so frees its memory); lazily when something still holds it open. */
export async function unmountQuota(dir: string): Promise<void> {
  try {
    await run("umount", [dir]);
  } catch {
    try {
      await run("umount", ["-l", dir]);
    } catch (err) {
      throw new Error(`cannot unmount the sandbox's capped tmpfs: ${stderrOf(err)}`);
    }
  }
}
