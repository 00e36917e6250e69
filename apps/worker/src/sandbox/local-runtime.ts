import { readFile } from "node:fs/promises";
import path from "node:path";
import type { RuntimeSpec } from "@rollgate/protocol";
import { bwrapArgv, bwrapUsable } from "./isolation.js";
import { runProcess } from "./process.js";
import type { ExecOptions, Sandbox, SandboxRuntime } from "./runtime.js";
import { makeSandboxDirs, removeSandboxDirs, writeFilesInside } from "./workdir.js";

export class SandboxUnavailable extends Error {}

/** `runtime.kind: "local"`: folders on the worker's host, optionally inside bubblewrap. */
export class LocalRuntime implements SandboxRuntime {
  constructor(private readonly root: string | undefined) {}

  async create(taskId: string, runtime: RuntimeSpec): Promise<Sandbox> {
    if (runtime.isolation === "bwrap" && !bwrapUsable()) {
      throw new SandboxUnavailable("runtime.isolation is bwrap but bubblewrap cannot run on this worker");
    }
    const dirs = await makeSandboxDirs(this.root, taskId, runtime.files);
    const wrap = runtime.isolation === "bwrap" ? (argv: string[]) => bwrapArgv(dirs.base, dirs.work, argv) : (argv: string[]) => argv;
    return {
      workdir: dirs.work,
      home: dirs.home,
      tmp: dirs.tmp,
      exec: (argv: string[], o: ExecOptions) => runProcess({ argv: wrap(argv), cwd: dirs.work, ...o }),
      writeHomeFiles: (files) => writeFilesInside(dirs.home, files),
      readFile: async (rel) => {
        const target = path.resolve(dirs.work, rel);
        if (!target.startsWith(dirs.work + path.sep)) return null;
        return readFile(target, "utf8").catch(() => null);
      },
      destroy: () => (runtime.keep ? Promise.resolve() : removeSandboxDirs(dirs).catch(() => undefined)),
      describe: () => dirs.base,
    };
  }
}
