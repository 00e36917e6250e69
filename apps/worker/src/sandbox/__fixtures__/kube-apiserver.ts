import { createHash, randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import { readTar } from "../tar.js";
import { type FakeContainer, killAll, newContainer, runProgram } from "./fake-programs.js";

/**
 * A RECORDED Kubernetes API server: the core/v1 pod and secret calls the kubernetes runtime makes
 * (create, read, delete, list with labelSelector/fieldSelector) and the pod exec WebSocket
 * (v4.channel.k8s.io: channel-prefixed binary frames, 0 = stdin, 1 = stdout, 2 = stderr,
 * 3 = the status JSON), answered the way the API server and kubelet do. It records every call,
 * resolves `valueFrom.secretKeyRef` when an exec starts like the kubelet does at container
 * start, and "runs" exec'd programs from a small table. No cluster runs here.
 */

export interface KCall {
  method: string;
  path: string;
  query: URLSearchParams;
  body: unknown;
}

interface Obj {
  metadata: { name: string; namespace?: string; uid?: string; labels?: Record<string, string>; ownerReferences?: Array<{ kind: string; name: string; uid: string }> };
  [k: string]: unknown;
}

interface FakePod extends FakeContainer {
  obj: Obj & { spec: { containers: Array<{ env?: Array<{ name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string } } }> }> }; status: Record<string, unknown> };
  reads: number;
}

const WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

export class FakeKubeApi {
  readonly calls: KCall[] = [];
  readonly pods = new Map<string, FakePod>();
  readonly secrets = new Map<string, Obj & { stringData?: Record<string, string>; data?: Record<string, string> }>();
  readonly networkPolicies = new Map<string, Obj & { spec?: unknown }>();
  /** How many reads a new pod stays Pending before it is Running. */
  pendingReads = 1;
  /** Set to make new pods fail to pull their image. */
  pullFails = false;
  /** The image's own ENV, and what Kubernetes injects into every container. */
  imageEnv: Record<string, string> = { PATH: "/usr/local/bin:/usr/bin:/bin", PYTHON_VERSION: "3.12" };
  injectedEnv: Record<string, string> = { KUBERNETES_SERVICE_HOST: "10.96.0.1", KUBERNETES_SERVICE_PORT: "443", KUBERNETES_PORT: "tcp://10.96.0.1:443", HOSTNAME: "pod" };
  private server = http.createServer((req, res) => void this.handle(req, res));
  port = 0;

  async start(): Promise<this> {
    this.server.on("upgrade", (req, socket) => this.upgrade(req, socket));
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  async stop() {
    this.server.closeAllConnections();
    await new Promise((r) => this.server.close(r));
  }

  kubeconfig(): string {
    return JSON.stringify({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: "recorded", cluster: { server: `http://127.0.0.1:${this.port}`, "insecure-skip-tls-verify": true } }],
      users: [{ name: "worker", user: { token: "sa-token" } }],
      contexts: [{ name: "recorded", context: { cluster: "recorded", user: "worker", namespace: "rollgate-sandboxes" } }],
      "current-context": "recorded",
    });
  }

  trace(): string[] {
    return this.calls.map((c) => `${c.method} ${c.path}`);
  }

  addLeftoverPod(name: string, labels: Record<string, string>, phase = "Running") {
    const obj = { apiVersion: "v1", kind: "Pod", metadata: { name, namespace: "rollgate-sandboxes", uid: randomUUID(), labels }, spec: { containers: [{}] }, status: { phase } };
    this.pods.set(name, { ...newContainer(), obj: obj as FakePod["obj"], reads: 0 });
  }

  private json(res: http.ServerResponse, status: number, body: unknown) {
    res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
  }

  private notFound(res: http.ServerResponse, what: string) {
    this.json(res, 404, { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: `${what} not found`, reason: "NotFound", code: 404 });
  }

  private podStatus(p: FakePod): Record<string, unknown> {
    p.reads++;
    if (this.pullFails) {
      return { phase: "Pending", containerStatuses: [{ name: "sandbox", ready: false, restartCount: 0, image: "x", imageID: "", state: { waiting: { reason: "ImagePullBackOff", message: "Back-off pulling image" } } }] };
    }
    if (p.reads <= this.pendingReads) return { phase: "Pending", containerStatuses: [{ name: "sandbox", ready: false, restartCount: 0, image: "x", imageID: "", state: { waiting: { reason: "ContainerCreating" } } }] };
    return { phase: "Running", containerStatuses: [{ name: "sandbox", ready: true, restartCount: 0, image: "x", imageID: "", state: { running: { startedAt: new Date().toISOString() } } }] };
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse) {
    const url = new URL(req.url!, "http://k8s");
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = chunks.length ? (JSON.parse(Buffer.concat(chunks).toString("utf8")) as Obj) : null;
    this.calls.push({ method: req.method!, path: url.pathname, query: url.searchParams, body });
    const np = /^\/apis\/networking\.k8s\.io\/v1\/namespaces\/([^/]+)\/networkpolicies(?:\/([^/]+))?$/.exec(url.pathname);
    if (np) {
      const [, ns, name] = np;
      if (req.method === "POST" && !name) {
        const obj = structuredClone(body!);
        if (this.networkPolicies.has(obj.metadata.name)) return this.json(res, 409, { kind: "Status", status: "Failure", code: 409, reason: "AlreadyExists" });
        obj.metadata = { ...obj.metadata, namespace: ns!, uid: randomUUID() };
        this.networkPolicies.set(obj.metadata.name, obj);
        return this.json(res, 201, obj);
      }
      if (req.method === "DELETE" && name) {
        if (!this.networkPolicies.delete(name)) return this.notFound(res, `networkpolicies "${name}"`);
        return this.json(res, 200, { kind: "Status", apiVersion: "v1", metadata: {}, status: "Success" });
      }
      return this.json(res, 405, { kind: "Status", status: "Failure", code: 405 });
    }
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/(pods|secrets)(?:\/([^/]+))?$/.exec(url.pathname);
    if (!m) return this.json(res, 404, { kind: "Status", status: "Failure", code: 404, message: `no route ${req.method} ${url.pathname}` });
    const [, ns, kind, name] = m as unknown as [string, string, "pods" | "secrets", string | undefined];
    const store = kind === "pods" ? this.pods : this.secrets;
    if (req.method === "POST" && !name) {
      const obj = structuredClone(body!);
      if (obj.metadata.namespace && obj.metadata.namespace !== ns) return this.json(res, 400, { kind: "Status", status: "Failure", code: 400, message: "namespace mismatch" });
      if (store.has(obj.metadata.name)) return this.json(res, 409, { kind: "Status", status: "Failure", code: 409, reason: "AlreadyExists" });
      obj.metadata = { ...obj.metadata, namespace: ns, uid: randomUUID() };
      if (kind === "pods") {
        const pod = { ...newContainer(), obj: { ...obj, status: { phase: "Pending" } } as unknown as FakePod["obj"], reads: 0 };
        this.pods.set(obj.metadata.name, pod);
        return this.json(res, 201, pod.obj);
      }
      this.secrets.set(obj.metadata.name, obj);
      return this.json(res, 201, obj);
    }
    if (req.method === "GET" && name) {
      const o = store.get(name);
      if (!o) return this.notFound(res, `${kind} "${name}"`);
      if (kind === "pods") {
        const p = o as FakePod;
        if (p.obj.status.phase === "Pending") p.obj.status = this.podStatus(p);
        return this.json(res, 200, p.obj);
      }
      return this.json(res, 200, o);
    }
    if (req.method === "DELETE" && name) {
      const o = store.get(name);
      if (!o) return this.notFound(res, `${kind} "${name}"`);
      store.delete(name);
      if (kind === "pods") {
        const p = o as FakePod;
        killAll(p);
        // The garbage collector: Secrets owned by the pod go with it.
        for (const [sn, s] of this.secrets) if (s.metadata.ownerReferences?.some((r) => r.kind === "Pod" && r.uid === p.obj.metadata.uid)) this.secrets.delete(sn);
        for (const [nn, n] of this.networkPolicies) if (n.metadata.ownerReferences?.some((r) => r.kind === "Pod" && r.uid === p.obj.metadata.uid)) this.networkPolicies.delete(nn);
        return this.json(res, 200, p.obj);
      }
      return this.json(res, 200, { kind: "Status", apiVersion: "v1", metadata: {}, status: "Success" });
    }
    if (req.method === "GET" && !name) {
      const sel = url.searchParams.get("labelSelector") ?? "";
      const fsel = url.searchParams.get("fieldSelector") ?? "";
      const objs = [...store.values()].map((o) => (kind === "pods" ? (o as FakePod).obj : (o as Obj)));
      const items = objs.filter((o) => matchLabels(o.metadata.labels ?? {}, sel) && matchFields(o, fsel));
      return this.json(res, 200, { kind: kind === "pods" ? "PodList" : "SecretList", apiVersion: "v1", metadata: {}, items });
    }
    return this.json(res, 405, { kind: "Status", status: "Failure", code: 405 });
  }

  /** The exec WebSocket: GET …/pods/:name/exec?command=…&stdin=…&stdout=true&stderr=true&container=… */
  private upgrade(req: http.IncomingMessage, socket: Duplex) {
    const url = new URL(req.url!, "http://k8s");
    this.calls.push({ method: "WS", path: url.pathname, query: url.searchParams, body: null });
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/exec$/.exec(url.pathname);
    const pod = m ? this.pods.get(m[2]!) : undefined;
    const protocols = String(req.headers["sec-websocket-protocol"] ?? "").split(/,\s*/);
    if (!pod || !protocols.includes("v4.channel.k8s.io")) {
      socket.end("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
      return;
    }
    const accept = createHash("sha1").update(`${String(req.headers["sec-websocket-key"])}${WS_GUID}`).digest("base64");
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n`);
    const ws = new MiniWs(socket);
    const send = (channel: number, data: string | Buffer) => ws.send(Buffer.concat([Buffer.from([channel]), Buffer.isBuffer(data) ? data : Buffer.from(data, "utf8")]));
    void this.runExec(pod, url.searchParams.getAll("command"), ws, send).then((status) => {
      send(3, JSON.stringify(status));
      ws.close();
    });
  }

  private podEnv(p: FakePod): Record<string, string> {
    const env: Record<string, string> = { ...this.imageEnv, ...this.injectedEnv };
    for (const e of p.obj.spec.containers[0]?.env ?? []) {
      if (e.value !== undefined) env[e.name] = e.value;
      const ref = e.valueFrom?.secretKeyRef;
      if (ref) {
        const s = this.secrets.get(ref.name);
        const v = s?.stringData?.[ref.key] ?? (s?.data?.[ref.key] !== undefined ? Buffer.from(s.data[ref.key]!, "base64").toString("utf8") : undefined);
        if (v === undefined) throw new Error(`CreateContainerConfigError: secret "${ref.name}" not found`);
        env[e.name] = v;
      }
    }
    return env;
  }

  private async runExec(p: FakePod, command: string[], ws: MiniWs, send: (ch: number, d: string | Buffer) => void): Promise<Record<string, unknown>> {
    const ok = { metadata: {}, status: "Success" };
    const exit = (code: number) =>
      code === 0 ? ok : { metadata: {}, status: "Failure", message: `command terminated with non-zero exit code: exit status ${code}`, reason: "NonZeroExitCode", details: { causes: [{ reason: "ExitCode", message: String(code) }] } };
    const sh = command[0] === "sh" && command[1] === "-c" ? command[2]! : null;
    let m: RegExpExecArray | null;
    if (sh === "kill -9 -1") {
      killAll(p);
      return ok;
    }
    if (sh && (m = /^\[ -f "\$1" \] \|\| exit 3; exec head -c (\d+) -- "\$1"$/.exec(sh))) {
      // A regular file's first bytes (the real sh runs this script in kubernetes-runtime.test.ts).
      const content = p.fifos.has(command[4]!) ? undefined : p.fs.get(command[4]!);
      if (typeof content !== "string") return exit(3);
      send(1, content.slice(0, Number(m[1])));
      return ok;
    }
    if (sh && (m = /^head -c (\d+) \| tar -xf - -C \/$/.exec(sh))) {
      const tar = await ws.stdin(Number(m[1]));
      for (const e of readTar(tar)) p.fs.set(`/${e.path}`, e.type === "dir" ? null : Buffer.from(e.content ?? "").toString("utf8"));
      return ok;
    }
    let env: Record<string, string>;
    try {
      env = this.podEnv(p);
    } catch (err) {
      return { metadata: {}, status: "Failure", message: (err as Error).message, reason: "InternalError" };
    }
    let argv = command;
    let cwd = "/";
    if (sh && (m = /^eval "\$\(head -c (\d+)\)"$/.exec(sh))) {
      // The step script: interpreted line by line (the real sh runs it in kubernetes-runtime.test.ts).
      const script = (await ws.stdin(Number(m[1]))).toString("utf8");
      let T = "";
      for (const line of script.split("\n")) {
        let l: RegExpExecArray | null;
        if ((l = /^T=\$(\w+)$/.exec(line))) T = env[l[1]!] ?? "";
        else if (line.startsWith("unset ")) for (const n of line.slice(6).split(" ")) delete env[n];
        else if ((l = /^export (\w+)="\$T"$/.exec(line))) env[l[1]!] = T;
        else if ((l = /^export (\w+)='(.*)'$/s.exec(line))) env[l[1]!] = l[2]!.replace(/'\\''/g, "'");
        else if ((l = /^cd '(.*)' \|\|/.exec(line))) cwd = l[1]!;
      }
      argv = command.slice(4);
    }
    const result = await runProgram({ argv, env, cwd, c: p, out: (s) => send(1, s), err: (s) => send(2, s) });
    if (result === null) {
      if (sh) {
        send(2, `rollgate-sandbox: cannot start ${argv[0]}: not found\n`);
        return exit(127);
      }
      return { metadata: {}, status: "Failure", message: `failed to exec in container: exec: "${argv[0]}": executable file not found in $PATH`, reason: "InternalError" };
    }
    return exit(result === "killed" ? 137 : result);
  }
}

function matchLabels(labels: Record<string, string>, selector: string): boolean {
  return selector
    .split(",")
    .filter(Boolean)
    .every((term) => {
      const ne = term.split("!=");
      if (ne.length === 2) return labels[ne[0]!] !== ne[1];
      const [k, v] = term.split("=");
      return labels[k!] === v;
    });
}

function matchFields(o: Obj, selector: string): boolean {
  const phase = (o.status as { phase?: string } | undefined)?.phase;
  return selector
    .split(",")
    .filter(Boolean)
    .every((term) => {
      const ne = term.split("!=");
      if (ne[0] === "status.phase" && ne.length === 2) return phase !== ne[1];
      const [k, v] = term.split("=");
      return k === "status.phase" ? phase === v : true;
    });
}

/** Just enough of RFC 6455 for a server: unmasked binary frames out, masked frames in, the close handshake. */
class MiniWs {
  private buf = Buffer.alloc(0);
  private input = Buffer.alloc(0);
  private waiters: Array<() => void> = [];
  private closed = false;
  constructor(private readonly socket: Duplex) {
    socket.on("data", (d: Buffer) => this.onData(d));
    socket.on("error", () => undefined);
  }

  send(payload: Buffer, opcode = 0x2) {
    if (this.closed || this.socket.destroyed) return;
    const len = payload.length;
    const head = len < 126 ? Buffer.from([0x80 | opcode, len]) : len < 65536 ? Buffer.from([0x80 | opcode, 126, len >> 8, len & 0xff]) : Buffer.concat([Buffer.from([0x80 | opcode, 127]), bigLen(len)]);
    this.socket.write(Buffer.concat([head, payload]));
  }

  close() {
    this.send(Buffer.from([0x03, 0xe8]), 0x8);
    this.closed = true;
    setTimeout(() => this.socket.end(), 50).unref();
  }

  /** Resolves with the first `n` stdin bytes (channel 0), like `head -c n`. */
  async stdin(n: number): Promise<Buffer> {
    while (this.input.length < n) await new Promise<void>((r) => this.waiters.push(r));
    const out = this.input.subarray(0, n);
    this.input = this.input.subarray(n);
    return out;
  }

  private onData(d: Buffer) {
    this.buf = Buffer.concat([this.buf, d]);
    for (;;) {
      if (this.buf.length < 2) return;
      const opcode = this.buf[0]! & 0x0f;
      let len = this.buf[1]! & 0x7f;
      let off = 2;
      if (len === 126) {
        if (this.buf.length < 4) return;
        len = this.buf.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (this.buf.length < 10) return;
        len = Number(this.buf.readBigUInt64BE(2));
        off = 10;
      }
      const masked = (this.buf[1]! & 0x80) !== 0;
      const maskOff = off;
      if (masked) off += 4;
      if (this.buf.length < off + len) return;
      const payload = Buffer.from(this.buf.subarray(off, off + len));
      if (masked) for (let i = 0; i < payload.length; i++) payload[i] = payload[i]! ^ this.buf[maskOff + (i % 4)]!;
      this.buf = this.buf.subarray(off + len);
      if (opcode === 0x8) {
        if (!this.closed) this.send(Buffer.from([0x03, 0xe8]), 0x8);
        this.closed = true;
        this.socket.end();
        return;
      }
      if (opcode === 0x2 && payload[0] === 0) {
        this.input = Buffer.concat([this.input, payload.subarray(1)]);
        for (const w of this.waiters.splice(0)) w();
      }
    }
  }
}

function bigLen(n: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
}
