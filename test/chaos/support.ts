/**
 * What the chaos scenarios share: a redis-server of their own (AOF on, killed and restarted on the
 * same port and folder), a round-robin TCP balancer in front of gateway replicas, a process's
 * resident memory, counting a batch's tasks by status, and the engine-sim + gateway pair most
 * scenarios start.
 */
import { readFile } from "node:fs/promises";
import net from "node:net";
import type { TaskRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import { startApp } from "../support/apps.js";
import { poll } from "../support/poll.js";

export { startOwnRedis, type OwnRedis } from "../support/own-redis.js";

export interface Balancer {
  url: string;
  /** Connections handed to each target. */
  counts: number[];
  close: () => Promise<void>;
}

/**
 * A tiny TCP load balancer: each new connection goes to the next target round-robin; a target
 * that refuses the connection is skipped for that connection (as a health-checking LB would).
 * Connections in flight to a target that dies are reset, which clients see as a network error.
 */
export async function startBalancer(targets: string[]): Promise<Balancer> {
  const addrs = targets.map((t) => new URL(t)).map((u) => ({ host: u.hostname, port: Number(u.port) }));
  const counts = addrs.map(() => 0);
  const sockets = new Set<net.Socket>();
  let next = 0;
  const server = net.createServer((client) => {
    sockets.add(client);
    client.on("close", () => sockets.delete(client));
    client.pause();
    const tryTarget = (attempt: number) => {
      if (attempt >= addrs.length) return client.destroy();
      const i = next++ % addrs.length;
      const upstream = net.connect(addrs[i]!.port, addrs[i]!.host);
      let connected = false;
      sockets.add(upstream);
      upstream.on("close", () => sockets.delete(upstream));
      upstream.on("error", () => {
        if (!connected) tryTarget(attempt + 1);
        else client.destroy();
      });
      upstream.once("connect", () => {
        connected = true;
        counts[i]!++;
        client.on("error", () => upstream.destroy());
        client.pipe(upstream);
        upstream.pipe(client);
        client.on("close", () => upstream.destroy());
        upstream.on("close", () => client.destroy());
        client.resume();
      });
    };
    tryTarget(0);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    counts,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** Resident memory of a process in KiB (/proc/<pid>/status VmRSS). */
export async function rssKiB(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
  if (!m) throw new Error(`no VmRSS for ${pid}`);
  return Number(m[1]);
}

export type Api = (p: string, init?: { method?: string; body?: unknown }) => Promise<{ status: number; body: any }>; // eslint-disable-line @typescript-eslint/no-explicit-any

/** Every task of a list, read from the gateway (in pages of concurrent reads). */
export async function readTasks(api: Api, ids: string[]): Promise<TaskRecord[]> {
  const out: TaskRecord[] = [];
  for (let i = 0; i < ids.length; i += 25) {
    const page = await Promise.all(ids.slice(i, i + 25).map(async (id) => (await api(`/v1/tasks/${id}`)).body as TaskRecord));
    out.push(...page);
  }
  return out;
}

export function byStatus(records: { status?: string }[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const r of records) out[r.status ?? "unreadable"] = (out[r.status ?? "unreadable"] ?? 0) + 1;
  return out;
}

/** Polls until every task is terminal (or the deadline); returns the last read. */
export async function waitAllTerminal(api: Api, ids: string[], timeoutMs: number): Promise<TaskRecord[]> {
  return poll(
    () => readTasks(api, ids).catch(() => [] as TaskRecord[]),
    (rs) => rs.length === ids.length && rs.every((r) => r?.result != null),
    timeoutMs,
    1_000,
  );
}

/** ROLLGATE_ENGINES for one engine-sim of 2 ranks serving Qwen3. */
export const simEngines = (url: string): string => JSON.stringify([{ kind: "vllm", url, dp_size: 2, profile: "qwen3" }]);

/** An engine-sim of 2 ranks and a gateway on it under `prefix`; both go into `procs` (the caller stops them). */
export async function startSimAndGateway(prefix: string, procs: StartedChild[]): Promise<{ engineUrl: string; gatewayUrl: string }> {
  const engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
  procs.push(engine);
  const gw = await startApp("gateway", ["--port", "0"], { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_ENGINES: simEngines(engine.ready) });
  procs.push(gw);
  return { engineUrl: engine.ready, gatewayUrl: gw.ready };
}
