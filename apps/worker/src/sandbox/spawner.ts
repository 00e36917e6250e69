import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import type * as ChildProcessModule from "node:child_process";
import { SPAWNER_PYTHON_SOURCE } from "./spawner-python.js";

/**
 * Starting a program from the worker's own process costs the worker's event loop a few
 * milliseconds per step: Node's `spawn` forks the whole worker (its page tables grow with its
 * heap) and then waits, synchronously, until the child has exec'd. The spawner is a small
 * long-lived node process, started once by the worker, that does the forking instead: the worker
 * asks it over its IPC channel to start a program, and gets back the pid, the output as it comes,
 * and the exit. The worker keeps everything else (timeouts, cancels, killing the process group by
 * pid, tails of the output), so a step behaves exactly as when the worker spawns it itself.
 *
 * The spawner is written as the source of `spawnerMain` and run with `node -e` by the worker's own
 * node: it must be self-contained (no imports, no outer names), built-ins only. It ignores SIGINT
 * and SIGTERM (the worker's graceful shutdown decides when steps end) and exits when the worker's
 * channel closes (the worker exited); a bubblewrap step (`--die-with-parent`) dies with it then,
 * as it died with the worker before.
 */
export function spawnerMain(): void {
  const { spawn: start } = process.getBuiltinModule("node:child_process") as typeof ChildProcessModule;
  type Req = { op: "spawn"; id: number; argv: string[]; cwd: string; env: Record<string, string> };
  const send = (m: object) => {
    if (process.connected) process.send!(m);
  };
  // Output not yet written to the worker's channel. Past OUT_HIGH messages (about 16 MiB of 64 KiB
  // reads) the programs' streams pause (their pipes fill and the programs wait in write), as a pipe
  // read by the worker itself would: a program that writes faster than a busy worker reads cannot
  // pile its output up here. High, because a pause leaves output in the pipe, and a line the
  // program prints on its other stream meanwhile may then be read first (the tail of an ordinary
  // flood must end with what was printed last); both streams pause together and resume in the order
  // they filled the backlog, which keeps that order most of the time, not always.
  const OUT_HIGH = 256;
  let backlog = 0;
  const paused = new Set<NodeJS.ReadableStream>();
  const sendOut = (stream: NodeJS.ReadableStream, other: NodeJS.ReadableStream, m: object) => {
    if (!process.connected) return;
    backlog++;
    process.send!(m, undefined, {}, () => {
      backlog--;
      if (backlog > OUT_HIGH / 2 || paused.size === 0) return;
      for (const s of paused) s.resume();
      paused.clear();
    });
    if (backlog >= OUT_HIGH) {
      for (const s of [stream, other]) {
        s.pause();
        paused.add(s);
      }
    }
  };
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(sig, () => {});
  process.on("disconnect", () => process.exit(0));
  process.on("message", (req: Req) => {
    if (req.op !== "spawn") return;
    const { id } = req;
    let child;
    try {
      child = start(req.argv[0]!, req.argv.slice(1), { cwd: req.cwd, env: req.env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
    } catch (err) {
      send({ op: "error", id, message: (err as Error).message });
      return;
    }
    let ended = false;
    if (child.pid !== undefined) send({ op: "spawned", id, pid: child.pid });
    child.stdout!.on("data", (b: Buffer) => sendOut(child.stdout!, child.stderr!, { op: "out", id, fd: 1, data: b }));
    child.stderr!.on("data", (b: Buffer) => sendOut(child.stderr!, child.stdout!, { op: "out", id, fd: 2, data: b }));
    child.on("error", (err) => {
      if (ended) return;
      ended = true;
      send({ op: "error", id, message: err.message });
    });
    child.on("exit", (code, signal) => {
      // As runProcess: whatever the program left running in its group goes with it, and we stop
      // waiting for pipes that an escaped grandchild might still hold open.
      if (child.pid !== undefined) {
        try {
          process.kill(-child.pid, "SIGKILL");
        } catch {
          // already gone
        }
      }
      const done = () => {
        if (ended) return;
        ended = true;
        send({ op: "exit", id, code, signal });
      };
      child.once("close", done);
      setTimeout(() => {
        child.stdout!.destroy();
        child.stderr!.destroy();
        done();
      }, 1_000).unref();
    });
  });
  send({ op: "ready" });
}

/** The spawner as a standalone script. */
export const SPAWNER_SOURCE = `// rollgate sandbox spawner (generated)\n(${spawnerMain.toString()})();\n`;

/** What a step started through the spawner reports, in order: spawned (pid), output, then exit or error. */
export interface SpawnHandlers {
  spawned(pid: number): void;
  output(fd: 1 | 2, data: Buffer): void;
  /** The program ended (and its output was all read, or given up on after a grace). */
  exit(code: number | null, signal: string | null): void;
  /** The program could not be started, or the spawner died under it. */
  error(message: string): void;
}

type Msg =
  | { op: "ready" }
  | { op: "spawned"; id: number; pid: number }
  // data from the node spawner (advanced serialization), b64 from the Python one (JSON)
  | { op: "out"; id: number; fd: 1 | 2; data?: Uint8Array; b64?: string }
  | { op: "exit"; id: number; code: number | null; signal: string | null }
  | { op: "error"; id: number; message: string };

/**
 * Which spawner runs: "python" (spawner-python.ts: about a tenth of the node spawner's CPU per
 * start), "node", or "auto": Python when a python3 of 3.9 or later with os.pidfd_open is on the
 * worker's PATH, else node.
 */
export type SpawnerKind = "auto" | "node" | "python";

const PYTHON_CHECK = "import os, sys; assert sys.version_info >= (3, 9); os.close(os.pidfd_open(os.getpid())); os.posix_spawn";
const pythonUsable = new Map<string, boolean>();
/** Whether the python3 on `PATH` can run the Python spawner (asked once per PATH, before the first step). */
export function pythonSpawnerUsable(PATH = process.env.PATH ?? ""): boolean {
  let usable = pythonUsable.get(PATH);
  if (usable === undefined) {
    usable = spawnSync("python3", ["-I", "-S", "-c", PYTHON_CHECK], { stdio: "ignore", env: { PATH }, timeout: 10_000 }).status === 0;
    pythonUsable.set(PATH, usable);
  }
  return usable;
}

/** The worker's side of the spawner: one per worker process, started on first use. */
export class Spawner {
  private proc: ChildProcess | null = null;
  private nextId = 1;
  private readonly running = new Map<number, { handlers: SpawnHandlers; pid: number | undefined }>();
  private readonly wanted: SpawnerKind;
  private resolved: "node" | "python" | undefined;
  private readonly path: string;

  /** `path`: where python3 is looked for (the spawner's own PATH; default the worker's). */
  constructor(o: { kind?: SpawnerKind; path?: string } = {}) {
    this.wanted = o.kind ?? "auto";
    this.path = o.path ?? process.env.PATH ?? "";
  }

  /** The spawner this one runs (decided on first use). */
  get kind(): "node" | "python" {
    this.resolved ??= this.wanted === "auto" ? (pythonSpawnerUsable(this.path) ? "python" : "node") : this.wanted;
    return this.resolved;
  }

  private start(): ChildProcess {
    const env = { PATH: this.path };
    const proc =
      this.kind === "python"
        ? spawn("python3", ["-I", "-S", "-c", SPAWNER_PYTHON_SOURCE, "rollgate-sandbox-spawner"], { stdio: ["ignore", "inherit", "inherit", "ipc"], serialization: "json", env })
        : spawn(process.execPath, ["-e", SPAWNER_SOURCE, "rollgate-sandbox-spawner"], { stdio: ["ignore", "inherit", "inherit", "ipc"], serialization: "advanced", env });
    proc.on("message", (m: Msg) => this.onMessage(m));
    const gone = (why: string) => {
      if (this.proc !== proc) return;
      this.proc = null;
      // The steps it was running lose their parent: they end as steps that could not be run.
      for (const [id, r] of this.running) {
        this.running.delete(id);
        if (r.pid !== undefined) killGroup(r.pid, "SIGKILL");
        r.handlers.error(`the sandbox spawner ${why}`);
      }
    };
    proc.on("exit", (code, signal) => gone(`exited (${signal ?? code})`));
    proc.on("error", (err) => gone(`failed: ${err.message}`));
    // It must not keep the worker alive by itself.
    proc.unref();
    (proc.channel as unknown as { unref?: () => void } | undefined)?.unref?.();
    return proc;
  }

  private onMessage(m: Msg) {
    if (m.op === "ready") return;
    const r = this.running.get(m.id);
    if (!r) return;
    switch (m.op) {
      case "spawned":
        r.pid = m.pid;
        r.handlers.spawned(m.pid);
        break;
      case "out":
        r.handlers.output(m.fd, m.b64 !== undefined ? Buffer.from(m.b64, "base64") : Buffer.from(m.data!.buffer, m.data!.byteOffset, m.data!.byteLength));
        break;
      case "exit":
        this.settle(m.id);
        r.handlers.exit(m.code, m.signal);
        break;
      case "error":
        this.settle(m.id);
        r.handlers.error(m.message);
        break;
    }
  }

  private settle(id: number) {
    this.running.delete(id);
    if (this.running.size === 0) (this.proc?.channel as unknown as { unref?: () => void } | undefined)?.unref?.();
  }

  /** Starts `argv` in its own process group (detached), stdout and stderr piped back. */
  spawn(o: { argv: string[]; cwd: string; env: Record<string, string> }, handlers: SpawnHandlers): void {
    this.proc ??= this.start();
    const id = this.nextId++;
    this.running.set(id, { handlers, pid: undefined });
    // While a step runs, the channel keeps the worker's event loop alive as the child's pipes would.
    if (this.running.size === 1) (this.proc.channel as unknown as { ref?: () => void } | undefined)?.ref?.();
    this.proc.send({ op: "spawn", id, argv: o.argv, cwd: o.cwd, env: o.env });
  }

  /** Stops the spawner (the worker's exit closes it anyway). */
  close(): void {
    this.proc?.kill("SIGKILL");
  }
}

function killGroup(pid: number, sig: NodeJS.Signals) {
  try {
    process.kill(-pid, sig);
  } catch {
    // already gone
  }
}

let shared: Spawner | undefined;
/** The worker process's spawner (started on first use). */
export function sharedSpawner(): Spawner {
  shared ??= new Spawner();
  return shared;
}
