import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

/** One rollout's folders: `work` (the agent's working directory), `home` (its HOME), `tmp`. */
export interface SandboxDirs {
  base: string;
  work: string;
  home: string;
  tmp: string;
}

/** Writes files under `dir`; every path must stay inside it (the task schema checks too). */
export async function writeFilesInside(dir: string, files: Record<string, string>): Promise<void> {
  for (const [rel, content] of Object.entries(files)) {
    const target = path.resolve(dir, rel);
    if (!target.startsWith(dir + path.sep)) throw new Error(`file path escapes the working directory: ${rel}`);
    await mkdir(path.dirname(target), { recursive: true });
    await writeFile(target, content);
  }
}

/** Fresh folders for one rollout, with the task's `runtime.files` in `work`. */
export async function makeSandboxDirs(root: string | undefined, taskId: string, files: Record<string, string>): Promise<SandboxDirs> {
  const parent = root ?? os.tmpdir();
  await mkdir(parent, { recursive: true });
  const base = await mkdtemp(path.join(parent, `rollgate-${taskId.slice(0, 40)}-`));
  const dirs = { base, work: path.join(base, "work"), home: path.join(base, "home"), tmp: path.join(base, "tmp") };
  await Promise.all([mkdir(dirs.work), mkdir(dirs.home), mkdir(dirs.tmp)]);
  await writeFilesInside(dirs.work, files);
  return dirs;
}

export async function removeSandboxDirs(dirs: SandboxDirs): Promise<void> {
  await rm(dirs.base, { recursive: true, force: true });
}
