/**
 * A redis-server of a test's own: its own port and folder, AOF fsynced on every write (a SIGKILL
 * loses nothing acknowledged), killed and started again on the same port and folder.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { freePort } from "@rollgate/testkit";
import { poll } from "./poll.js";

export interface OwnRedis {
  url: string;
  port: number;
  kill: () => Promise<void>;
  start: () => Promise<void>;
  stop: () => Promise<void>;
}

async function answers(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    s.setTimeout(500, () => {
      s.destroy();
      resolve(false);
    });
    s.on("error", () => resolve(false));
    s.on("connect", () => s.write("PING\r\n"));
    s.on("data", (d) => {
      s.destroy();
      resolve(String(d).startsWith("+PONG"));
    });
  });
}

/** A redis-server on its own port and folder, AOF fsynced on every write (so a SIGKILL loses nothing acknowledged). */
export async function startOwnRedis(): Promise<OwnRedis> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "rg-chaos-redis-"));
  const port = await freePort();
  let proc: ChildProcess | null = null;
  const start = async () => {
    proc = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--dir", dir, "--appendonly", "yes", "--appendfsync", "always", "--save", ""], { stdio: "ignore" });
    const up = await poll(() => answers(port), (ok) => ok, 10_000, 100);
    if (!up) throw new Error(`redis-server did not start on ${port}`);
  };
  const kill = async () => {
    const p = proc;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    await new Promise<void>((r) => {
      p.once("exit", () => r());
      p.kill("SIGKILL");
    });
  };
  await start();
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    kill,
    start,
    stop: async () => {
      await kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
