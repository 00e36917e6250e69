/**
 * A sealed bubblewrap sandbox, for real: a hostile program (__fixtures__/escape-probe.mjs) runs
 * inside it and tries every way out a policy under RL might find — Redis, the "gateway"'s own
 * port, its trainer and admin routes through the relay (with path tricks), another session,
 * another sandbox's relay socket, host unix sockets (path and abstract), the metadata address,
 * the worker's environment and a key file — while its own session's routes work, streaming
 * included. The egress policy lets exactly what it names through the relay's proxy.
 *
 * The "gateway" here is a plain HTTP server that records what reaches it (the relay must not
 * forward anything but the session's routes); test/e2e/sandbox-escape.test.ts does the same
 * against the real gateway, engine-sim and worker processes.
 */
import { randomUUID } from "node:crypto";
import { chmodSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { RuntimeSpec } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defaultSandboxPath } from "./environment.js";
import { SANDBOX_GATEWAY_PORT, probeBwrap } from "./isolation.js";
import { LocalRuntime, SandboxUnavailable } from "./local-runtime.js";
import type { Sandbox } from "./runtime.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const PROBE = readFileSync(path.join(here, "__fixtures__", "escape-probe.mjs"), "utf8");
const REPO = path.resolve(here, "../../../..");
const SANDBOX_PATH = defaultSandboxPath(REPO);
const REDIS_PORT = Number(new URL(process.env.REDIS_URL ?? "redis://127.0.0.1:6379").port || 6379);
const support = probeBwrap();
const SECRET = `worker-secret-${randomUUID()}`;

/** A non-loopback IPv4 address of this host (the egress tests' "internet"), if it has one. */
const hostIp = Object.values(os.networkInterfaces())
  .flat()
  .find((a) => a && a.family === "IPv4" && !a.internal)?.address;

interface Recorded {
  method: string;
  url: string;
}

let root: string;
let hostDir: string;
let gateway: http.Server;
let gatewayPort = 0;
const reached: Recorded[] = [];
let internet: http.Server;
let internetPort = 0;
let hostSocket: net.Server;
let abstractSocket: net.Server;
const abstractName = `\0rollgate-test-${randomUUID()}`;

function listen(server: net.Server, at: number | string, host?: string): Promise<number> {
  return new Promise((resolve) => {
    const done = () => resolve(typeof server.address() === "object" ? (server.address() as net.AddressInfo).port : 0);
    if (typeof at === "string") server.listen(at, done);
    else server.listen(at, host, done);
  });
}

beforeAll(async () => {
  root = mkdtempSync(path.join(os.tmpdir(), "rg-sealed-"));
  // A root worker's sandboxes run as an unprivileged user, who must pass through it (as through /tmp).
  chmodSync(root, 0o711);
  hostDir = mkdtempSync("/var/tmp/rg-worker-config-");
  writeFileSync(path.join(hostDir, "worker.key"), `-----BEGIN KEY----- ${SECRET}`);
  process.env.ROLLGATE_TEST_WORKER_SECRET = SECRET;
  // The "gateway": answers everything (so a leak would show), records every request it gets.
  gateway = http.createServer((req, res) => {
    reached.push({ method: req.method!, url: req.url! });
    if (req.url?.endsWith("/v1/chat/completions")) {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write('data: {"n":1}\n\n');
      setTimeout(() => res.end('data: {"n":2}\n\ndata: [DONE]\n\n'), 1500);
      return;
    }
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reached: req.url }));
  });
  gatewayPort = await listen(gateway, 0, "127.0.0.1");
  internet = http.createServer((_req, res) => res.writeHead(200).end("egress-ok"));
  internetPort = await listen(internet, 0, "0.0.0.0");
  hostSocket = net.createServer((s) => s.end("host socket\n"));
  await listen(hostSocket, path.join(hostDir, "host.sock"));
  abstractSocket = net.createServer((s) => s.end("abstract\n"));
  await listen(abstractSocket, abstractName);
});

afterAll(async () => {
  delete process.env.ROLLGATE_TEST_WORKER_SECRET;
  for (const s of [gateway, internet, hostSocket, abstractSocket]) await new Promise((r) => s?.close(r));
  rmSync(root, { recursive: true, force: true });
  rmSync(hostDir, { recursive: true, force: true });
});

const runtime = () => new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support });
const spec = (extra: Record<string, unknown> = {}) => RuntimeSpec.parse({ kind: "local", isolation: "bwrap", files: { "probe.mjs": PROBE }, ...extra });
const session = (id: string) => ({ id, url: `http://127.0.0.1:${gatewayPort}/s/${id}` });

async function probe(sb: Sandbox, plan: Record<string, unknown>[], extraEnv: Record<string, string> = {}) {
  const r = await sb.exec(["node", "probe.mjs"], {
    env: { PATH: SANDBOX_PATH, HOME: sb.home, PROBE_PLAN: JSON.stringify(plan), ...extraEnv },
    timeoutMs: 60_000,
  });
  expect(r.exitCode, r.logTail).toBe(0);
  const out: Record<string, Record<string, unknown>> = {};
  for (const line of r.stdoutTail.split("\n").filter((l) => l.startsWith("{"))) {
    const o = JSON.parse(line) as Record<string, unknown>;
    out[o.probe as string] = o;
  }
  return out;
}

describe.skipIf(!support.usable || !support.netns)(`a sealed bubblewrap sandbox (${support.reason ?? "bwrap usable with network namespaces"})`, () => {
  it("lets the agent reach its own session (streamed without buffering) and nothing else: not Redis, the gateway's other routes, another session or sandbox, host sockets, metadata, the worker's environment or files", async () => {
    const rt = runtime();
    const other = await rt.create("t-other", spec(), { session: session("s-other") });
    const sb = await rt.create("t-sealed", spec(), { session: session("s-mine") });
    try {
      expect(sb.sessionUrl).toBe(`http://127.0.0.1:${SANDBOX_GATEWAY_PORT}/s/s-mine`);
      const otherRelay = readdirSync(root)
        .filter((d) => d.startsWith("rollgate-relay-t-other-"))
        .map((d) => path.join(root, d, "gateway.sock"))[0]!;
      const relay = `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}`;
      const res = await probe(sb, [
        // What it may do.
        { kind: "http", name: "models", url: `${relay}/s/s-mine/v1/models` },
        { kind: "http", name: "stream", url: `${relay}/s/s-mine/v1/chat/completions`, method: "POST", body: { stream: true } },
        // The worker's infrastructure, directly.
        { kind: "tcp", name: "redis", host: "127.0.0.1", port: REDIS_PORT },
        { kind: "tcp", name: "gateway port", host: "127.0.0.1", port: gatewayPort },
        ...(hostIp ? [{ kind: "tcp", name: "host address", host: hostIp, port: internetPort }] : []),
        { kind: "tcp", name: "metadata", host: "169.254.169.254", port: 80 },
        { kind: "tcp", name: "other relay", path: otherRelay },
        { kind: "tcp", name: "host unix socket", path: path.join(hostDir, "host.sock") },
        { kind: "tcp", name: "abstract socket", path: abstractName },
        // The gateway's other routes through the relay, and the usual path tricks.
        { kind: "http", name: "tasks", url: `${relay}/v1/tasks` },
        { kind: "http", name: "admin", url: `${relay}/admin/engines` },
        { kind: "http", name: "metrics", url: `${relay}/metrics` },
        { kind: "http", name: "another session", url: `${relay}/s/s-other/v1/models` },
        { kind: "http", name: "dot-dot", url: relay, rawPath: "/s/s-mine/../../v1/tasks" },
        { kind: "http", name: "encoded dot-dot", url: relay, rawPath: "/s/s-mine/%2e%2e/%2E%2E/admin/engines" },
        { kind: "http", name: "encoded slash", url: relay, rawPath: "/s/s-mine/..%2f..%2fv1%2ftasks" },
        { kind: "http", name: "prefix", url: relay, rawPath: "/s/s-mine-not/v1/models" },
        { kind: "http", name: "absolute form", url: `http://127.0.0.1:${gatewayPort}/v1/tasks`, proxy: `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}` },
        { kind: "tunnel", name: "connect", proxy: `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}`, target: `127.0.0.1:${gatewayPort}` },
        // Secrets and the host's files.
        { kind: "environ", name: "environ", needleReversed: [...SECRET].reverse().join("") },
        { kind: "read", name: "worker environ", path: `/proc/${process.pid}/environ` },
        { kind: "read", name: "key file", path: path.join(hostDir, "worker.key") },
        { kind: "read", name: "shadow", path: "/etc/shadow" },
        // The other sandbox's folder on the host (inside, each sandbox has its own at the same path).
        { kind: "read", name: "other sandbox", path: path.join(other.describe(), "work", "probe.mjs") },
        { kind: "read", name: "own folder's host path", path: path.join(sb.describe(), "work", "probe.mjs") },
        { kind: "read", name: "own file", path: path.join(sb.workdir, "probe.mjs") },
        { kind: "write", name: "system", path: "/usr/rollgate-was-here" },
        { kind: "write", name: "relay folder", path: "/run/rollgate/gateway.sock" },
        { kind: "write", name: "own folder", path: path.join(sb.workdir, "mine.txt") },
        { kind: "caps", name: "caps" },
      ]);

      expect(res.models).toMatchObject({ status: 200, body: JSON.stringify({ reached: "/s/s-mine/v1/models" }) });
      // The SSE answer's first event arrives when the gateway sends it, not with the last.
      expect(res.stream!.status).toBe(200);
      expect(res.stream!.body).toContain('{"n":2}');
      const chunks = res.stream!.chunks as number[];
      expect(chunks.length).toBeGreaterThanOrEqual(2);
      expect(chunks.at(-1)! - chunks[0]!).toBeGreaterThan(1000);

      for (const name of ["redis", "gateway port", "metadata", ...(hostIp ? ["host address"] : [])]) {
        expect(res[name], name).toMatchObject({ connected: false });
        expect(["ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH"], `${name}: ${String(res[name]!.code)}`).toContain(res[name]!.code);
      }
      expect(res["other relay"]).toMatchObject({ connected: false, code: "ENOENT" });
      expect(res["host unix socket"]).toMatchObject({ connected: false, code: "ENOENT" });
      expect(res["abstract socket"]).toMatchObject({ connected: false, code: "ECONNREFUSED" });
      for (const name of ["tasks", "admin", "metrics", "another session", "dot-dot", "encoded dot-dot", "encoded slash", "prefix", "absolute form", "connect"]) {
        expect(res[name]!.status, `${name}: ${JSON.stringify(res[name])}`).toBe(403);
      }
      expect(res.environ).toMatchObject({ holding: 0 });
      expect((res.environ!.pids as number) < 10).toBe(true);
      expect(res["worker environ"]).toMatchObject({ read: false, code: "ENOENT" });
      expect(res["key file"]).toMatchObject({ read: false, code: "ENOENT" });
      expect(res.shadow).toMatchObject({ read: false, code: "ENOENT" });
      expect(res["other sandbox"]).toMatchObject({ read: false, code: "ENOENT" });
      // Its own folders are at the fixed paths every sandbox has, not at their host paths.
      expect([sb.workdir, sb.home, sb.tmp]).toEqual(["/workspace", "/rollgate/home", "/rollgate/tmp"]);
      expect(res["own folder's host path"]).toMatchObject({ read: false, code: "ENOENT" });
      expect(res["own file"]).toMatchObject({ read: true });
      expect(res.system).toMatchObject({ written: false });
      expect(res["relay folder"]).toMatchObject({ written: false });
      expect(res["own folder"]).toMatchObject({ written: true });
      expect(res.caps!.capEff).toBe("0000000000000000");

      // Nothing but the session's two calls reached the gateway.
      expect(reached.map((r) => `${r.method} ${r.url}`).sort()).toEqual(["GET /s/s-mine/v1/models", "POST /s/s-mine/v1/chat/completions"]);
    } finally {
      await sb.destroy();
      await other.destroy();
    }
    expect(readdirSync(root)).toEqual([]);
  }, 90_000);

  it.skipIf(!hostIp)("runtime.egress: the agent's HTTP proxy reaches what the task allows, and never loopback, metadata or other hosts", async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, egressDeny: [] });
    const sb = await rt.create("t-egress", spec({ egress: [hostIp!] }), { session: session("s-egress") });
    try {
      const proxy = { proxy: `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}` };
      const res = await probe(sb, [
        { kind: "http", name: "allowed http", url: `http://${hostIp}:${internetPort}/x`, ...proxy },
        { kind: "tunnel", name: "allowed connect", target: `${hostIp}:${internetPort}`, ...proxy },
        { kind: "tcp", name: "direct", host: hostIp, port: internetPort },
        { kind: "tunnel", name: "redis", target: `127.0.0.1:${REDIS_PORT}`, ...proxy },
        { kind: "tunnel", name: "localhost", target: `localhost:${gatewayPort}`, ...proxy },
        { kind: "http", name: "metadata", url: "http://169.254.169.254/latest/meta-data/", ...proxy },
        { kind: "tunnel", name: "elsewhere", target: "192.0.2.10:443", ...proxy },
        { kind: "http", name: "session still", url: `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}/s/s-egress/v1/models` },
        { kind: "env", name: "env" },
      ]);
      expect(res["allowed http"]).toMatchObject({ status: 200, body: "egress-ok" });
      expect(res["allowed connect"]).toMatchObject({ status: 200, tunneled: "HTTP/1.1 200 OK" });
      expect(res.direct).toMatchObject({ connected: false });
      for (const name of ["redis", "localhost", "metadata", "elsewhere"]) expect(res[name]!.status, `${name}: ${JSON.stringify(res[name])}`).toBe(403);
      expect(res["session still"]).toMatchObject({ status: 200 });
      expect(res.env!.env).toMatchObject({ HTTPS_PROXY: `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}`, NO_PROXY: "127.0.0.1,localhost" });
    } finally {
      await sb.destroy();
    }
  }, 60_000);

  it("a program that does not exist is a spawn error, as outside the sandbox", async () => {
    const sb = await runtime().create("t-missing", spec(), { session: session("s-missing") });
    try {
      const r = await sb.exec(["no-such-agent-here"], { env: { PATH: SANDBOX_PATH }, timeoutMs: 20_000 });
      expect(r.exitCode).toBeNull();
      expect(r.spawnError).toMatch(/cannot start no-such-agent-here: .*ENOENT/);
    } finally {
      await sb.destroy();
    }
  });
});

describe("where the network cannot be sealed", () => {
  it('refuses a sealed bwrap sandbox (SandboxUnavailable, saying why) and still runs a "host" one', async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: { usable: support.usable, netns: false, userns: support.userns, reason: "bubblewrap cannot create a network namespace here: test" } });
    await expect(rt.create("t-nonet", spec(), { session: session("s-nonet") })).rejects.toThrow(SandboxUnavailable);
    await expect(rt.create("t-nonet", spec(), { session: session("s-nonet") })).rejects.toThrow(/runtime.network "sealed" needs a network namespace, and bubblewrap cannot create a network namespace here/);
    expect(readdirSync(root)).toEqual([]);
    if (!support.usable) return;
    const sb = await rt.create("t-host", spec({ network: "host" }), { session: session("s-host") });
    try {
      expect(sb.sessionUrl).toBeNull();
      const r = await probe(sb, [{ kind: "http", name: "gateway", url: `http://127.0.0.1:${gatewayPort}/v1/tasks` }]);
      expect(r.gateway).toMatchObject({ status: 200 });
    } finally {
      await sb.destroy();
    }
  });

  it("refuses any bwrap sandbox where bubblewrap cannot start", async () => {
    const rt = new LocalRuntime({ root, bwrap: { usable: false, netns: false, userns: "none", reason: "bubblewrap cannot start a sandbox here: test" } });
    await expect(rt.create("t-nobwrap", spec({ network: "host" }))).rejects.toThrow(/runtime.isolation is bwrap but bubblewrap cannot start a sandbox here/);
  });
});
