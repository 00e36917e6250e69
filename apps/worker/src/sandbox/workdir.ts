import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

/** A fresh working directory holding the task's `runtime.files` (paths were validated relative). */
export async function makeWorkdir(root: string | undefined, taskId: string, files: Record<string, string>): Promise<string> {
  const parent = root ?? os.tmpdir();
  await mkdir(parent, { recursive: true });
  const dir = await mkdtemp(path.join(parent, `rollgate-${taskId.slice(0, 40)}-`));
  await mkdir(path.join(dir, ".tmp"));
  for (const [rel, content] of Object.entries(files)) {
    const target = path.resolve(dir, rel);
    if (!target.startsWith(dir + path.sep)) throw new Error(`file path escapes the working directory: ${rel}`);
    await mkdir(path.dirname(target), { recursive: true });
    await writeFile(target, content);
  }
  return dir;
}

export async function removeWorkdir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
}
