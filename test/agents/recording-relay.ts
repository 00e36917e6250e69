/**
 * A recording HTTP relay for the request recorder: it stands where agents reach the gateway's
 * session URLs (the gateway's ROLLGATE_PUBLIC_URL points here), keeps a copy of every request under
 * `/s/<session>/…` with the status the gateway answered, and forwards everything unchanged, the
 * response streamed through as it comes (SSE included).
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { request } from "undici";

export interface RecordedRequest {
  session: string;
  method: string;
  /** The path and query after `/s/<session>`, e.g. `/v1/messages?beta=true`. */
  url: string;
  headers: Record<string, string>;
  /** The parsed JSON body, or the raw text when it is not JSON. */
  body: unknown;
  /** What the gateway answered (0 when it could not be reached). */
  status: number;
}

export interface RecordingRelay {
  url: string;
  /** Where requests go: the gateway's URL, set once the gateway is up. */
  setTarget: (url: string) => void;
  requests: RecordedRequest[];
  close: () => Promise<void>;
}

const HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length", "proxy-connection", "te", "trailer"]);

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

function flatHeaders(h: IncomingMessage["headers"]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(h)) if (v !== undefined) out[k] = Array.isArray(v) ? v.join(", ") : v;
  return out;
}

function parseBody(raw: Buffer): unknown {
  const text = raw.toString("utf8");
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

export async function startRecordingRelay(): Promise<RecordingRelay> {
  let target = "";
  const requests: RecordedRequest[] = [];

  async function relay(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req);
    const headers = flatHeaders(req.headers);
    const session = /^\/s\/([^/?]+)(\/.*)?$/.exec(req.url ?? "");
    const entry: RecordedRequest | null = session
      ? { session: decodeURIComponent(session[1]!), method: req.method ?? "GET", url: session[2] ?? "/", headers, body: parseBody(raw), status: 0 }
      : null;
    if (entry) requests.push(entry);
    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    const upstream = await request(`${target}${req.url ?? "/"}`, {
      method: (req.method ?? "GET") as "GET",
      headers: Object.fromEntries(Object.entries(headers).filter(([k]) => !HOP_BY_HOP.has(k))),
      body: raw.length > 0 ? raw : null,
      signal: abort.signal,
    });
    if (entry) entry.status = upstream.statusCode;
    const out: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(upstream.headers)) if (v !== undefined && !HOP_BY_HOP.has(k)) out[k] = v;
    res.writeHead(upstream.statusCode, out);
    res.flushHeaders();
    for await (const chunk of upstream.body) res.write(chunk as Buffer);
    res.end();
  }

  const server = createServer((req, res) => {
    relay(req, res).catch((err: unknown) => {
      if (!res.headersSent) res.writeHead(502, { "content-type": "application/json" });
      res.end(res.headersSent ? undefined : JSON.stringify({ error: { message: `recording relay: ${(err as Error).message}` } }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    setTarget: (url) => {
      target = url.replace(/\/+$/, "");
    },
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
