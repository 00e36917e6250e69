import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { freePort } from "@rollgate/cluster/redis";

export interface LocalRedisCluster {
  url: string;
  ports: number[];
  /** The port of the master serving a key's slot. */
  masterFor: (key: string) => number;
  kill: (port: number) => void;
  /**
   * After a master died: waits for its replica to be promoted (cluster_state ok on the survivors).
   * If the automatic election has not happened within `autoMs` (it can lag on a loaded machine),
   * the replica is told to take over (CLUSTER FAILOVER TAKEOVER), as an operator would. Returns
   * how the replica took over.
   */
  awaitFailover: (deadPort: number, autoMs?: number, totalMs?: number) => Promise<"automatic" | "takeover">;
  stop: () => Promise<void>;
}

function cli(port: number, ...args: string[]): string {
  return spawnSync("redis-cli", ["-p", String(port), ...args], { encoding: "utf8" }).stdout;
}

/**
 * A real three-master Redis Cluster (one replica each) on loopback: six redis-server processes
 * and `redis-cli --cluster create`, all started and stopped here. A short node timeout makes a
 * killed master's replica take over within a few seconds.
 */
export async function startRedisCluster(): Promise<LocalRedisCluster> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "rg-rcluster-"));
  const ports: number[] = [];
  while (ports.length < 6) {
    const p = await freePort();
    if (!ports.includes(p)) ports.push(p);
  }
  const procs = new Map<number, ChildProcess>();
  for (const p of ports) {
    const d = path.join(dir, String(p));
    spawnSync("mkdir", ["-p", d]);
    procs.set(
      p,
      spawn(
        "redis-server",
        ["--port", String(p), "--bind", "127.0.0.1", "--dir", d, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--appendonly", "yes", "--save", ""],
        { stdio: "ignore" },
      ),
    );
  }
  for (const p of ports) {
    for (let i = 0; i < 50 && !cli(p, "ping").includes("PONG"); i++) await new Promise((r) => setTimeout(r, 100));
  }
  const create = spawnSync("redis-cli", ["--cluster", "create", ...ports.map((p) => `127.0.0.1:${p}`), "--cluster-replicas", "1", "--cluster-yes"], { encoding: "utf8" });
  if (create.status !== 0) throw new Error(`redis-cli --cluster create failed: ${create.stdout}${create.stderr}`);
  for (let i = 0; i < 100 && !ports.every((p) => cli(p, "cluster", "info").includes("cluster_state:ok")); i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  const masterFor = (key: string) => {
    const slot = Number(cli(ports[0]!, "cluster", "keyslot", key).trim());
    for (const line of cli(ports[0]!, "cluster", "nodes").split("\n")) {
      const f = line.split(" ");
      if (!f[2]?.includes("master") || f[2].includes("fail")) continue;
      for (const range of f.slice(8)) {
        const [a, b] = range.split("-").map(Number);
        if (slot >= a! && slot <= (b ?? a)!) return Number(f[1]!.split(":")[1]!.split("@")[0]);
      }
    }
    throw new Error(`no master for slot ${slot}`);
  };
  const alive = (dead: number) => ports.filter((p) => p !== dead);
  const healthy = (dead: number) => alive(dead).every((p) => cli(p, "cluster", "info").includes("cluster_state:ok"));
  const awaitFailover = async (dead: number, autoMs = 15_000, totalMs = 60_000) => {
    const start = Date.now();
    while (Date.now() - start < autoMs) {
      if (healthy(dead)) return "automatic" as const;
      await new Promise((r) => setTimeout(r, 250));
    }
    // The dead master's id, then the replica that follows it.
    const nodes = cli(alive(dead)[0]!, "cluster", "nodes").split("\n").map((l) => l.split(" "));
    const deadId = nodes.find((f) => f[1]?.startsWith(`127.0.0.1:${dead}@`))?.[0];
    const replica = nodes.find((f) => f[3] === deadId && f[2]?.includes("slave"));
    const replicaPort = replica ? Number(replica[1]!.split(":")[1]!.split("@")[0]) : undefined;
    if (replicaPort) cli(replicaPort, "cluster", "failover", "takeover");
    while (Date.now() - start < totalMs) {
      if (healthy(dead)) return "takeover" as const;
      await new Promise((r) => setTimeout(r, 250));
    }
    throw new Error(`the cluster did not recover after master ${dead} died:\n${cli(alive(dead)[0]!, "cluster", "nodes")}`);
  };
  return {
    awaitFailover,
    url: `redis+cluster://${ports.slice(0, 3).map((p) => `127.0.0.1:${p}`).join(",")}`,
    ports,
    masterFor,
    kill: (port) => procs.get(port)?.kill("SIGKILL"),
    stop: async () => {
      for (const proc of procs.values()) proc.kill("SIGKILL");
      await new Promise((r) => setTimeout(r, 200));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
