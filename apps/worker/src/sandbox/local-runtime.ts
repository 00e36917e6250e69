import type { RuntimeSpec } from "@rollgate/protocol";
import { bwrapArgv, bwrapUsable } from "./isolation.js";
import { runProcess } from "./process.js";
import type { ExecOptions, Sandbox, SandboxRuntime } from "./runtime.js";
import { PathEscape, makeSandboxDirs, readFileInside, removeSandboxDirs, writeFilesInside } from "./workdir.js";

export class SandboxUnavailable extends Error {}

/** `runtime.kind: "local"`: folders on the worker's host, optionally inside bubblewrap. */
export class LocalRuntime implements SandboxRuntime {
  constructor(private readonly root: string | undefined) {}

  async create(taskId: string, runtime: RuntimeSpec): Promise<Sandbox> {
    if (runtime.isolation === "bwrap" && !bwrapUsable()) {
      throw new SandboxUnavailable("runtime.isolation is bwrap but bubblewrap cannot run on this worker");
    }
    // A file path that would land outside the working directory fails the rollout (not retried).
    const dirs = await makeSandboxDirs(this.root, taskId, runtime.files).catch((err: unknown) => {
      throw err instanceof PathEscape ? new SandboxUnavailable(`runtime.files: ${err.message}`) : err;
    });
    const wrap = runtime.isolation === "bwrap" ? (argv: string[]) => bwrapArgv(dirs.base, dirs.work, argv) : (argv: string[]) => argv;
    return {
      workdir: dirs.work,
      home: dirs.home,
      tmp: dirs.tmp,
      exec: (argv: string[], o: ExecOptions) => runProcess({ argv: wrap(argv), cwd: dirs.work, ...o }),
      writeHomeFiles: (files) => writeFilesInside(dirs.home, files),
      // Symlink-safe: a link the agent made to a file outside the working directory reads as absent.
      readFile: (rel) => readFileInside(dirs.work, rel),
      destroy: () => (runtime.keep ? Promise.resolve() : removeSandboxDirs(dirs).catch(() => undefined)),
      describe: () => dirs.base,
    };
  }
}
