import http from "node:http";
import net from "node:net";
import { pipeline } from "node:stream/promises";
import { Agent, request } from "undici";
import type { LostCalls } from "@rollgate/protocol";
import { EgressDenied, type EgressPolicy, checkDestination, egressRequest } from "../egress.js";
import { Semaphore } from "./container-common.js";

/**
 * A sealed sandbox's only door to the network: an HTTP server the worker runs for one sandbox
 * (on a unix socket bind-mounted into a bubblewrap sandbox, or on the address a container sees
 * on its private network). It forwards
 *
 * - requests for the sandbox's own session, `/s/<sid>` and below, to that session on the
 *   gateway, streaming both ways (an SSE answer is written through as it comes, never
 *   buffered; a client that goes away aborts the gateway call);
 * - when the task's `runtime.egress` allows something, proxy requests (`CONNECT host:port` for
 *   HTTPS, absolute-form `GET http://host/…`) to destinations that policy allows, resolved once
 *   and connected to the checked address (apps/worker/src/egress.ts);
 *
 * and refuses everything else with 403: other sessions, the gateway's trainer, admin, metrics
 * and dashboard routes, and any destination the policy does not allow. It holds no secret: the
 * agent authenticates to its session with its own token, as it would directly.
 */

export interface RelayOptions {
  sessionId: string;
  /** The session's base URL on the gateway (`<gateway>/s/<sid>`). */
  sessionUrl: string;
  /** Where the agent may go besides its session; null: nowhere. */
  egress: EgressPolicy | null;
  /** The most connections the sandbox may hold open to the relay at once (default MAX_RELAY_CONNECTIONS). */
  maxConnections?: number;
  /** The most calls the sandbox has in flight at the gateway at once (default MAX_RELAY_CALLS_IN_FLIGHT). */
  maxCallsInFlight?: number;
  /**
   * The most bytes of request line and headers the gateway reads (default: this node's
   * `http.maxHeaderSize`, 16 KiB unless `--max-http-header-size` says otherwise, as on the gateway).
   */
  gatewayMaxHeaderBytes?: number;
  log?: { warn: (obj: object, msg: string) => void; debug?: (obj: object, msg: string) => void };
}

/**
 * The most connections one sandbox holds open to its relay at once; more are closed as they come.
 * Each is a descriptor of the worker's (and, forwarded, another to the gateway): an agent that
 * opened connections without end would run the worker out of descriptors, and every rollout on it
 * out of Redis, pipes and relays. Agents with many parallel calls stay far below it.
 */
export const MAX_RELAY_CONNECTIONS = 256;

/**
 * The most calls one sandbox has in flight at the gateway at once; more wait their turn in the
 * relay (their bodies unread). Each is up to 64 MiB the gateway reads and parses, or a generation
 * an engine runs: a sandbox with hundreds at once would load the gateway and the engines for every
 * rollout. Agents that run calls in parallel (subagents, tool fan-out) stay below it.
 */
export const MAX_RELAY_CALLS_IN_FLIGHT = 32;

export type RelayListen = { path: string } | { host: string; port?: number };

/** What a relay did, for the rollout's log line. */
export interface RelayStats {
  forwarded: number;
  proxied: number;
  refused: number;
  upstreamErrors: number;
  /** Connections closed as they came, the sandbox holding MAX_RELAY_CONNECTIONS already. */
  dropped: number;
}

/** Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1), and ones undici sets itself. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "host",
  "expect",
]);

function forwardHeaders(h: http.IncomingHttpHeaders): Record<string, string | string[]> {
  const named = new Set(
    String(h.connection ?? "")
      .split(",")
      .map((s) => s.trim().toLowerCase())
      .filter(Boolean),
  );
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) {
    if (v === undefined || HOP_BY_HOP.has(k) || named.has(k)) continue;
    out[k] = v;
  }
  return out;
}

/**
 * About how many bytes of request line and headers undici sends for a forwarded request: what the
 * gateway's HTTP parser holds against its header limit. Rounded up (undici's own `connection` and
 * length lines) so that it is never less.
 */
function forwardedHeadBytes(method: string, url: URL, headers: Record<string, string | string[]>): number {
  let n = `${method} ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\n`.length + 64;
  for (const [k, v] of Object.entries(headers)) for (const one of Array.isArray(v) ? v : [v]) n += Buffer.byteLength(`${k}: ${one}\r\n`);
  return n + 2;
}

/**
 * The path below the session a request asks for, or null when it is not the session's. The
 * path is normalised the way a URL parser does (`.`/`..` segments, `%2e`), so `/s/<sid>/../..`
 * cannot climb out; encoded slashes and backslashes are refused outright.
 */
export function sessionSubpath(rawUrl: string, sessionId: string): { path: string; search: string } | null {
  if (!rawUrl.startsWith("/") || /%2f|%5c|\\/i.test(rawUrl.split("?")[0]!)) return null;
  let u: URL;
  try {
    // Concatenated, not resolved against a base: "//host/x" must stay a path.
    u = new URL(`http://relay${rawUrl}`);
  } catch {
    return null;
  }
  const prefix = `/s/${encodeURIComponent(sessionId)}`;
  if (u.pathname !== prefix && !u.pathname.startsWith(`${prefix}/`)) return null;
  return { path: u.pathname.slice(prefix.length), search: u.search };
}

/**
 * The proxy variables a sealed sandbox with `runtime.egress` gets: HTTP(S) goes through its
 * relay; the relay's own host (the session's URL) and loopback stay direct.
 */
export function egressProxyEnv(proxyUrl: string): Record<string, string> {
  const noProxy = ["127.0.0.1", "localhost", new URL(proxyUrl).hostname].filter((h, i, all) => all.indexOf(h) === i).join(",");
  return { HTTP_PROXY: proxyUrl, HTTPS_PROXY: proxyUrl, http_proxy: proxyUrl, https_proxy: proxyUrl, NO_PROXY: noProxy, no_proxy: noProxy };
}

function refuse(res: http.ServerResponse, status: number, message: string) {
  if (res.headersSent) return res.destroy();
  const body = JSON.stringify({ error: { type: "sandbox_network", code: "sandbox_network", message } });
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body);
}

export class SessionRelay {
  readonly stats: RelayStats = { forwarded: 0, proxied: 0, refused: 0, upstreamErrors: 0, dropped: 0 };
  /** Agent calls the relay could not deliver to the gateway: infrastructure, so the rollout is not scored. */
  readonly lost: LostCalls = { count: 0, first: null };
  private readonly server: http.Server;
  private readonly upstream: Agent;
  private readonly tunnels = new Set<net.Socket>();
  private readonly inFlight: Semaphore;
  private readonly base: string;

  private constructor(private readonly o: RelayOptions) {
    this.base = o.sessionUrl.replace(/\/+$/, "");
    this.inFlight = new Semaphore(o.maxCallsInFlight ?? MAX_RELAY_CALLS_IN_FLIGHT);
    // Streams may stay open for the whole rollout: no body or headers timeout on either side.
    this.upstream = new Agent({ bodyTimeout: 0, headersTimeout: 0 });
    this.server = http.createServer({ requestTimeout: 0 }, (req, res) => void this.onRequest(req, res));
    this.server.on("connect", (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => void this.onConnect(req, socket, head));
    this.server.on("clientError", (_err, socket) => socket.destroy());
    this.server.maxConnections = o.maxConnections ?? MAX_RELAY_CONNECTIONS;
    let dropsLogged = false;
    this.server.on("drop", () => {
      this.stats.dropped++;
      if (dropsLogged) return;
      dropsLogged = true;
      this.o.log?.warn({ session_id: o.sessionId, max_connections: this.server.maxConnections }, "sandbox relay: the agent holds as many connections as it may; more are closed");
    });
  }

  /** Starts a relay listening on a unix socket path or a TCP address. */
  static async listen(o: RelayOptions, at: RelayListen): Promise<SessionRelay> {
    const relay = new SessionRelay(o);
    await new Promise<void>((resolve, reject) => {
      relay.server.once("error", reject);
      const done = () => {
        relay.server.off("error", reject);
        resolve();
      };
      if ("path" in at) relay.server.listen(at.path, done);
      else relay.server.listen(at.port ?? 0, at.host, done);
    });
    return relay;
  }

  /** The TCP port it listens on (0 for a unix socket). */
  get port(): number {
    const a = this.server.address();
    return a && typeof a === "object" ? a.port : 0;
  }

  async close(): Promise<void> {
    for (const s of this.tunnels) s.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    await this.upstream.destroy();
  }

  private async onRequest(req: http.IncomingMessage, res: http.ServerResponse) {
    const url = req.url ?? "";
    if (/^https?:\/\//i.test(url)) return this.proxyPlain(req, res, url);
    const sub = sessionSubpath(url, this.o.sessionId);
    if (!sub) {
      this.stats.refused++;
      return refuse(res, 403, `a sandbox reaches only its own session's routes (/s/${this.o.sessionId}/…), not ${url.split("?")[0]}`);
    }
    const target = new URL(`${this.base}${sub.path}${sub.search}`);
    const headers = forwardHeaders(req.headers);
    // Headers that fit the relay's limit may not fit the gateway's once the relay has added its own
    // (the gateway's host) and encoded the path: the gateway would drop the connection without an
    // answer, which reads as a call lost to infrastructure, and a rollout with one is set aside
    // unscored. An agent could so escape any score it was about to get: it is refused here instead.
    const headBytes = forwardedHeadBytes(req.method ?? "GET", target, headers);
    const limit = this.o.gatewayMaxHeaderBytes ?? http.maxHeaderSize;
    if (headBytes > limit) {
      this.stats.refused++;
      return refuse(res, 431, `the request's headers are too large for the gateway (${headBytes} bytes once forwarded; at most ${limit})`);
    }
    this.stats.forwarded++;
    const abort = new AbortController();
    // The agent went away before the answer ended: the gateway call is cancelled with it.
    res.on("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    const hasBody = req.method !== "GET" && req.method !== "HEAD";
    // Its turn at the gateway: until then its body stays unread, in the agent's socket.
    const release = await this.inFlight.acquire();
    if (abort.signal.aborted) return release();
    try {
      const up = await request(target, {
        method: req.method as "GET",
        headers,
        ...(hasBody ? { body: req } : {}),
        dispatcher: this.upstream,
        signal: abort.signal,
      });
      res.writeHead(up.statusCode, forwardHeaders(up.headers as http.IncomingHttpHeaders));
      res.flushHeaders();
      res.socket?.setNoDelay(true);
      await pipeline(up.body, res);
    } catch (err) {
      if (abort.signal.aborted) return;
      this.stats.upstreamErrors++;
      const message = `the sandbox relay could not reach the gateway: ${(err as Error).message}`;
      this.lost.count++;
      this.lost.first ??= { at: new Date().toISOString(), kind: "relay_unreachable", status: 502, message };
      this.o.log?.warn({ session_id: this.o.sessionId, err: (err as Error).message }, "sandbox relay: the gateway call failed");
      refuse(res, 502, message);
    } finally {
      release();
    }
  }

  /** `GET http://host/…` through the egress policy (plain HTTP egress). */
  private async proxyPlain(req: http.IncomingMessage, res: http.ServerResponse, url: string) {
    if (!this.o.egress) {
      this.stats.refused++;
      return refuse(res, 403, `runtime.egress allows no destination outside the session (asked for ${url.split("?")[0]})`);
    }
    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    try {
      const hasBody = req.method !== "GET" && req.method !== "HEAD";
      const { res: up, close } = await egressRequest(
        url,
        "runtime.egress",
        { method: req.method as "GET", headers: forwardHeaders(req.headers), ...(hasBody ? { body: req } : {}), signal: abort.signal },
        this.o.egress,
      );
      this.stats.proxied++;
      try {
        res.writeHead(up.statusCode, forwardHeaders(up.headers as http.IncomingHttpHeaders));
        await pipeline(up.body, res);
      } finally {
        await close();
      }
    } catch (err) {
      if (abort.signal.aborted) return;
      if (err instanceof EgressDenied) {
        this.stats.refused++;
        return refuse(res, 403, err.message);
      }
      refuse(res, 502, `runtime.egress: ${(err as Error).message}`);
    }
  }

  /** `CONNECT host:port` (HTTPS and any TCP) through the egress policy. */
  private async onConnect(req: http.IncomingMessage, socket: net.Socket, head: Buffer) {
    const answer = (status: string, message: string) => {
      this.stats.refused++;
      socket.end(`HTTP/1.1 ${status}\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n${message}\n`);
    };
    socket.on("error", () => socket.destroy());
    if (!this.o.egress) return answer("403 Forbidden", `runtime.egress allows no destination outside the session (asked for ${req.url})`);
    const m = /^(\[[0-9a-fA-F:.]+\]|[^:/\s]+):(\d{1,5})$/.exec(req.url ?? "");
    if (!m || Number(m[2]) < 1 || Number(m[2]) > 65535) return answer("400 Bad Request", `CONNECT needs host:port (got ${req.url})`);
    let dest;
    try {
      dest = await checkDestination(this.o.egress, `http://${m[1]}:${m[2]}/`, "runtime.egress");
    } catch (err) {
      return answer(err instanceof EgressDenied ? "403 Forbidden" : "502 Bad Gateway", (err as Error).message);
    }
    const out = net.connect({ host: dest.address, port: Number(m[2]), family: dest.family });
    let connected = false;
    this.tunnels.add(socket).add(out);
    const drop = () => {
      socket.destroy();
      out.destroy();
      this.tunnels.delete(socket);
      this.tunnels.delete(out);
    };
    out.once("connect", () => {
      connected = true;
      this.stats.proxied++;
      socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length) out.write(head);
      socket.pipe(out).pipe(socket);
    });
    out.once("error", (err) => {
      if (!connected && !socket.writableEnded) socket.end(`HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\ncannot connect to ${req.url}: ${err.message}\n`);
      drop();
    });
    socket.once("close", drop);
    out.once("close", drop);
  }
}
