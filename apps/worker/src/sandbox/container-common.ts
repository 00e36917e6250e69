import path from "node:path";
import type { RunResult } from "./process.js";
import { TailBuffer } from "./process.js";
import { MAX_READ_BYTES } from "./workdir.js";

/**
 * What the container runtimes (`docker`, `kubernetes`) share: the in-container layout, resource
 * quantities, label-safe names, output tails, and the pod bound.
 */

/** The working directory inside a container unless the task sets `runtime.workdir`. */
export const DEFAULT_WORKDIR = "/workspace";
/** HOME and TMPDIR of sandboxed programs inside a container (created, world-writable, by the runtime). */
export const CONTAINER_HOME = "/rollgate/home";
export const CONTAINER_TMP = "/rollgate/tmp";
/** PID 1 of every sandbox: it does nothing, steps run beside it through exec. */
export const IDLE_COMMAND = ["sleep", "infinity"];
/** Printed by a container step that could not start its program: the runtime maps it to `spawnError`. */
export const CANNOT_START = "rollgate-sandbox: cannot start";

/** Options both container runtimes take from the worker. */
export interface ContainerRuntimeOptions {
  /** This worker's name: every sandbox is labelled with it, and the start-up sweep removes this worker's leftovers. */
  workerName: string;
  /**
   * The PATH the worker gives local sandboxes (ROLLGATE_SANDBOX_PATH or its default). A step whose
   * PATH is exactly this gets the image's own PATH instead: host folders mean nothing in a container.
   * A PATH set by the task (`agent.env.PATH`) is kept.
   */
  workerPath?: string;
}

/** Cores ("2", "0.5", "500m", 1.5) → a number of CPUs. */
export function cpuToNumber(q: string | number): number {
  if (typeof q === "number") return q;
  return q.endsWith("m") ? Number(q.slice(0, -1)) / 1000 : Number(q);
}

const MEMORY_UNITS: Record<string, number> = { "": 1, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 };

/** "512Mi", "2Gi", "1G", 1073741824 → bytes. */
export function memoryToBytes(q: string | number): number {
  if (typeof q === "number") return q;
  const m = /^(\d+(?:\.\d+)?)([A-Za-z]*)$/.exec(q);
  const unit = m ? MEMORY_UNITS[m[2]!] : undefined;
  if (!m || unit === undefined) throw new Error(`bad memory quantity: ${q}`);
  return Math.round(Number(m[1]) * unit);
}

/** A Kubernetes quantity string for a CPU value (numbers become cores). */
export function cpuQuantity(q: string | number): string {
  return typeof q === "number" ? String(q) : q;
}

/** A Kubernetes quantity string for a memory value (numbers are bytes). */
export function memoryQuantity(q: string | number): string {
  return typeof q === "number" ? String(q) : q;
}

/** A valid Kubernetes label value (≤ 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends). */
export function labelValue(s: string): string {
  const v = s
    .replace(/[^A-Za-z0-9._-]+/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "")
    .slice(0, 63)
    .replace(/[^A-Za-z0-9]+$/, "");
  return v || "x";
}

/** A DNS-1123 name fragment (lowercase alphanumerics and '-'). */
export function dnsName(s: string, max: number): string {
  const v = s
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, "-")
    .replace(/^-+/, "")
    .slice(0, max)
    .replace(/-+$/, "");
  return v || "x";
}

/** The absolute path inside the container of a working-directory file, or null when it escapes. */
export function insideWorkdir(workdir: string, rel: string): string | null {
  const target = path.posix.resolve(workdir, rel);
  return target.startsWith(workdir.replace(/\/+$/, "") + "/") ? target : null;
}

/**
 * Reads a container's file as readFileInside reads the host's: only a regular file (a FIFO the
 * agent left at the path would block the read until the pod's deadline, `/dev/zero` behind a link
 * would never end), and at most MAX_READ_BYTES and one more, which tells a bigger one (a sparse
 * `truncate -s 20G` costs the agent nothing and would fill the worker's memory). `$1`: the path.
 */
export const READ_FILE_SCRIPT = `[ -f "$1" ] || exit 3; exec head -c ${MAX_READ_BYTES + 1} -- "$1"`;

/** The bytes of a file read out of a container, kept up to MAX_READ_BYTES: past it the file reads as absent. */
export class CappedRead {
  private readonly chunks: Buffer[] = [];
  private bytes = 0;
  /** Set once more than `max` bytes came (nothing more is kept). */
  over = false;
  constructor(private readonly max = MAX_READ_BYTES) {}
  push(b: Buffer): void {
    if (this.over) return;
    this.bytes += b.length;
    if (this.bytes > this.max) {
      this.over = true;
      this.chunks.length = 0;
    } else this.chunks.push(b);
  }
  /** The whole file, or null when it was bigger than the limit. */
  result(): Buffer | null {
    return this.over ? null : Buffer.concat(this.chunks);
  }
}

/** Collects a step's output into the same tails and live callback as a local step. */
export class StepOutput {
  readonly all: TailBuffer;
  readonly stdout: TailBuffer;
  constructor(
    private readonly onOutput: ((chunk: Buffer) => void) | undefined,
    max = 64 * 1024,
  ) {
    this.all = new TailBuffer(max);
    this.stdout = new TailBuffer(max);
  }
  out(b: Buffer) {
    this.all.push(b);
    this.stdout.push(b);
    this.onOutput?.(b);
  }
  err(b: Buffer) {
    this.all.push(b);
    this.onOutput?.(b);
  }
}

/** How a container step ended, before it becomes a RunResult. */
export interface StepEnd {
  exitCode: number | null;
  /** Why the worker killed it, if it did. */
  killed: "timeout" | "abort" | null;
  /** The step never started (sandbox down, program missing). */
  spawnError?: string | null;
}

/**
 * The RunResult of a container step, with the local runtime's semantics: a step the worker killed
 * (timeout, cancel) has `signal: "SIGKILL"` and no exit code; a program that could not be started
 * (exit 126/127 with the engine's or our wrapper's "cannot start" message) has `spawnError`.
 */
export function stepResult(end: StepEnd, output: StepOutput, started: number): RunResult {
  const logTail = output.all.text();
  let spawnError = end.spawnError ?? null;
  let exitCode = end.exitCode;
  if (!end.killed && !spawnError && (exitCode === 126 || exitCode === 127)) {
    const line = logTail
      .split("\n")
      .reverse()
      .find((l) => l.includes(CANNOT_START) || /OCI runtime exec failed|exec failed: /.test(l));
    if (line) {
      spawnError = line.trim();
      exitCode = null;
    }
  }
  return {
    exitCode: end.killed ? null : exitCode,
    signal: end.killed ? "SIGKILL" : null,
    timedOut: end.killed === "timeout",
    aborted: end.killed === "abort",
    spawnError,
    logTail,
    stdoutTail: output.stdout.text(),
    durationMs: Date.now() - started,
  };
}

/** Counts down a step's deadline and watches its abort signal; `kill` runs once, on the first of the two. */
export function watchStep(
  timeoutMs: number,
  signal: AbortSignal | undefined,
  kill: (why: "timeout" | "abort") => void,
): { why: () => "timeout" | "abort" | null; stop: () => void } {
  let why: "timeout" | "abort" | null = null;
  const fire = (w: "timeout" | "abort") => {
    if (why) return;
    why = w;
    kill(w);
  };
  const timer = setTimeout(() => fire("timeout"), timeoutMs);
  const onAbort = () => fire("abort");
  if (signal?.aborted) queueMicrotask(onAbort);
  else signal?.addEventListener("abort", onAbort, { once: true });
  return {
    why: () => why,
    stop: () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    },
  };
}

/** A counting semaphore with a FIFO queue: at most `max` holders, the rest wait their turn. */
export class Semaphore {
  private held = 0;
  private readonly waiting: Array<() => void> = [];
  constructor(readonly max: number) {}
  get inUse(): number {
    return this.held;
  }
  get queued(): number {
    return this.waiting.length;
  }
  async acquire(): Promise<() => void> {
    if (this.held < this.max) this.held++;
    else await new Promise<void>((resolve) => this.waiting.push(resolve));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next) next(); // the slot passes straight to the next waiter
      else this.held--;
    };
  }
}

/** Sleeps (without keeping the process alive). */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref?.());
}
