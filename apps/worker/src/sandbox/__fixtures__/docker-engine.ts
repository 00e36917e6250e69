import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import type { Duplex } from "node:stream";
import { buildTar, readTar } from "../tar.js";
import { type FakeContainer, killAll, newContainer, runProgram } from "./fake-programs.js";

/**
 * A RECORDED Docker Engine API: an HTTP server that answers the calls the docker runtime makes
 * the way dockerd does (paths, status codes, the hijacked multiplexed exec stream with its 8-byte
 * frame headers), records every call, and validates what it can. No Docker engine runs here.
 */

export interface Call {
  method: string;
  path: string;
  query: URLSearchParams;
  body: unknown;
}

interface FakeDockerContainer extends FakeContainer {
  id: string;
  name: string;
  config: Record<string, unknown>;
  labels: Record<string, string>;
  state: "created" | "running" | "exited";
  imageEnv: string[];
}

export interface FakeNetwork {
  id: string;
  name: string;
  internal: boolean;
  labels: Record<string, string>;
  gateway: string;
  /** Connected containers: id → name and address. */
  containers: Map<string, { name: string; address: string }>;
}

interface FakeExec {
  id: string;
  container: FakeDockerContainer;
  config: { Cmd: string[]; Env?: string[]; WorkingDir?: string };
  exitCode: number | null;
  running: boolean;
}

export class FakeDockerEngine {
  readonly calls: Call[] = [];
  readonly containers = new Map<string, FakeDockerContainer>();
  readonly execs = new Map<string, FakeExec>();
  /** Images the engine has, with their ENV. */
  readonly images = new Map<string, string[]>([["python:3.12", ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "PYTHON_VERSION=3.12"]]]);
  /** Images a pull can fetch. */
  readonly registry = new Set<string>(["busybox:latest"]);
  /** Networks by name: the predefined ones and those created through the API. */
  readonly networks = new Map<string, FakeNetwork>([
    ["bridge", { id: "bridge0".padEnd(64, "0"), name: "bridge", internal: false, labels: {}, gateway: "172.17.0.1", containers: new Map() }],
    ["rollgate-sandbox", { id: "rgsb".padEnd(64, "0"), name: "rollgate-sandbox", internal: false, labels: {}, gateway: "172.18.0.1", containers: new Map() }],
  ]);
  /**
   * The gateway address a created network gets, and the address a container connected to it
   * gets: loopback by default, so the relay the worker starts "on the network" can really be
   * reached from the test.
   */
  networkGateway = "127.0.0.1";
  /** When set, POST /containers/create fails with this message (a 500, as dockerd on a full disk). */
  failContainerCreate: string | null = null;
  connectedAddress = "127.0.0.1";
  /** Containers that exist on the engine outside rollgate (the worker's own, for ROLLGATE_DOCKER_RELAY_CONTAINER). */
  readonly external = new Map<string, string>([["rollgate-worker-1", "c0ffee".padEnd(64, "0")]]);
  private server = http.createServer((req, res) => void this.handle(req, res));
  port = 0;

  async start(): Promise<this> {
    this.server.on("upgrade", (req, socket, head) => void this.upgrade(req, socket, head));
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  async stop() {
    this.server.closeAllConnections();
    await new Promise((r) => this.server.close(r));
  }

  /** The calls as "METHOD /path" lines (for asserting the order). */
  trace(): string[] {
    return this.calls.map((c) => `${c.method} ${c.path}`);
  }

  /** A container "left over" by a crashed worker. */
  addLeftover(worker: string, extraLabels: Record<string, string> = {}): string {
    const id = randomBytes(32).toString("hex");
    this.containers.set(id, {
      ...newContainer(),
      id,
      name: `left-${id.slice(0, 6)}`,
      config: {},
      labels: { "rollgate.sandbox": "1", "rollgate.worker": worker, "rollgate.task": "old", ...extraLabels },
      state: "running",
      imageEnv: [],
    });
    return id;
  }

  private async body(req: http.IncomingMessage): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  private json(res: http.ServerResponse, status: number, body?: unknown) {
    if (body === undefined) {
      res.writeHead(status).end();
      return;
    }
    res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
  }

  private network(idOrName: string): FakeNetwork | undefined {
    return this.networks.get(idOrName) ?? [...this.networks.values()].find((n) => n.id === idOrName || n.id.startsWith(idOrName));
  }

  private container(id: string): FakeDockerContainer | undefined {
    return this.containers.get(id) ?? [...this.containers.values()].find((c) => c.name === id || c.id.startsWith(id));
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse) {
    const url = new URL(req.url!, "http://docker");
    const p = url.pathname.replace(/^\/v1\.\d+/, "");
    const raw = await this.body(req);
    const isJson = (req.headers["content-type"] ?? "").includes("json");
    const body = isJson && raw.length ? (JSON.parse(raw.toString("utf8")) as unknown) : raw;
    this.calls.push({ method: req.method!, path: p, query: url.searchParams, body });
    let m: RegExpExecArray | null;

    if (req.method === "GET" && (m = /^\/images\/(.+)\/json$/.exec(p))) {
      const env = this.images.get(decodeURIComponent(m[1]!));
      return env ? this.json(res, 200, { Id: "sha256:img", Config: { Env: env } }) : this.json(res, 404, { message: `No such image: ${m[1]}` });
    }
    if (req.method === "POST" && p === "/images/create") {
      const ref = `${url.searchParams.get("fromImage")}:${url.searchParams.get("tag") ?? "latest"}`;
      if (!this.registry.has(ref)) return this.json(res, 404, { message: `pull access denied for ${ref}, repository does not exist` });
      this.images.set(ref, ["PATH=/bin"]);
      res.writeHead(200, { "content-type": "application/json" });
      res.write(JSON.stringify({ status: "Pulling from library" }) + "\n");
      res.end(JSON.stringify({ status: "Downloaded newer image" }) + "\n");
      return;
    }
    if (req.method === "POST" && p === "/containers/create") {
      if (this.failContainerCreate) return this.json(res, 500, { message: this.failContainerCreate });
      const cfg = body as { Image: string; Labels?: Record<string, string>; HostConfig?: { NetworkMode?: string } };
      const image = this.images.get(cfg.Image) ?? this.images.get(`${cfg.Image}:latest`);
      if (!image) return this.json(res, 404, { message: `No such image: ${cfg.Image}` });
      const netName = cfg.HostConfig?.NetworkMode ?? "bridge";
      const net = this.network(netName);
      if (!net && netName !== "host" && netName !== "none") return this.json(res, 404, { message: `network ${netName} not found` });
      const id = randomBytes(32).toString("hex");
      const name = url.searchParams.get("name") ?? id;
      net?.containers.set(id, { name, address: `${net.gateway.replace(/\.\d+$/, "")}.${net.containers.size + 2}` });
      this.containers.set(id, { ...newContainer(), id, name, config: cfg, labels: cfg.Labels ?? {}, state: "created", imageEnv: image });
      return this.json(res, 201, { Id: id, Warnings: [] });
    }
    if (req.method === "POST" && p === "/networks/create") {
      const cfg = body as { Name: string; Internal?: boolean; Labels?: Record<string, string> };
      if (this.networks.has(cfg.Name)) return this.json(res, 409, { message: `network with name ${cfg.Name} already exists` });
      const id = randomBytes(32).toString("hex");
      this.networks.set(cfg.Name, { id, name: cfg.Name, internal: cfg.Internal === true, labels: cfg.Labels ?? {}, gateway: this.networkGateway, containers: new Map() });
      return this.json(res, 201, { Id: id, Warning: "" });
    }
    if (req.method === "GET" && p === "/networks") {
      const filters = JSON.parse(url.searchParams.get("filters") ?? "{}") as { label?: string[] };
      const list = [...this.networks.values()].filter((n) =>
        (filters.label ?? []).every((l) => {
          const [k, v] = l.split("=");
          return v === undefined ? k! in n.labels : n.labels[k!] === v;
        }),
      );
      return this.json(res, 200, list.map((n) => ({ Id: n.id, Name: n.name, Internal: n.internal, Labels: n.labels })));
    }
    if ((m = /^\/networks\/([^/]+)(\/connect|\/disconnect)?$/.exec(p))) {
      const n = this.network(m[1]!);
      if (!n) return this.json(res, 404, { message: `network ${m[1]} not found` });
      if (req.method === "GET" && !m[2]) {
        const containers = Object.fromEntries([...n.containers].map(([id, c]) => [id, { Name: c.name, IPv4Address: `${c.address}/24` }]));
        return this.json(res, 200, { Id: n.id, Name: n.name, Internal: n.internal, Labels: n.labels, IPAM: { Config: [{ Subnet: "x/24", Gateway: n.gateway }] }, Containers: containers });
      }
      const who = (body as { Container?: string }).Container ?? "";
      const id = this.external.get(who) ?? this.container(who)?.id;
      if (req.method === "POST" && m[2] === "/connect") {
        if (!id) return this.json(res, 404, { message: `No such container: ${who}` });
        n.containers.set(id, { name: who, address: this.connectedAddress });
        return this.json(res, 200);
      }
      if (req.method === "POST" && m[2] === "/disconnect") {
        if (!id || !n.containers.delete(id)) return this.json(res, 404, { message: `container ${who} is not connected to ${n.name}` });
        return this.json(res, 200);
      }
      if (req.method === "DELETE" && !m[2]) {
        const inUse = [...n.containers.keys()].filter((cid) => this.containers.has(cid) || [...this.external.values()].includes(cid));
        if (inUse.length) return this.json(res, 409, { message: `error while removing network: network ${n.name} has active endpoints` });
        this.networks.delete(n.name);
        return this.json(res, 204);
      }
    }
    if (req.method === "GET" && p === "/containers/json") {
      const filters = JSON.parse(url.searchParams.get("filters") ?? "{}") as { label?: string[] };
      const list = [...this.containers.values()].filter((c) =>
        (filters.label ?? []).every((l) => {
          const [k, v] = l.split("=");
          return v === undefined ? k! in c.labels : c.labels[k!] === v;
        }),
      );
      return this.json(res, 200, list.map((c) => ({ Id: c.id, Names: [`/${c.name}`], Labels: c.labels, State: c.state })));
    }
    if ((m = /^\/containers\/([^/]+)(\/.*)?$/.exec(p))) {
      const c = this.container(m[1]!);
      const sub = m[2] ?? "";
      if (!c) return this.json(res, 404, { message: `No such container: ${m[1]}` });
      if (req.method === "POST" && sub === "/start") {
        if (c.state === "running") return this.json(res, 304);
        c.state = "running";
        return this.json(res, 204);
      }
      if (req.method === "POST" && sub === "/kill") {
        if (c.state !== "running") return this.json(res, 409, { message: `Container ${c.id} is not running` });
        c.state = "exited";
        killAll(c);
        return this.json(res, 204);
      }
      if (req.method === "PUT" && sub === "/archive") {
        const dest = url.searchParams.get("path") ?? "";
        if (dest !== "/") return this.json(res, 400, { message: "this recording only extracts at /" });
        for (const e of readTar(raw)) c.fs.set(`/${e.path}`, e.type === "dir" ? null : Buffer.from(e.content ?? "").toString("utf8"));
        return this.json(res, 200);
      }
      if (req.method === "GET" && sub === "/archive") {
        const file = url.searchParams.get("path") ?? "";
        const content = c.fs.get(file);
        if (content === undefined) return this.json(res, 404, { message: `Could not find the file ${file} in container ${c.id}` });
        const tar = content === null ? buildTar([{ path: path.posix.basename(file), type: "dir" }]) : buildTar([{ path: path.posix.basename(file), type: "file", content }]);
        res.writeHead(200, { "content-type": "application/x-tar" }).end(tar);
        return;
      }
      if (req.method === "POST" && sub === "/exec") {
        if (c.state !== "running") return this.json(res, 409, { message: `Container ${c.id} is not running` });
        const id = randomBytes(32).toString("hex");
        this.execs.set(id, { id, container: c, config: body as FakeExec["config"], exitCode: null, running: false });
        return this.json(res, 201, { Id: id });
      }
      if (req.method === "DELETE" && sub === "") {
        if (c.state === "running" && url.searchParams.get("force") !== "true") return this.json(res, 409, { message: "stop the container before removing" });
        killAll(c);
        this.containers.delete(c.id);
        for (const n of this.networks.values()) n.containers.delete(c.id);
        return this.json(res, 204);
      }
    }
    if (req.method === "GET" && (m = /^\/exec\/([^/]+)\/json$/.exec(p))) {
      const ex = this.execs.get(m[1]!);
      if (!ex) return this.json(res, 404, { message: "No such exec instance" });
      return this.json(res, 200, { ID: ex.id, Running: ex.running, ExitCode: ex.exitCode, ProcessConfig: { entrypoint: ex.config.Cmd[0], arguments: ex.config.Cmd.slice(1) } });
    }
    return this.json(res, 404, { message: `page not found: ${req.method} ${p}` });
  }

  /** POST /exec/:id/start with Upgrade: tcp: 101, then the multiplexed stream until the program ends. */
  private async upgrade(req: http.IncomingMessage, socket: Duplex, _head: Buffer) {
    const url = new URL(req.url!, "http://docker");
    const p = url.pathname.replace(/^\/v1\.\d+/, "");
    this.calls.push({ method: req.method!, path: p, query: url.searchParams, body: null });
    const m = /^\/exec\/([^/]+)\/start$/.exec(p);
    const ex = m ? this.execs.get(m[1]!) : undefined;
    if (!ex || req.method !== "POST" || req.headers.upgrade !== "tcp") {
      socket.end("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
      return;
    }
    socket.write("HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n");
    const frame = (type: 1 | 2, s: string) => {
      const payload = Buffer.from(s, "utf8");
      const h = Buffer.alloc(8);
      h.writeUInt8(type, 0);
      h.writeUInt32BE(payload.length, 4);
      if (!socket.destroyed) socket.write(Buffer.concat([h, payload]));
    };
    const c = ex.container;
    const env: Record<string, string> = {};
    for (const kv of [...c.imageEnv, ...(ex.config.Env ?? [])]) {
      const i = kv.indexOf("=");
      env[kv.slice(0, i)] = kv.slice(i + 1);
    }
    ex.running = true;
    const result = await runProgram({ argv: ex.config.Cmd, env, cwd: ex.config.WorkingDir ?? "/", c, out: (s) => frame(1, s), err: (s) => frame(2, s) });
    ex.running = false;
    if (result === null) {
      frame(1, `OCI runtime exec failed: exec failed: unable to start container process: exec: "${ex.config.Cmd[0]}": executable file not found in $PATH: unknown\r\n`);
      ex.exitCode = 127;
    } else {
      ex.exitCode = result === "killed" ? 137 : result;
    }
    socket.end();
  }
}
