import { spawn, type ChildProcess } from "node:child_process";
import readline from "node:readline";

export interface StartedChild {
  name: string;
  proc: ChildProcess;
  /** The first capture group of the ready line. */
  ready: string;
}

/**
 * Starts one app of the cluster as a child process and waits for its ready line on stdout. Every
 * line the child prints goes to our stderr, prefixed with its name, so stdout stays ours.
 */
export function startChild(
  name: string,
  command: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  readyLine: RegExp,
  timeoutMs = 60_000,
  /** Told of the process as soon as it is spawned (so a stop during start-up can reach it). */
  onSpawn?: (proc: ChildProcess) => void,
): Promise<StartedChild> {
  const proc = spawn(command, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  onSpawn?.(proc);
  const forward = (line: string) => process.stderr.write(`[${name}] ${line}\n`);
  readline.createInterface({ input: proc.stderr! }).on("line", forward);
  const out = readline.createInterface({ input: proc.stdout! });
  return new Promise((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => fail(new Error(`${name} did not become ready within ${timeoutMs} ms`)), timeoutMs);
    function fail(err: Error) {
      if (done) return;
      done = true;
      clearTimeout(timer);
      proc.kill("SIGKILL");
      reject(err);
    }
    out.on("line", (line) => {
      forward(line);
      const m = done ? null : readyLine.exec(line);
      if (m) {
        done = true;
        clearTimeout(timer);
        resolve({ name, proc, ready: m[1] ?? line });
      }
    });
    proc.on("error", (err) => fail(new Error(`${name} could not start: ${err.message}`)));
    proc.on("exit", (code, sig) => fail(new Error(`${name} exited before it was ready (${code ?? sig})`)));
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

/**
 * Calls `onGone` once the process that started this one is gone (this process was re-parented):
 * a launcher killed by a signal it could not pass on (npm, a shell, `npx`) must not leave the
 * cluster running without it.
 */
export function watchParent(onGone: () => void, everyMs = 500): () => void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid !== parent) {
      clearInterval(timer);
      onGone();
    }
  }, everyMs);
  timer.unref();
  return () => clearInterval(timer);
}
