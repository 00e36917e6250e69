import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

export interface RunningCluster {
  url: string;
  proc: ChildProcess;
  /** Everything the cluster printed (its apps' logs come on stderr), for failure messages. */
  output: () => string;
  stop: () => Promise<void>;
}

/** Starts `npm start`'s cluster (the built apps/cluster) on free ports and waits for its ready line. */
export function startCluster(env: Record<string, string>, timeoutMs = 60_000): Promise<RunningCluster> {
  const proc = spawn(process.execPath, [path.join(REPO_ROOT, "apps/cluster/dist/main.js")], {
    env: { ...process.env, PORT: "0", LOG_LEVEL: "warn", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: string[] = [];
  readline.createInterface({ input: proc.stderr! }).on("line", (l) => lines.push(l));
  const output = () => lines.slice(-200).join("\n");
  const stop = () =>
    new Promise<void>((resolve) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
      const timer = setTimeout(() => proc.kill("SIGKILL"), 20_000);
      proc.once("exit", () => {
        clearTimeout(timer);
        resolve();
      });
      proc.kill("SIGTERM");
    });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      void stop();
      reject(new Error(`cluster not ready in ${timeoutMs} ms:\n${output()}`));
    }, timeoutMs);
    readline.createInterface({ input: proc.stdout! }).on("line", (line) => {
      lines.push(line);
      const m = /^rollgate ready: (\S+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve({ url: m[1]!, proc, output, stop });
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`cluster exited with ${code} before it was ready:\n${output()}`));
    });
  });
}
