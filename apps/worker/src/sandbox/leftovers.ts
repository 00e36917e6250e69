import { readFile, readdir } from "node:fs/promises";
import path from "node:path";
import { OWNER_FILE, ownerDead } from "./owner.js";
import { unmountQuota } from "./quota.js";
import { removeTree } from "./workdir.js";

/** Mount points under `dir` (deepest first), from this mount namespace's table. */
async function mountsUnder(dir: string): Promise<string[]> {
  const table = await readFile("/proc/self/mountinfo", "utf8").catch(() => "");
  const unescape = (s: string) => s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
  return table
    .split("\n")
    .map((line) => unescape(line.split(" ")[4] ?? ""))
    .filter((mp) => mp.startsWith(dir + path.sep))
    .sort((a, b) => b.length - a.length);
}

type Log = { warn: (obj: object, msg: string) => void };

/**
 * Removes from `root` the sandbox and relay folders whose worker is dead: first their mounts (the
 * capped tmpfs, which would otherwise hold its memory until the host reboots), then the folders.
 * Folders without a marker (kept sandboxes, another program's files) are not touched. Resolves to
 * how many were removed; one that cannot be is logged and left.
 */
export async function sweepLeftovers(root: string, log?: Log): Promise<number> {
  let names: string[];
  try {
    names = await readdir(root);
  } catch {
    return 0;
  }
  let removed = 0;
  for (const name of names) {
    if (!name.startsWith("rollgate-")) continue;
    const dir = path.join(root, name);
    const marker = await readFile(path.join(dir, OWNER_FILE), "utf8").catch(() => null);
    if (marker === null || !ownerDead(marker)) continue;
    try {
      for (const mp of await mountsUnder(dir)) await unmountQuota(mp);
      await removeTree(dir);
      removed++;
    } catch (err) {
      log?.warn({ path: dir, err: (err as Error).message }, "cannot remove what a dead worker's sandbox left");
    }
  }
  return removed;
}
