/**
 * A misbehaving engine on a real port: a plain HTTP server in front of a real engine-sim that
 * passes every request through (model list, capability probes, /tokenize) and lets a test rewrite
 * the bytes of the generation answers the gateway gets back: cut bodies, bad JSON, SSE framing
 * quirks, wrong ids or logprobs, error statuses, hangs. The sim generates; the fault only edits
 * what goes over the wire, so a test knows what the engine really produced.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** What the engine-sim answered one generation request. */
export interface Upstream {
  path: string;
  /** The gateway's request body. */
  request: Record<string, unknown>;
  status: number;
  contentType: string;
  text: string;
}

/** What the misbehaving engine sends instead. */
export interface WireAnswer {
  status?: number;
  contentType?: string;
  /** Written one by one, each in its own write (a tick apart), in order. */
  pieces: (string | Buffer)[];
  /** How the answer ends: a clean end, a reset connection, or nothing more ever (a hang). */
  end?: "end" | "destroy" | "hang";
}

export type WireFault = (up: Upstream) => WireAnswer;

/** The generation routes a fault rewrites (the capability probes pass through untouched). */
const GENERATION = new Set(["/v1/chat/completions", "/v1/completions", "/generate"]);
const isProbe = (body: Record<string, unknown>) => JSON.stringify(body.messages ?? "").includes("rollgate ");

export interface WireEngine {
  url: string;
  /** The fault applied to the next generation answers (null: pass through). */
  fault: WireFault | null;
  /** The fault applied to the gateway's capability probes on the generation routes (null: pass through). */
  probeFault: WireFault | null;
  /** The engine-sim's answers to the gateway's generation calls (not its probes), in order. */
  seen: Upstream[];
  close(): Promise<void>;
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    req.on("data", (p: Buffer) => parts.push(p));
    req.on("end", () => resolve(Buffer.concat(parts)));
    req.on("error", reject);
  });
}

const tick = () => new Promise((r) => setImmediate(r));

export async function startWireEngine(simUrl: string): Promise<WireEngine> {
  const hung = new Set<ServerResponse>();
  const engine: WireEngine = { url: "", fault: null, probeFault: null, seen: [], close: async () => undefined };
  const server: Server = createServer((req, res) => {
    void (async () => {
      const body = await readBody(req);
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string" && k !== "host" && k !== "content-length" && k !== "connection") headers[k] = v;
      const up = await fetch(`${simUrl}${req.url}`, { method: req.method, headers, ...(body.length ? { body } : {}) });
      const text = await up.text();
      const path = (req.url ?? "").split("?")[0]!;
      const json = body.length && (req.headers["content-type"] ?? "").includes("json") ? (JSON.parse(body.toString("utf8")) as Record<string, unknown>) : {};
      const generation = req.method === "POST" && GENERATION.has(path);
      const probe = isProbe(json);
      const upstream: Upstream = { path, request: json, status: up.status, contentType: up.headers.get("content-type") ?? "application/json", text };
      if (generation && !probe) engine.seen.push(upstream);
      const fault = !generation ? null : probe ? engine.probeFault : engine.fault;
      if (!fault) {
        res.writeHead(up.status, { "content-type": upstream.contentType });
        res.end(text);
        return;
      }
      const answer = fault(upstream);
      res.writeHead(answer.status ?? 200, { "content-type": answer.contentType ?? upstream.contentType });
      for (const piece of answer.pieces) {
        res.write(piece);
        await tick();
      }
      const end = answer.end ?? "end";
      if (end === "end") res.end();
      else if (end === "destroy") res.socket?.destroy();
      else hung.add(res);
    })().catch((err: unknown) => {
      res.destroy(err as Error);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  engine.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  engine.close = async () => {
    for (const res of hung) res.socket?.destroy();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return engine;
}

/** The SSE events of a streamed answer, as the engine sent them (`data:` payloads, in order). */
export function ssePayloads(text: string): string[] {
  return text
    .split("\n\n")
    .map((e) => e.trim())
    .filter((e) => e.startsWith("data:"))
    .map((e) => e.slice(5).trim());
}

/** SSE events again from payloads (`data: …\n\n` each). */
export function sseText(payloads: string[]): string {
  return payloads.map((p) => `data: ${p}\n\n`).join("");
}
