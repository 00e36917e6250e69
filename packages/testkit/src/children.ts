import { spawn, type ChildProcess } from "node:child_process";
import readline from "node:readline";

export interface StartedChild {
  name: string;
  proc: ChildProcess;
  /** The first capture group of the ready line (or the whole line). */
  ready: string;
}

export interface StartChildOptions {
  /** The child's whole environment (default: ours). */
  env?: NodeJS.ProcessEnv;
  /** Its ready line on stdout: start-up is over at the first line that matches. */
  ready: RegExp;
  /** How long it has to print its ready line before it is killed (default 60 s). */
  timeoutMs?: number;
  /** Told of the process as soon as it is spawned (so a stop during start-up can reach it). */
  onSpawn?: (proc: ChildProcess) => void;
  /**
   * Each line the child prints, stdout and stderr. Default: our stderr, prefixed with its name, so
   * our stdout stays ours. When it is given, nobody has seen the output, so the error of a failed
   * start carries the child's last lines.
   */
  onLine?: (line: string) => void;
}

/** Lines of a failed start's output the error carries (when the caller took the output). */
const TAIL_LINES = 40;

/**
 * Starts a process (one of rollgate's apps, a fake server, a peer) and waits for its ready line on
 * stdout. It is killed if it exits, cannot spawn, or is not ready within the timeout.
 */
export function startChild(name: string, command: string, args: string[], options: StartChildOptions): Promise<StartedChild> {
  const { env = process.env, ready, timeoutMs = 60_000, onSpawn, onLine } = options;
  const proc = spawn(command, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  onSpawn?.(proc);
  const tail: string[] = [];
  const line = onLine
    ? (l: string) => {
        tail.push(l);
        if (tail.length > TAIL_LINES) tail.shift();
        onLine(l);
      }
    : (l: string) => process.stderr.write(`[${name}] ${l}\n`);
  readline.createInterface({ input: proc.stderr! }).on("line", line);
  const out = readline.createInterface({ input: proc.stdout! });
  return new Promise((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => fail(`${name} did not become ready within ${timeoutMs} ms`), timeoutMs);
    function fail(message: string) {
      if (done) return;
      done = true;
      clearTimeout(timer);
      proc.kill("SIGKILL");
      reject(new Error(tail.length ? `${message}; its last output:\n${tail.join("\n")}` : message));
    }
    out.on("line", (l) => {
      line(l);
      const m = done ? null : ready.exec(l);
      if (m) {
        done = true;
        clearTimeout(timer);
        resolve({ name, proc, ready: m[1] ?? l });
      }
    });
    proc.on("error", (err) => fail(`${name} could not start: ${err.message}`));
    proc.on("exit", (code, sig) => fail(`${name} exited before it was ready (${code ?? sig})`));
  });
}

/** SIGTERM, then SIGKILL if the child has not exited after `graceMs`. */
export function stopChild(proc: ChildProcess, graceMs = 10_000): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
    proc.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    proc.kill("SIGTERM");
  });
}
