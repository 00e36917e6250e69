import { spawn } from "node:child_process";
import type { Spawner } from "./spawner.js";

export interface RunOptions {
  argv: string[];
  cwd: string;
  env: Record<string, string>;
  timeoutMs: number;
  /** Aborting kills the process group (cancellation, worker shutdown). */
  signal?: AbortSignal;
  /** How much of the combined stdout/stderr to keep (the tail). */
  maxLogBytes?: number;
  /** Called with each chunk of output as it arrives (live logs). */
  onOutput?: (chunk: Buffer) => void;
  /** Start the program through this spawner (off the event loop: spawner.ts) instead of from this process. */
  spawner?: Spawner | null;
}

export interface RunResult {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  aborted: boolean;
  /** Set when the program could not be started at all (e.g. ENOENT). */
  spawnError: string | null;
  /** The tail of stdout and stderr interleaved as they came. */
  logTail: string;
  /** The tail of stdout alone (evaluators read their answer from it). */
  stdoutTail: string;
  durationMs: number;
}

const KILL_GRACE_MS = 2_000;

/** Keeps the last `max` bytes of a stream of chunks. */
export class TailBuffer {
  private chunks: Buffer[] = [];
  private size = 0;
  constructor(private readonly max: number) {}
  push(b: Buffer) {
    this.chunks.push(b);
    this.size += b.length;
    while (this.size - (this.chunks[0]?.length ?? 0) >= this.max && this.chunks.length > 1) {
      this.size -= this.chunks.shift()!.length;
    }
  }
  text(): string {
    const all = Buffer.concat(this.chunks);
    return all.subarray(Math.max(0, all.length - this.max)).toString("utf8");
  }
}

function killGroup(pid: number, sig: NodeJS.Signals) {
  try {
    process.kill(-pid, sig);
  } catch {
    // already gone
  }
}

/**
 * Runs one program in its own process group (detached), so a timeout or a cancel kills the agent
 * and everything it started: SIGTERM to the group, then SIGKILL after a short grace.
 */
export function runProcess(o: RunOptions): Promise<RunResult> {
  const started = Date.now();
  const tail = new TailBuffer(o.maxLogBytes ?? 64 * 1024);
  const stdoutTail = new TailBuffer(o.maxLogBytes ?? 64 * 1024);
  return new Promise((resolve) => {
    let timedOut = false;
    let aborted = false;
    let settled = false;
    let pid: number | undefined;
    const onData = (fd: 1 | 2, b: Buffer) => {
      tail.push(b);
      if (fd === 1) stdoutTail.push(b);
      o.onOutput?.(b);
    };
    let stopRequested = false;
    const stop = () => {
      stopRequested = true;
      if (pid === undefined) return;
      const p = pid;
      killGroup(p, "SIGTERM");
      setTimeout(() => killGroup(p, "SIGKILL"), KILL_GRACE_MS).unref();
    };
    const timer = setTimeout(() => {
      timedOut = true;
      stop();
    }, o.timeoutMs);
    const onAbort = () => {
      aborted = true;
      stop();
    };
    o.signal?.addEventListener("abort", onAbort, { once: true });
    if (o.signal?.aborted) onAbort();

    const finish = (r: Omit<RunResult, "timedOut" | "aborted" | "logTail" | "stdoutTail" | "durationMs">) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
      resolve({ ...r, timedOut, aborted, logTail: tail.text(), stdoutTail: stdoutTail.text(), durationMs: Date.now() - started });
    };
    if (o.spawner) {
      o.spawner.spawn(
        { argv: o.argv, cwd: o.cwd, env: o.env },
        {
          spawned: (p) => {
            pid = p;
            // A timeout or cancel that came while the program was being started.
            if (stopRequested) stop();
          },
          output: onData,
          exit: (code, sig) => finish({ exitCode: code, signal: sig, spawnError: null }),
          error: (message) => finish({ exitCode: null, signal: null, spawnError: message }),
        },
      );
      return;
    }
    const child = spawn(o.argv[0]!, o.argv.slice(1), {
      cwd: o.cwd,
      env: o.env,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
    });
    pid = child.pid;
    // A cancel that came before the step started still stops it.
    if (stopRequested) stop();
    child.stdout.on("data", (b: Buffer) => onData(1, b));
    child.stderr.on("data", (b: Buffer) => onData(2, b));
    child.on("error", (err) => finish({ exitCode: null, signal: null, spawnError: err.message }));
    child.on("exit", (code, sig) => {
      // The agent is done: whatever it left running in its group goes with it, and we stop
      // waiting for pipes that an escaped grandchild might still hold open.
      if (child.pid !== undefined) killGroup(child.pid, "SIGKILL");
      const settle = () => finish({ exitCode: code, signal: sig, spawnError: null });
      child.once("close", settle);
      setTimeout(() => {
        child.stdout.destroy();
        child.stderr.destroy();
        settle();
      }, 1_000).unref();
    });
  });
}
