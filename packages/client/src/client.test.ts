import { createHmac } from "node:crypto";
import { describe, expect, it } from "vitest";
import { RollgateClient } from "./client.js";
import { RollgateError } from "./errors.js";
import { signBody, signDelivery, verifyDelivery, verifySignature } from "./signature.js";
import { SseParser } from "./sse.js";

type FetchCall = { url: string; init: RequestInit };

/** A fetch that answers from a list of canned responses, recording each request. */
function fakeFetch(answers: (() => Response | Promise<Response>)[]) {
  const calls: FetchCall[] = [];
  const impl = (async (url: URL | string, init: RequestInit = {}) => {
    calls.push({ url: String(url), init });
    const next = answers.shift();
    if (!next) throw new Error("no more answers");
    return next();
  }) as typeof fetch;
  return { impl, calls };
}

const json = (status: number, body: unknown) => () => new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

/** A body that streams `chunks` and then ends (or errors, when `fail`). */
function streamBody(chunks: string[], fail = false) {
  return () => {
    let i = 0;
    return new Response(
      new ReadableStream({
        pull(controller) {
          if (i < chunks.length) controller.enqueue(new TextEncoder().encode(chunks[i++]));
          else if (fail) controller.error(new Error("connection reset"));
          else controller.close();
        },
      }),
      { status: 200, headers: { "content-type": "text/event-stream" } },
    );
  };
}

const ev = (id: string, type: string, data: Record<string, unknown> = {}) => `id: ${id}\nevent: ${type}\ndata: ${JSON.stringify({ id, type, at: "2026-01-01T00:00:00.000Z", data })}\n\n`;

describe("SseParser", () => {
  it("parses events split anywhere, CRLF or LF, multi-line data, comments", () => {
    const text = ": keep-alive\r\n\r\nid: 1\r\nevent: a\r\ndata: x\r\ndata: y\r\n\r\nid: 2\ndata: {\"k\":1}\n\n";
    for (const size of [1, 2, 3, 7, text.length]) {
      const p = new SseParser();
      const out = [];
      for (let i = 0; i < text.length; i += size) out.push(...p.push(text.slice(i, i + size)));
      expect(out).toEqual([
        { id: "1", event: "a", data: "x\ny" },
        { id: "2", event: "message", data: '{"k":1}' },
      ]);
    }
  });
});

describe("signatures", () => {
  it("signs (the worker signs callbacks with this same function) and verifies in constant time over the raw bytes", () => {
    const body = '{"id":"t-1","reward":1}';
    const sig = signBody(body, "s3cret");
    // docs/http-api.md#callbacks: sha256=<hex HMAC-SHA256 of the raw body with callback.secret>.
    expect(sig).toBe(`sha256=${createHmac("sha256", "s3cret").update(body).digest("hex")}`);
    expect(verifySignature(body, sig, "s3cret")).toBe(true);
    expect(verifySignature(Buffer.from(body), sig, "s3cret")).toBe(true);
    expect(verifySignature(body + " ", sig, "s3cret")).toBe(false);
    expect(verifySignature(body, sig, "other")).toBe(false);
    expect(verifySignature(body, undefined, "s3cret")).toBe(false);
    expect(verifySignature(body, "sha256=00", "s3cret")).toBe(false);
  });

  it("signs a delivery over id, timestamp, event and body (v2) and verifies it with a time tolerance", () => {
    const body = '{"id":"t-1","reward":1}';
    const d = { deliveryId: "d-1", event: "task.completed", timestamp: 1_700_000_000, body };
    const sig = signDelivery(d, "s3cret");
    // docs/http-api.md#callbacks: v2,<base64 HMAC-SHA256 of "<delivery>.<timestamp>.<event>.<body>">.
    expect(sig).toBe(`v2,${createHmac("sha256", "s3cret").update(`d-1.1700000000.task.completed.${body}`).digest("base64")}`);
    const headers = { "x-rollgate-delivery": "d-1", "x-rollgate-event": "task.completed", "x-rollgate-timestamp": "1700000000", "x-rollgate-signature-v2": sig };
    const at = (s: number) => ({ now: () => s * 1000 });
    expect(verifyDelivery(body, headers, "s3cret", at(1_700_000_000))).toBeNull();
    expect(verifyDelivery(Buffer.from(body), headers, "s3cret", at(1_700_000_300))).toBeNull();
    // Several signatures (a rotation): one that matches is enough.
    expect(verifyDelivery(body, { ...headers, "x-rollgate-signature-v2": `v2,AAAA ${sig}` }, "s3cret", at(1_700_000_000))).toBeNull();
    expect(verifyDelivery(body, headers, "s3cret", at(1_700_000_301))).toBe("stale timestamp");
    expect(verifyDelivery(body, headers, "s3cret", at(1_699_999_699))).toBe("stale timestamp");
    expect(verifyDelivery(body, headers, "s3cret", { ...at(1_700_001_000), toleranceSeconds: 1_000 })).toBeNull();
    expect(verifyDelivery(body, { ...headers, "x-rollgate-delivery": "d-2" }, "s3cret", at(1_700_000_000))).toBe("bad signature");
    expect(verifyDelivery(body, { ...headers, "x-rollgate-event": "task.failed" }, "s3cret", at(1_700_000_000))).toBe("bad signature");
    expect(verifyDelivery(body, { ...headers, "x-rollgate-timestamp": "1700000001" }, "s3cret", at(1_700_000_000))).toBe("bad signature");
    expect(verifyDelivery(body, headers, "other", at(1_700_000_000))).toBe("bad signature");
    expect(verifyDelivery(body, { ...headers, "x-rollgate-signature-v2": undefined, "x-rollgate-signature": signBody(body, "s3cret") }, "s3cret", at(1_700_000_000))).toBe("missing signature");
    expect(verifyDelivery(body, { ...headers, "x-rollgate-timestamp": undefined }, "s3cret", at(1_700_000_000))).toBe("bad timestamp");
  });
});

describe("RollgateClient against a fake gateway", () => {
  it("sends the API key and JSON, and turns an error body into a RollgateError with its details", async () => {
    const f = fakeFetch([json(400, { error: { type: "invalid_request", message: "agent: required", details: [{ path: "agent", message: "required" }] } })]);
    const c = new RollgateClient({ baseUrl: "http://gw:1/", apiKey: "k", fetch: f.impl });
    const err = await c.submitTask({ instruction: "x" } as never).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RollgateError);
    expect(err).toMatchObject({ status: 400, type: "invalid_request", message: "agent: required", details: [{ path: "agent", message: "required" }] });
    expect(f.calls[0]!.url).toBe("http://gw:1/v1/tasks");
    expect((f.calls[0]!.init.headers as Record<string, string>).authorization).toBe("Bearer k");
    expect((err as RollgateError).toJSON()).toEqual({ error: { type: "invalid_request", message: "agent: required", details: [{ path: "agent", message: "required" }] } });
  });

  it("says so when the gateway is unreachable", async () => {
    const c = new RollgateClient({
      baseUrl: "http://gw:1",
      fetch: (async () => {
        throw Object.assign(new TypeError("fetch failed"), { cause: { code: "ECONNREFUSED" } });
      }) as typeof fetch,
    });
    const err = (await c.getTask("t").catch((e: unknown) => e)) as RollgateError;
    expect(err.unreachable).toBe(true);
    expect(err.message).toBe("cannot reach the rollgate gateway at http://gw:1 (ECONNREFUSED)");
  });

  it("explains a 404 on the admin routes (a gateway without the admin API)", async () => {
    const f = fakeFetch([() => new Response("Route POST:/admin/weights not found", { status: 404 })]);
    const c = new RollgateClient({ baseUrl: "http://gw:1", fetch: f.impl });
    const err = (await c.setWeightVersion("v1").catch((e: unknown) => e)) as RollgateError;
    expect(err.status).toBe(404);
    expect(err.message).toContain("this gateway has no POST /admin/weights route");
    expect(JSON.parse(String(f.calls[0]!.init.body))).toEqual({ version: "v1" });
  });

  it("lists tasks across pages", async () => {
    const rec = (id: string) => ({
      id,
      group_id: "g",
      status: "queued",
      task: { instruction: "x", agent: { harness: "command", command: ["true"] } },
      created_at: "2026-01-01T00:00:00.000Z",
      started_at: null,
      finished_at: null,
      attempts: 0,
      worker: null,
      session_id: null,
      callback: { state: "none", delivery_id: null, attempts: 0, last_error: null, delivered_at: null },
      result: null,
    });
    const f = fakeFetch([json(200, { tasks: [rec("a"), rec("b")], next_cursor: "c1" }), json(200, { tasks: [rec("c")], next_cursor: null })]);
    const c = new RollgateClient({ baseUrl: "http://gw:1", fetch: f.impl });
    const ids = [];
    for await (const t of c.listTasks({ group_id: "g", limit: 2 })) ids.push(t.id);
    expect(ids).toEqual(["a", "b", "c"]);
    expect(f.calls.map((x) => new URL(x.url).search)).toEqual(["?group_id=g&limit=2", "?group_id=g&limit=2&cursor=c1"]);
  });

  it("resumes a dropped event stream with Last-Event-ID and stops after the terminal event", async () => {
    const f = fakeFetch([streamBody([ev("1-0", "queued"), ev("2-0", "started").slice(0, 10)], true), streamBody([ev("2-0", "started"), ev("3-0", "terminal", { status: "completed" }), ev("4-0", "queued")])]);
    const c = new RollgateClient({ baseUrl: "http://gw:1", fetch: f.impl });
    const seen = [];
    for await (const e of c.streamEvents("t-1")) seen.push(`${e.id}:${e.type}`);
    expect(seen).toEqual(["1-0:queued", "2-0:started", "3-0:terminal"]);
    expect((f.calls[0]!.init.headers as Record<string, string>)["last-event-id"]).toBeUndefined();
    expect((f.calls[1]!.init.headers as Record<string, string>)["last-event-id"]).toBe("1-0");
  });

  it("answers a trainer format as the route does: {builder, format, samples, lost_calls}, the lost calls being the session's", async () => {
    const lost = { count: 2, first: { at: "2026-01-01T00:00:05.000Z", kind: "engine_unreachable", status: 502, message: "engine down" } };
    const stats = { records: 0, traces: 0, response_tokens: 0, trainable_tokens: 0, breaks: [], weight_versions: [], merged_records: 0, weight_changes: 0, traces_with_weight_change: 0, per_trace: [], failed_calls: [], lost_calls: lost };
    const trajectory = { builder: "per_request", traces: [], stats };
    const f = fakeFetch([json(200, trajectory), json(200, trajectory)]);
    const c = new RollgateClient({ baseUrl: "http://gw:1", fetch: f.impl });
    expect(await c.getTrajectory("s-1", { builder: "per_request", format: "slime" })).toEqual({ builder: "per_request", format: "slime", samples: [], lost_calls: lost });
    // `rollgate` is the trajectory itself, its lost calls in its stats.
    expect((await c.getTrajectory("s-1", { builder: "per_request" })).stats.lost_calls).toEqual(lost);
    expect(new URL(f.calls[0]!.url).search).toBe("?builder=per_request");
  });

  it("rejects a bad base URL up front", () => {
    expect(() => new RollgateClient({ baseUrl: "not a url" })).toThrow(/not a URL|baseUrl/);
  });

  it("refuses a body JSON cannot carry before sending, naming the field (not 'cannot reach the gateway')", async () => {
    const f = fakeFetch([]);
    const c = new RollgateClient({ baseUrl: "http://gw:1", fetch: f.impl });
    const task = (metadata: unknown) => ({ instruction: "x", agent: { harness: "command" as const, command: ["true"] }, metadata }) as never;
    const big = (await c.submitTask(task({ rows: [1, 2n ** 63n] })).catch((e: unknown) => e)) as RollgateError;
    expect([big.type, big.unreachable]).toEqual(["invalid_request", true]);
    expect(big.message).toContain("metadata.rows[1] = 9223372036854775808n is a BigInt");
    const nan = (await c.submitTask(task({ score: NaN })).catch((e: unknown) => e)) as RollgateError;
    expect(nan.message).toContain("metadata.score = NaN is not a JSON number");
    expect(f.calls).toHaveLength(0);
  });

  it("a 2xx that is not JSON (another server at the URL) is an invalid_response, not the call's value", async () => {
    const f = fakeFetch([() => new Response("<html>welcome to nginx</html>", { status: 200, headers: { "content-type": "text/html" } })]);
    const c = new RollgateClient({ baseUrl: "http://gw:1", fetch: f.impl });
    const err = (await c.pause().catch((e: unknown) => e)) as RollgateError;
    expect(err).toBeInstanceOf(RollgateError);
    expect([err.status, err.type]).toEqual([200, "invalid_response"]);
    expect(err.message).toContain("text/html");
  });

  it("says a port fetch refuses is refused by fetch, not that the gateway is down", async () => {
    // Real fetch: it refuses port 6000 (X11) before connecting, even with a gateway listening there.
    const err = (await new RollgateClient({ baseUrl: "http://127.0.0.1:6000" }).getTask("t").catch((e: unknown) => e)) as RollgateError;
    expect(err.type).toBe("unreachable");
    expect(err.message).toContain('fetch never connects to port 6000 (a WHATWG "bad port"): run the gateway on another port');
  });
});
