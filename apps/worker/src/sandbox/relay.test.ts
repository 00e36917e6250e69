/**
 * The sandbox relay on its own (real sockets; a plain HTTP server stands in for the gateway and
 * records what reaches it): which paths are the session's, streaming both ways, a client that
 * goes away, a gateway that is down.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SessionRelay, egressProxyEnv, sessionSubpath } from "./relay.js";

describe("sessionSubpath", () => {
  it.each([
    ["/s/s-1", ""],
    ["/s/s-1/v1/models", "/v1/models"],
    ["/s/s-1/v1beta/models/m:streamGenerateContent?alt=sse", "/v1beta/models/m:streamGenerateContent"],
    ["/s/s-1/./v1/../v1/models", "/v1/models"],
  ])("%s is the session's (%s)", (url, sub) => {
    expect(sessionSubpath(url, "s-1")?.path).toBe(sub);
  });

  it.each([
    "/v1/tasks",
    "/s/s-2/v1/models",
    "/s/s-10/v1/models",
    "/s/s-1x/v1/models",
    "/s/s-1/../s-2/v1/models",
    "/s/s-1/%2e%2e/s-2/v1/models",
    "/s/s-1/..%2F..%2Fv1/tasks",
    "/s/s-1/v1\\..\\..\\admin",
    "//evil.example/s/s-1/v1/models",
    "http://gateway/s/s-1/v1/models",
    "",
  ])("%s is not", (url) => {
    expect(sessionSubpath(url, "s-1")).toBeNull();
  });
});

describe("egressProxyEnv", () => {
  it("sends HTTP(S) through the relay but the relay's own address (the session URL) direct", () => {
    expect(egressProxyEnv("http://172.20.0.1:40123")).toEqual({
      HTTP_PROXY: "http://172.20.0.1:40123",
      HTTPS_PROXY: "http://172.20.0.1:40123",
      http_proxy: "http://172.20.0.1:40123",
      https_proxy: "http://172.20.0.1:40123",
      NO_PROXY: "127.0.0.1,localhost,172.20.0.1",
      no_proxy: "127.0.0.1,localhost,172.20.0.1",
    });
    expect(egressProxyEnv("http://127.0.0.1:47811").NO_PROXY).toBe("127.0.0.1,localhost");
  });
});

describe("SessionRelay", () => {
  let gateway: http.Server;
  let gatewayUrl = "";
  const seen: { method: string; url: string; body: string; aborted: boolean }[] = [];
  let relay: SessionRelay | null = null;

  beforeEach(async () => {
    seen.length = 0;
    gateway = http.createServer((req, res) => {
      const entry = { method: req.method!, url: req.url!, body: "", aborted: false };
      seen.push(entry);
      req.on("data", (c: Buffer) => (entry.body += c.toString()));
      if (req.url!.includes("/slow")) {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write("data: first\n\n");
        res.on("close", () => (entry.aborted = !res.writableFinished));
        return; // never ends on its own
      }
      req.on("end", () => res.writeHead(201, { "content-type": "application/json", "x-upstream": "yes" }).end(JSON.stringify({ echo: entry.body })));
    });
    await new Promise<void>((r) => gateway.listen(0, "127.0.0.1", r));
    gatewayUrl = `http://127.0.0.1:${(gateway.address() as AddressInfo).port}`;
  });
  afterEach(async () => {
    await relay?.close();
    relay = null;
    gateway.closeAllConnections();
    await new Promise((r) => gateway.close(r));
  });

  const start = async (sessionUrl = `${gatewayUrl}/base/s/s-1`) => {
    relay = await SessionRelay.listen({ sessionId: "s-1", sessionUrl, egress: null }, { host: "127.0.0.1" });
    return `http://127.0.0.1:${relay.port}`;
  };

  it("forwards the session's requests to its URL on the gateway (method, query, headers, body) and the answer back", async () => {
    const at = await start();
    const res = await fetch(`${at}/s/s-1/v1/chat/completions?x=1`, { method: "POST", headers: { authorization: "Bearer tok", "content-type": "application/json" }, body: '{"a":1}' });
    expect(res.status).toBe(201);
    expect(res.headers.get("x-upstream")).toBe("yes");
    expect(await res.json()).toEqual({ echo: '{"a":1}' });
    expect(seen).toMatchObject([{ method: "POST", url: "/base/s/s-1/v1/chat/completions?x=1" }]);
    expect(relay!.stats).toMatchObject({ forwarded: 1, refused: 0 });
  });

  it("refuses everything else with a 403 that says why, and lets nothing reach the gateway", async () => {
    const at = await start();
    for (const p of ["/v1/tasks", "/admin/inference/pause", "/s/s-2/v1/models", "/metrics"]) {
      const res = await fetch(`${at}${p}`, { method: "POST", body: "{}" });
      expect(res.status, p).toBe(403);
      expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/only its own session/);
    }
    const connect = await new Promise<number>((resolve) => {
      http
        .request({ host: "127.0.0.1", port: relay!.port, method: "CONNECT", path: new URL(gatewayUrl).host })
        .on("connect", (r, s) => (s.destroy(), resolve(r.statusCode!)))
        .on("response", (r) => (r.resume(), resolve(r.statusCode!)))
        .end();
    });
    expect(connect).toBe(403);
    expect(seen).toEqual([]);
    expect(relay!.stats.refused).toBe(5);
  });

  it("streams an answer as it comes, and an agent that goes away cancels the gateway call", async () => {
    const at = await start();
    const abort = new AbortController();
    const res = await fetch(`${at}/s/s-1/slow`, { signal: abort.signal });
    const reader = res.body!.getReader();
    // The first event arrives while the gateway has not ended its answer.
    expect(new TextDecoder().decode((await reader.read()).value)).toBe("data: first\n\n");
    abort.abort();
    await expect.poll(() => seen[0]?.aborted, { timeout: 5_000 }).toBe(true);
  });

  it("a gateway that does not answer is a 502 from the relay, counted as a call lost to infrastructure", async () => {
    const at = await start("http://127.0.0.1:1/s/s-1");
    expect(relay!.lost).toEqual({ count: 0, first: null });
    const res = await fetch(`${at}/s/s-1/v1/models`);
    expect(res.status).toBe(502);
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/could not reach the gateway/);
    expect(relay!.stats.upstreamErrors).toBe(1);
    await fetch(`${at}/s/s-1/v1/models`);
    // The gateway never saw these calls, so the session cannot mark them: the relay does.
    expect(relay!.lost).toMatchObject({ count: 2, first: { kind: "relay_unreachable", status: 502, message: expect.stringMatching(/could not reach the gateway/) } });
  });
});
