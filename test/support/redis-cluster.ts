import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { freePort } from "@rollgate/testkit";

export interface LocalRedisCluster {
  url: string;
  ports: number[];
  /** The port of the master serving a key's slot. */
  masterFor: (key: string) => number;
  /**
   * Waits until the replica of the master on `port` has acknowledged every write the master took
   * so far (WAIT 1): a replica that is not in sync cannot take over (see `startRedisCluster`).
   */
  awaitReplicaInSync: (port: number, timeoutMs?: number) => Promise<void>;
  kill: (port: number) => void;
  /**
   * After a master died: waits for its replica to be promoted, as every live node sees it (the dead
   * master flagged FAIL and left without slots, cluster_state ok). If the automatic election has
   * not happened within `autoMs`, the replica is told to take over (CLUSTER FAILOVER TAKEOVER), as
   * an operator would. Says how the replica took over and how long after the call.
   */
  awaitFailover: (deadPort: number, autoMs?: number, totalMs?: number) => Promise<{ how: "automatic" | "takeover"; ms: number }>;
  /** The last `lines` lines of a node's log (for failure messages). */
  logTail: (port: number, lines?: number) => string;
  stop: () => Promise<void>;
}

function cli(port: number, ...args: string[]): string {
  return spawnSync("redis-cli", ["-p", String(port), ...args], { encoding: "utf8", timeout: 10_000 }).stdout ?? "";
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(what: string, ok: () => boolean, timeoutMs: number, detail: () => string = () => ""): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`Redis Cluster: ${what} not within ${timeoutMs} ms${detail() ? `:\n${detail()}` : ""}`);
    await sleep(100);
  }
}

/** `host:port@bus` (Redis 7 adds `,hostname`) → port. */
const portOf = (addr: string) => Number(addr.split(":")[1]!.split("@")[0]);

/**
 * A real three-master Redis Cluster (one replica each) on loopback: six redis-server processes
 * and `redis-cli --cluster create`, all started and stopped here. A short node timeout makes a
 * killed master's replica take over within a few seconds.
 *
 * It returns only once every replica has finished its initial sync. A replica that never synced
 * with its master cannot fail over: it counts its data as infinitely old ("Disconnected from master
 * for longer than allowed", cluster-replica-validity-factor), so the slots of a master killed
 * before that stay down for good, and a forced takeover would hand them over empty. Redis 7.0
 * syncs replicas diskless after repl-diskless-sync-delay (5 s by default), a window in which
 * cluster_state is already ok; the delay is 0 here.
 */
export async function startRedisCluster(): Promise<LocalRedisCluster> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "rg-rcluster-"));
  // Each node's cluster bus port is given explicitly (free as well): the default, port + 10000,
  // can be taken or, above 55535, invalid, and the node then exits at startup.
  const taken = new Set<number>();
  const pick = async () => {
    for (;;) {
      const p = await freePort();
      if (!taken.has(p)) {
        taken.add(p);
        return p;
      }
    }
  };
  const ports: number[] = [];
  const busPorts: number[] = [];
  for (let i = 0; i < 6; i++) {
    ports.push(await pick());
    busPorts.push(await pick());
  }
  const procs = new Map<number, ChildProcess>();
  const logOf = (p: number) => path.join(dir, String(p), "redis.log");
  const logTail = (p: number, lines = 40) => {
    if (!existsSync(logOf(p))) return `(no log for ${p})`;
    return readFileSync(logOf(p), "utf8")
      .split("\n")
      .filter((l) => l && !l.includes("WARNING Memory overcommit"))
      .slice(-lines)
      .map((l) => `  [${p}] ${l}`)
      .join("\n");
  };
  ports.forEach((p, i) => {
    const d = path.join(dir, String(p));
    mkdirSync(d, { recursive: true });
    const args = [
      ...["--port", String(p), "--cluster-port", String(busPorts[i]), "--bind", "127.0.0.1", "--dir", d, "--logfile", logOf(p)],
      ...["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"],
      ...["--appendonly", "yes", "--save", "", "--repl-diskless-sync-delay", "0"],
    ];
    procs.set(p, spawn("redis-server", args, { stdio: "ignore" }));
  });
  const allLogs = () => ports.map((p) => logTail(p, 15)).join("\n");
  try {
    for (const p of ports) {
      await until(`redis-server on ${p} answering`, () => procs.get(p)!.exitCode === null && cli(p, "ping").includes("PONG"), 20_000, () => logTail(p));
    }
    const create = spawnSync("redis-cli", ["--cluster", "create", ...ports.map((p) => `127.0.0.1:${p}`), "--cluster-replicas", "1", "--cluster-yes"], {
      encoding: "utf8",
      timeout: 60_000,
    });
    if (create.status !== 0) throw new Error(`redis-cli --cluster create failed: ${create.stdout}${create.stderr}`);
    await until("cluster_state ok on every node", () => ports.every((p) => cli(p, "cluster", "info").includes("cluster_state:ok")), 30_000, allLogs);
    const replicas = () => ports.filter((p) => cli(p, "role").startsWith("slave"));
    await until(
      "three replicas in sync with their masters",
      () => {
        const r = replicas();
        return r.length === 3 && r.every((p) => /master_link_status:up/.test(cli(p, "info", "replication")));
      },
      30_000,
      allLogs,
    );
  } catch (err) {
    for (const proc of procs.values()) proc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }

  const nodesSeenBy = (port: number) =>
    cli(port, "cluster", "nodes")
      .split("\n")
      .map((l) => l.trim().split(" "))
      .filter((f) => f.length >= 8);
  const masterFor = (key: string) => {
    const slot = Number(cli(ports[0]!, "cluster", "keyslot", key).trim());
    for (const f of nodesSeenBy(ports[0]!)) {
      if (!f[2]!.includes("master") || f[2]!.includes("fail")) continue;
      for (const range of f.slice(8)) {
        const [a, b] = range.split("-").map(Number);
        if (slot >= a! && slot <= (b ?? a)!) return portOf(f[1]!);
      }
    }
    throw new Error(`no master for slot ${slot}`);
  };
  const replicaOf = (master: number): number | undefined => {
    const nodes = nodesSeenBy(ports.find((p) => p !== master)!);
    const id = nodes.find((f) => portOf(f[1]!) === master)?.[0];
    const replica = nodes.find((f) => f[3] === id && f[2]!.includes("slave") && !f[2]!.includes("fail"));
    return replica ? portOf(replica[1]!) : undefined;
  };
  const awaitReplicaInSync = async (master: number, timeoutMs = 30_000) => {
    await until(
      `a replica of ${master} in sync`,
      // WAIT answers how many replicas acknowledged every write so far (here within 1 s).
      () => Number(cli(master, "wait", "1", "1000").trim()) >= 1,
      timeoutMs,
      () => [logTail(master, 15), ...(replicaOf(master) ? [logTail(replicaOf(master)!, 15)] : [])].join("\n"),
    );
  };
  const alive = (dead: number) => ports.filter((p) => p !== dead);
  // Promoted: every live node has flagged the dead master FAIL (not merely suspected, `fail?`),
  // sees no slot left on it, and is in cluster_state ok. cluster_state alone proves nothing: it
  // stays ok for about a node timeout after the kill, until the master is flagged FAIL, whether
  // or not any replica is ever promoted.
  const promoted = (dead: number) =>
    alive(dead).every((p) => {
      if (!cli(p, "cluster", "info").includes("cluster_state:ok")) return false;
      const f = nodesSeenBy(p).find((f) => portOf(f[1]!) === dead);
      return !!f && f[2]!.split(",").includes("fail") && f.slice(8).length === 0;
    });
  const awaitFailover = async (dead: number, autoMs = 15_000, totalMs = 60_000) => {
    const start = Date.now();
    // Looked up now: once it is promoted, the dead master is no longer its master.
    const replica = replicaOf(dead);
    while (Date.now() - start < autoMs) {
      if (promoted(dead)) return { how: "automatic" as const, ms: Date.now() - start };
      await sleep(250);
    }
    if (replica) cli(replica, "cluster", "failover", "takeover");
    while (Date.now() - start < totalMs) {
      if (promoted(dead)) return { how: "takeover" as const, ms: Date.now() - start };
      await sleep(250);
    }
    throw new Error(
      `the cluster did not recover after master ${dead} died (replica: ${replica ?? "none"}):\n` +
        `${cli(alive(dead)[0]!, "cluster", "nodes")}\n${replica ? logTail(replica) : ""}`,
    );
  };
  return {
    url: `redis+cluster://${ports.slice(0, 3).map((p) => `127.0.0.1:${p}`).join(",")}`,
    ports,
    masterFor,
    awaitReplicaInSync,
    kill: (port) => procs.get(port)?.kill("SIGKILL"),
    awaitFailover,
    logTail,
    stop: async () => {
      for (const proc of procs.values()) proc.kill("SIGKILL");
      await sleep(200);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
