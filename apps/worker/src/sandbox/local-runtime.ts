import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, rm, statfs, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { type RuntimeSpec, runtimeNetwork } from "@rollgate/protocol";
import { sandboxEgressPolicy } from "../egress.js";
import { CANNOT_START } from "./container-common.js";
import { type BwrapSupport, type SandboxUser, INSIDE_HOME, INSIDE_TMP, INSIDE_WORKDIR, RELAY_SHIM, RELAY_SOCKET, SANDBOX_GATEWAY_PORT, bwrapArgv, hostMountArgs, probeBwrap } from "./isolation.js";
import { type RunResult, runProcess } from "./process.js";
import { sweepLeftovers } from "./leftovers.js";
import { markOwner, unmarkOwner } from "./owner.js";
import { type DiskQuota, QuotaUnavailable } from "./quota.js";
import { RELAY_SHIM_SOURCE } from "./relay-shim.js";
import { seccompFilterFile } from "./seccomp.js";
import { type Spawner, sharedSpawner } from "./spawner.js";
import { SessionRelay, egressProxyEnv } from "./relay.js";
import { NO_LOST_CALLS, type CreateOptions, type ExecOptions, type Sandbox, type SandboxRuntime } from "./runtime.js";
import {
  PathEscape,
  type SandboxDirs,
  firstUntraversable,
  giveTree,
  makeSandboxDirs,
  readFileInside,
  removeInside,
  removeSandboxDirs,
  removeTree,
  writeFilesInside,
} from "./workdir.js";

/** The sandbox cannot be made as the task asks, here: the rollout fails (`sandbox_unavailable`), it is not retried. */
export class SandboxUnavailable extends Error {}

type Log = { warn: (obj: object, msg: string) => void; debug?: (obj: object, msg: string) => void };

export interface LocalRuntimeOptions {
  /** Parent of the per-rollout folders (ROLLGATE_SANDBOX_ROOT; default the OS temp dir). */
  root?: string;
  /** The PATH agents get: its folders are made visible (read-only) inside bubblewrap. */
  sandboxPath?: string;
  /** More host paths bubblewrap sandboxes see, read-only (ROLLGATE_SANDBOX_BINDS). */
  binds?: string[];
  /**
   * Host paths only evaluator steps of bubblewrap sandboxes see, read-only (ROLLGATE_EVALUATOR_BINDS):
   * hidden tests and expected answers. ROLLGATE_SANDBOX_BINDS are the agent's to read too.
   */
  evaluatorBinds?: string[];
  /** What bubblewrap can do on this host; probed on first use when not given. */
  bwrap?: BwrapSupport;
  /** The most bytes a bubblewrap sandbox's /tmp and /dev/shm each hold (ROLLGATE_SANDBOX_TMPFS_MB; default DEFAULT_TMPFS_BYTES). */
  tmpfsBytes?: number;
  /** The most processes a bubblewrap sandbox runs at once (ROLLGATE_SANDBOX_MAX_PROCS; default DEFAULT_MAX_PROCS). */
  maxProcs?: number;
  /** The most memory each process of a bubblewrap sandbox takes (ROLLGATE_SANDBOX_PROCESS_MEMORY_MB; default DEFAULT_PROCESS_MEMORY_BYTES; 0: no limit). */
  processMemoryBytes?: number;
  /**
   * Caps what each sandbox keeps in its folders, bytes and files (ROLLGATE_SANDBOX_DISK_MB,
   * ROLLGATE_SANDBOX_INODES): they live on a tmpfs of that size (quota.ts; the worker must be root).
   */
  diskQuota?: DiskQuota;
  /** Destinations no sealed sandbox reaches whatever its `runtime.egress` (the worker's infrastructure, ROLLGATE_SANDBOX_EGRESS_DENY). */
  egressDeny?: string[];
  /**
   * What starts the steps' programs: the worker process's spawner (spawner.ts, the default), which
   * keeps forks off the worker's event loop, or null to spawn from the worker itself
   * (ROLLGATE_SANDBOX_SPAWNER=off).
   */
  spawner?: Spawner | null;
  log?: Log;
}

/**
 * A step that could not start its program reports it as `spawnError`, as without bubblewrap:
 * the relay shim says "rollgate-sandbox: cannot start …" (exit 127), bubblewrap itself
 * "bwrap: execvp …" (exit 1), prlimit (which caps the sandbox's processes) "prlimit: failed to
 * execute …" (exit 126 or 127).
 */
function withSpawnError(r: RunResult): RunResult {
  if (r.spawnError || r.timedOut || r.aborted) return r;
  const lines = r.logTail.trimEnd().split("\n");
  const last = lines[lines.length - 1] ?? "";
  if (
    (r.exitCode === 127 && last.startsWith(CANNOT_START)) ||
    (r.exitCode === 1 && /^bwrap: execvp /.test(last)) ||
    ((r.exitCode === 126 || r.exitCode === 127) && /^prlimit: failed to execute /.test(last))
  ) {
    return { ...r, exitCode: null, spawnError: last.trim() };
  }
  return r;
}

/**
 * `runtime.kind: "local"`: folders on the worker's host, optionally inside bubblewrap
 * (isolation.ts). A sealed bubblewrap sandbox gets its own relay (relay.ts) on a unix socket in
 * a folder of its own beside its sandbox folder, and its session URL and proxy point at the
 * shim's port on its loopback.
 */
export class LocalRuntime implements SandboxRuntime {
  private support: BwrapSupport | undefined;
  private mounts: string[] | undefined;
  private evaluatorMounts: string[] | undefined;
  /** Sandbox folders and relays that could not be removed (each also logged). */
  cleanupFailures = 0;

  private readonly spawner: Spawner | null;

  constructor(private readonly o: LocalRuntimeOptions = {}) {
    this.support = o.bwrap;
    this.spawner = o.spawner === undefined ? sharedSpawner() : o.spawner;
  }

  /** What bubblewrap can do here (probed once). */
  bwrapSupport(): BwrapSupport {
    this.support ??= probeBwrap();
    return this.support;
  }

  private hostMounts(evaluator = false): string[] {
    this.mounts ??= hostMountArgs({ sandboxPath: this.o.sandboxPath ?? "/usr/local/bin:/usr/bin:/bin", extra: this.o.binds ?? [] });
    if (!evaluator) return this.mounts;
    this.evaluatorMounts ??= [...this.mounts, ...(this.o.evaluatorBinds ?? []).filter((p) => path.isAbsolute(p) && existsSync(p)).flatMap((p) => ["--ro-bind", p, p])];
    return this.evaluatorMounts;
  }

  private tmpfs(): { tmpfsBytes?: number; maxProcs?: number; processMemoryBytes?: number; seccompFile?: string | null } {
    return {
      seccompFile: this.bwrapSupport().seccomp ? seccompFilterFile() : null,
      ...(this.o.tmpfsBytes !== undefined ? { tmpfsBytes: this.o.tmpfsBytes } : {}),
      ...(this.o.maxProcs !== undefined ? { maxProcs: this.o.maxProcs } : {}),
      ...(this.o.processMemoryBytes !== undefined ? { processMemoryBytes: this.o.processMemoryBytes } : {}),
    };
  }

  private cleanupFailed(what: string, where: string, err: unknown) {
    this.cleanupFailures++;
    this.o.log?.warn({ what, path: where, err: (err as Error).message, cleanup_failures: this.cleanupFailures }, "cannot remove a sandbox's leftovers");
  }

  /**
   * Removes what sandboxes of a dead worker on the same root left (folders, mounted capped tmpfs):
   * a worker killed mid-rollout (SIGKILL, OOM) could not. Live workers' sandboxes are not touched.
   */
  async sweep(): Promise<number> {
    return sweepLeftovers(this.o.root ?? os.tmpdir(), this.o.log);
  }

  async create(taskId: string, runtime: RuntimeSpec, opts: CreateOptions = {}): Promise<Sandbox> {
    const network = runtimeNetwork(runtime);
    const bwrap = runtime.isolation === "bwrap";
    if (bwrap) {
      const s = this.bwrapSupport();
      if (!s.usable) throw new SandboxUnavailable(`runtime.isolation is bwrap but ${s.reason}`);
      if (network === "sealed" && !s.netns) throw new SandboxUnavailable(`runtime.network "sealed" needs a network namespace, and ${s.reason}`);
    } else if (network === "sealed") {
      throw new SandboxUnavailable('runtime.network "sealed" needs runtime.isolation "bwrap" on a local sandbox');
    }
    const sealed = bwrap && network === "sealed";
    if (sealed && !opts.session) throw new Error("a sealed sandbox needs its session (CreateOptions.session)");
    const user = bwrap ? this.bwrapSupport().user : null;
    if (user) {
      // bubblewrap starts as the sandbox's user: it must reach the folders it mounts.
      const parent = this.o.root ?? os.tmpdir();
      const closed = await firstUntraversable(parent, user.uid, user.gid).catch(() => null);
      if (closed) throw new SandboxUnavailable(`the sandbox user (uid ${user.uid}) cannot enter ${closed} (ROLLGATE_SANDBOX_ROOT): chmod o+x it`);
    }

    // A file path that would land outside the working directory fails the rollout (not retried).
    const dirs = await makeSandboxDirs(this.o.root, taskId, runtime.files, (p, err) => this.cleanupFailed("sandbox folder", p, err), this.o.diskQuota).catch((err: unknown) => {
      if (err instanceof QuotaUnavailable) throw new SandboxUnavailable(err.message);
      throw err instanceof PathEscape ? new SandboxUnavailable(`runtime.files: ${err.message}`) : err;
    });
    let relay: { dir: string; server: SessionRelay } | null = null;
    if (user) {
      try {
        await this.giveDirs(dirs, user);
      } catch (err) {
        await removeSandboxDirs(dirs).catch((e: unknown) => this.cleanupFailed("sandbox folder", dirs.base, e));
        throw err;
      }
    }
    if (sealed) {
      try {
        relay = await this.startRelay(taskId, runtime, opts.session!, user !== null && user !== undefined);
      } catch (err) {
        await removeSandboxDirs(dirs).catch((e: unknown) => this.cleanupFailed("sandbox folder", dirs.base, e));
        throw err;
      }
    }
    return this.sandbox(dirs, runtime, relay, opts);
  }

  /**
   * A root worker's sandbox runs as an unprivileged user (isolation.ts): its folders become that
   * user's, as a non-root worker's are its own; the base folder (root's) only lets it pass.
   */
  private async giveDirs(dirs: Pick<SandboxDirs, "base" | "home" | "tmp"> & { work?: string }, user: SandboxUser) {
    await chmod(dirs.base, 0o711);
    for (const d of [dirs.work, dirs.home, dirs.tmp]) if (d) await giveTree(d, user.uid, user.gid);
  }

  private async startRelay(taskId: string, runtime: RuntimeSpec, session: NonNullable<CreateOptions["session"]>, otherUser: boolean) {
    const dir = await mkdtemp(path.join(this.o.root ?? os.tmpdir(), `rollgate-relay-${taskId.slice(0, 40)}-`));
    try {
      markOwner(dir);
      // The sandbox's user (not the worker's, when it is root) passes into it to reach the shim and the socket.
      if (otherUser) await chmod(dir, 0o711);
      await writeFile(path.join(dir, RELAY_SHIM), RELAY_SHIM_SOURCE, { mode: 0o444 });
      const sessionHost = new URL(session.url).hostname;
      const server = await SessionRelay.listen(
        {
          sessionId: session.id,
          sessionUrl: session.url,
          egress: sandboxEgressPolicy(runtime.egress, [...(this.o.egressDeny ?? []), sessionHost]),
          ...(this.o.log ? { log: this.o.log } : {}),
        },
        { path: path.join(dir, RELAY_SOCKET) },
      );
      // Whatever uid the sandbox runs as may connect; the folder itself is read-only inside.
      await chmod(path.join(dir, RELAY_SOCKET), 0o666);
      return { dir, server };
    } catch (err) {
      await rm(dir, { recursive: true, force: true }).catch((e: unknown) => this.cleanupFailed("relay folder", dir, e));
      throw err;
    }
  }

  private sandbox(dirs: SandboxDirs, runtime: RuntimeSpec, relay: { dir: string; server: SessionRelay } | null, opts: CreateOptions): Sandbox {
    const bwrap = runtime.isolation === "bwrap";
    const inside = `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}`;
    const proxyEnv = relay && runtime.egress.length > 0 ? egressProxyEnv(inside) : {};
    const wrap = (argv: string[], evaluator: boolean) =>
      bwrap
        ? bwrapArgv({ support: this.bwrapSupport(), hostMounts: this.hostMounts(evaluator), dirs, relayDir: relay?.dir ?? null, ...this.tmpfs() }, argv)
        : argv;
    let destroyed = false;
    return {
      // Inside bubblewrap the folders are at fixed paths (isolation.ts), the same in every sandbox.
      workdir: bwrap ? INSIDE_WORKDIR : dirs.work,
      home: bwrap ? INSIDE_HOME : dirs.home,
      tmp: bwrap ? INSIDE_TMP : dirs.tmp,
      sessionUrl: relay && opts.session ? `${inside}/s/${encodeURIComponent(opts.session.id)}` : null,
      exec: async (argv: string[], { freshHome, evaluator = false, ...o }: ExecOptions) => {
        if (!freshHome) {
          const r = await runProcess({ argv: wrap(argv, evaluator), cwd: dirs.work, ...o, env: { ...o.env, ...proxyEnv }, spawner: this.spawner });
          return bwrap ? withSpawnError(r) : r;
        }
        // Empty folders of this step's own, beside the sandbox's (never inside anything the agent
        // wrote), at the same paths inside bubblewrap, or named in HOME and TMPDIR without it.
        const own = await mkdtemp(path.join(dirs.base, "step-"));
        try {
          const home = path.join(own, "home");
          const tmp = path.join(own, "tmp");
          await mkdir(home);
          await mkdir(tmp);
          const stepDirs = { ...dirs, home, tmp };
          const user = bwrap ? this.bwrapSupport().user : null;
          if (user) await this.giveDirs({ base: own, home, tmp }, user);
          const r = await runProcess({
            argv: bwrap ? bwrapArgv({ support: this.bwrapSupport(), hostMounts: this.hostMounts(evaluator), dirs: stepDirs, relayDir: relay?.dir ?? null, ...this.tmpfs() }, argv) : argv,
            cwd: dirs.work,
            ...o,
            env: { ...o.env, ...(bwrap ? {} : { HOME: home, TMPDIR: tmp }), ...proxyEnv },
            spawner: this.spawner,
          });
          return bwrap ? withSpawnError(r) : r;
        } finally {
          await removeTree(own).catch((e: unknown) => this.cleanupFailed("step folder", own, e));
        }
      },
      writeHomeFiles: async (files) => {
        await writeFilesInside(dirs.home, files);
        const user = bwrap ? this.bwrapSupport().user : null;
        if (user) await giveTree(dirs.home, user.uid, user.gid);
      },
      // Symlink-safe: a link the agent made to a file outside the working directory reads as absent.
      readFile: (rel) => readFileInside(dirs.work, rel),
      removeFile: (rel) => removeInside(dirs.work, rel),
      destroy: async () => {
        if (destroyed) return;
        destroyed = true;
        if (relay) {
          this.o.log?.debug?.({ relay: relay.server.stats }, "sandbox relay closed");
          await relay.server.close().catch((e: unknown) => this.cleanupFailed("relay", relay.dir, e));
          await rm(relay.dir, { recursive: true, force: true }).catch((e: unknown) => this.cleanupFailed("relay folder", relay.dir, e));
        }
        if (!runtime.keep) await removeSandboxDirs(dirs).catch((e: unknown) => this.cleanupFailed("sandbox folder", dirs.base, e));
        // A kept sandbox is never swept as a dead worker's leftover.
        else unmarkOwner(dirs.base);
      },
      describe: () => dirs.base,
      limitsReached: async () => {
        if (!dirs.quotaMount) return [];
        const fs = await statfs(dirs.quotaMount).catch(() => null);
        if (!fs) return [];
        return [...(fs.bavail === 0 ? (["disk"] as const) : []), ...(fs.ffree === 0 ? (["inodes"] as const) : [])];
      },
      lostCalls: () => relay?.server.lost ?? NO_LOST_CALLS,
    };
  }
}
