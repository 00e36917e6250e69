import { execFile } from "node:child_process";
import { constants, mkdirSync, mkdtempSync, rmdirSync } from "node:fs";
import { lchown, lstat, mkdir, open, readdir, realpath, rm, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { markOwner, unmarkOwner } from "./owner.js";
import { type DiskQuota, mountQuota, unmountQuota } from "./quota.js";

/** One rollout's folders: `work` (the agent's working directory), `home` (its HOME), `tmp`. */
export interface SandboxDirs {
  base: string;
  work: string;
  home: string;
  tmp: string;
  /** Where the capped tmpfs that holds `work`, `home` and `tmp` is mounted (quota.ts), when there is one. */
  quotaMount?: string;
}

export class PathEscape extends Error {}

/** The path's components, or an error when it is absolute or climbs out (`..`). */
function components(rel: string): string[] {
  if (path.isAbsolute(rel) || rel.includes("\0")) throw new PathEscape(`file path escapes the working directory: ${rel}`);
  const parts = rel.split("/").filter((p) => p !== "" && p !== ".");
  if (parts.length === 0 || rel.split(/[\\/]/).includes("..")) throw new PathEscape(`file path escapes the working directory: ${rel}`);
  return parts;
}

async function lstatOrNull(p: string) {
  try {
    return await lstat(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw err;
  }
}

/**
 * Writes files under `dir`; every path must stay inside it. Besides `..` and absolute paths (the
 * task schema refuses those too), a symbolic link anywhere on the way (a folder or the file itself,
 * left by an earlier step or a kept sandbox) is refused: each component is checked with lstat, the
 * parent's real path must be inside `dir`'s, and the file is opened with O_NOFOLLOW.
 */
export async function writeFilesInside(dir: string, files: Record<string, string>): Promise<void> {
  if (Object.keys(files).length === 0) return;
  const root = await realpath(dir);
  for (const [rel, content] of Object.entries(files)) {
    const parts = components(rel);
    let at = root;
    for (const part of parts.slice(0, -1)) {
      at = path.join(at, part);
      const st = await lstatOrNull(at);
      if (!st) await mkdir(at);
      else if (st.isSymbolicLink()) throw new PathEscape(`file path goes through a symbolic link: ${rel}`);
      else if (!st.isDirectory()) throw new PathEscape(`file path goes through a file that is not a folder: ${rel}`);
    }
    const parent = await realpath(at);
    if (parent !== root && !parent.startsWith(root + path.sep)) throw new PathEscape(`file path escapes the working directory: ${rel}`);
    const target = path.join(parent, parts.at(-1)!);
    const st = await lstatOrNull(target);
    if (st?.isSymbolicLink()) throw new PathEscape(`file path is a symbolic link: ${rel}`);
    if (st && !st.isFile()) throw new PathEscape(`file path exists and is not a regular file: ${rel}`);
    const fh = await open(target, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW, 0o644);
    try {
      await fh.writeFile(content);
    } finally {
      await fh.close();
    }
  }
}

/** The most of a file evaluators read: a bigger one reads as absent (a file the agent filled to exhaust the worker's memory). */
export const MAX_READ_BYTES = 32 * 1024 * 1024;

/**
 * A file of `dir` as text, or null when it does not exist or is not inside `dir` once symbolic
 * links are followed (an agent's `ln -s /etc/shadow reward.txt` reads nothing). Only a regular file
 * of at most MAX_READ_BYTES reads: a FIFO the agent left at the path (`mkfifo reward.txt`) would
 * block the read, and the rollout with it, forever (opened non-blocking, checked on the open file
 * so it cannot be swapped in between); a device or a huge file reads as absent too.
 */
export async function readFileInside(dir: string, rel: string): Promise<string | null> {
  try {
    components(rel);
    const root = await realpath(dir);
    const real = await realpath(path.resolve(root, rel));
    if (!real.startsWith(root + path.sep)) return null;
    const fh = await open(real, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOFOLLOW);
    try {
      const st = await fh.stat();
      if (!st.isFile() || st.size > MAX_READ_BYTES) return null;
      const buf = Buffer.alloc(st.size + 1);
      let n = 0;
      // It may grow while it is read: at most one byte past the limit tells.
      while (n < buf.length) {
        const { bytesRead } = await fh.read(buf, n, buf.length - n, n);
        if (bytesRead === 0) break;
        n += bytesRead;
      }
      if (n > MAX_READ_BYTES) return null;
      return buf.subarray(0, n).toString("utf8");
    } finally {
      await fh.close();
    }
  } catch {
    return null;
  }
}

/**
 * Removes `rel` from `dir` if it is there, whatever it is (a file, a link, a FIFO, a folder), never
 * anything outside `dir`: a link on the way is not followed (its parent folder's real path must be
 * inside `dir`), a link at the path itself is removed, not its target.
 */
export async function removeInside(dir: string, rel: string): Promise<void> {
  const parts = components(rel);
  const root = await realpath(dir);
  let parent: string;
  try {
    parent = await realpath(path.join(root, ...parts.slice(0, -1)));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT" || (err as NodeJS.ErrnoException).code === "ENOTDIR") return;
    throw err;
  }
  if (parent !== root && !parent.startsWith(root + path.sep)) return;
  // A folder the agent nested past PATH_MAX or locked would otherwise stay (removeTree).
  await removeTree(path.join(parent, parts.at(-1)!));
}

/**
 * Fresh folders for one rollout, with the task's `runtime.files` in `work`. When writing a file
 * fails the folders are removed again; a removal that fails too is told to `onCleanupError`.
 */
export async function makeSandboxDirs(
  root: string | undefined,
  taskId: string,
  files: Record<string, string>,
  onCleanupError: (path: string, err: unknown) => void,
  quota?: DiskQuota,
): Promise<SandboxDirs> {
  const parent = root ?? os.tmpdir();
  const prefix = path.join(parent, `rollgate-${taskId.slice(0, 40)}-`);
  // Synchronous on purpose: four quick syscalls on the event loop cost less CPU than four trips
  // through libuv's thread pool (each a thread wake-up and an event-loop wake-up).
  // The parent is made only when it is missing (the first rollout, or a cleaner removed it).
  let base: string;
  try {
    base = mkdtempSync(prefix);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    await mkdir(parent, { recursive: true });
    base = mkdtempSync(prefix);
  }
  // Before anything is mounted in it: a worker killed from here on leaves it to the next one's sweep (leftovers.ts).
  try {
    markOwner(base);
  } catch (err) {
    rmdirSync(base);
    throw err;
  }
  // With a quota, the folders live on a capped tmpfs one level down: the base stays on the worker's
  // disk, for the evaluator's fresh folders (never inside what the agent filled).
  const data = quota ? path.join(base, "data") : base;
  const dirs: SandboxDirs = { base, work: path.join(data, "work"), home: path.join(data, "home"), tmp: path.join(data, "tmp") };
  try {
    if (quota) {
      mkdirSync(data);
      await mountQuota(data, quota);
      dirs.quotaMount = data;
    }
    mkdirSync(dirs.work);
    mkdirSync(dirs.home);
    mkdirSync(dirs.tmp);
    await writeFilesInside(dirs.work, files);
  } catch (err) {
    await removeSandboxDirs(dirs).catch((e: unknown) => onCleanupError(base, e));
    throw err;
  }
  return dirs;
}

const run = promisify(execFile);

/**
 * `rm -rf` that an agent cannot defeat. Node's recursive removal walks full paths, so a tree the
 * agent nested past PATH_MAX (mkdir and chdir in a loop: no path it used was long) fails with
 * ENAMETOOLONG, even for root; and a folder it made unreadable or unwritable (chmod 000 or 500)
 * fails with EACCES for a worker that is not root. The sandbox would stay on the worker's disk,
 * one per rollout. Those go to coreutils, which walk with openat at any depth: `chmod -R u+rwx`
 * (its own files, never through a link) and then `rm -rf`.
 */
export async function removeTree(p: string): Promise<void> {
  try {
    await rm(p, { recursive: true, force: true });
    return;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "ENAMETOOLONG" && code !== "EACCES" && code !== "EPERM" && code !== "ENOTEMPTY") throw err;
  }
  // What chmod cannot change (a file made immutable), rm reports.
  await run("chmod", ["-R", "u+rwx", "--", p]).catch(() => undefined);
  try {
    await run("rm", ["-rf", "--", p]);
  } catch (err) {
    throw new Error(((err as { stderr?: string }).stderr ?? "").trim() || (err as Error).message);
  }
}

export async function removeSandboxDirs(dirs: SandboxDirs): Promise<void> {
  unmarkOwner(dirs.base);
  if (dirs.quotaMount) {
    // Its contents go with the tmpfs.
    await unmountQuota(dirs.quotaMount);
    await removeTree(dirs.base);
    return;
  }
  // Most agents leave their folders empty: four rmdir calls instead of a recursive removal's
  // lstat, readdir and rmdir of each, synchronous as in makeSandboxDirs. Anything left inside (or
  // a folder swapped for a link, which rmdir refuses) goes the recursive way, which never follows
  // links, off the event loop.
  try {
    rmdirSync(dirs.work);
    rmdirSync(dirs.home);
    rmdirSync(dirs.tmp);
    rmdirSync(dirs.base);
  } catch {
    await removeTree(dirs.base);
  }
}

/**
 * Gives a tree the worker wrote (the task's files, the harness's HOME files, fresh folders) to the
 * user its sandbox runs as, so the agent may change and remove them as a non-root worker's agent
 * may. Links are changed themselves, never followed.
 */
export async function giveTree(p: string, uid: number, gid: number): Promise<void> {
  await lchown(p, uid, gid);
  const st = await lstat(p);
  if (!st.isDirectory()) return;
  for (const e of await readdir(p, { withFileTypes: true })) await giveTree(path.join(p, e.name), uid, gid);
}

/**
 * The first folder of `dir`'s path (itself included) that the user `uid`/`gid` cannot pass through,
 * or null: bubblewrap, started as that user, must reach the sandbox's folders to mount them.
 */
export async function firstUntraversable(dir: string, uid: number, gid: number): Promise<string | null> {
  let at = path.resolve(dir);
  for (;;) {
    const st = await stat(at);
    const bit = st.uid === uid ? 0o100 : st.gid === gid ? 0o010 : 0o001;
    if ((st.mode & bit) === 0) return at;
    const up = path.dirname(at);
    if (up === at) return null;
    at = up;
  }
}
