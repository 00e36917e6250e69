/**
 * The callback server with deliveries sent the way a worker sends them (signed raw bytes, a
 * delivery id), over real HTTP.
 */
import http from "node:http";
import { describe, expect, it } from "vitest";
import { startCallbackServer, type CallbackDelivery } from "./callback.js";
import { signBody, signDelivery } from "./signature.js";

/** The headers a worker sends with a delivery signed at `timestamp` (Unix seconds; default now). */
function signedHeaders(body: string, secret: string, event: string, deliveryId: string, timestamp = Math.floor(Date.now() / 1000)): Record<string, string> {
  return {
    "x-rollgate-event": event,
    "x-rollgate-delivery": deliveryId,
    "x-rollgate-timestamp": String(timestamp),
    "x-rollgate-signature-v2": signDelivery({ deliveryId, event, timestamp, body }, secret),
    "x-rollgate-signature": signBody(body, secret),
  };
}

function post(url: string, body: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: "POST", headers: { "content-type": "application/json", ...headers } }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
    req.end(body);
  });
}

/** A whole TaskResult, as the worker delivers one. */
const result = (id: string, group_id: string | null, reward: number) => ({
  id,
  group_id,
  status: "completed",
  reward,
  evaluation: null,
  error: null,
  session_id: null,
  trajectory: null,
  usage: { llm_calls: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0 },
  timings: { queued_ms: 0, run_ms: 0, eval_ms: 0, total_ms: 0 },
  attempts: 1,
  worker: "w",
  agent: { exit_code: 0, signal: null, log_tail: "" },
  metadata: {},
});

describe("startCallbackServer", () => {
  it("takes a signed delivery and refuses its replays: a fresh delivery id, another event, an old timestamp, only the body-only signature", async () => {
    const secret = "s3cret";
    const handled: string[] = [];
    const server = await startCallbackServer({ secret, onDelivery: (d) => void handled.push(`${d.event} ${d.deliveryId}`) });
    try {
      const body = JSON.stringify({ id: "t-r", status: "completed", reward: 1 });
      const good = signedHeaders(body, secret, "task.completed", "d-1");
      expect(await post(server.url, body, good)).toBe(200);
      expect(server.deliveries.map((d) => d.body)).toEqual([{ id: "t-r", status: "completed", reward: 1 }]);
      // The captured delivery re-sent under a fresh delivery id: the receiver would not see it as a duplicate.
      expect(await post(server.url, body, { ...good, "x-rollgate-delivery": "d-2" })).toBe(401);
      // The event header changed.
      expect(await post(server.url, body, { ...good, "x-rollgate-event": "task.failed" })).toBe(401);
      // Signed right, but long ago (or far ahead): a replay of an old capture.
      const old = Math.floor(Date.now() / 1000) - 301;
      expect(await post(server.url, body, signedHeaders(body, secret, "task.completed", "d-3", old))).toBe(401);
      expect(await post(server.url, body, signedHeaders(body, secret, "task.completed", "d-4", old + 602))).toBe(401);
      // Only the previous release's body-only signature: no downgrade.
      expect(await post(server.url, body, { "x-rollgate-event": "task.completed", "x-rollgate-delivery": "d-5", "x-rollgate-signature": signBody(body, secret) })).toBe(401);
      // The wrong secret, a changed body, a timestamp not in seconds.
      expect(await post(server.url, body, signedHeaders(body, "other", "task.completed", "d-6"))).toBe(401);
      expect(await post(server.url, `${body} `, { ...good, "x-rollgate-delivery": "d-1" })).toBe(401);
      expect(await post(server.url, body, { ...good, "x-rollgate-timestamp": `${good["x-rollgate-timestamp"]}.0` })).toBe(401);
      expect(server.rejected()).toBe(8);
      expect(handled).toEqual(["task.completed d-1"]);
      // A retry of the genuine delivery (a new timestamp, the same id) is acknowledged, not handled again.
      expect(await post(server.url, body, signedHeaders(body, secret, "task.completed", "d-1"))).toBe(200);
      expect(handled).toEqual(["task.completed d-1"]);
    } finally {
      await server.close();
    }
  });

  it("the timestamp tolerance is configurable", async () => {
    const secret = "s3cret";
    const server = await startCallbackServer({ secret, toleranceSeconds: 3600 });
    try {
      const body = JSON.stringify({ id: "t-tol", status: "completed", reward: 0 });
      const anHourAgo = Math.floor(Date.now() / 1000) - 1800;
      expect(await post(server.url, body, signedHeaders(body, secret, "task.completed", "d-tol", anHourAgo))).toBe(200);
      expect(await post(server.url, body, signedHeaders(body, secret, "task.completed", "d-tol2", anHourAgo - 3600))).toBe(401);
    } finally {
      await server.close();
    }
  });

  it("a retry that arrives while the first delivery's handler still runs is not handled twice", async () => {
    // A trainer whose handler takes longer than the worker waits (30 s): the worker gives up on
    // the first POST and sends the same delivery again while the handler is still on it.
    const secret = "s3cret";
    const handled: string[] = [];
    let secondEntered!: () => void;
    const second = new Promise<void>((r) => (secondEntered = r));
    const server = await startCallbackServer({
      secret,
      onDelivery: async (d: CallbackDelivery) => {
        handled.push(d.deliveryId);
        if (handled.length === 1) {
          // Held until a second handler call starts (the bug), or long enough for the retry to
          // have arrived and be waiting (the fix).
          await Promise.race([second, new Promise((r) => setTimeout(r, 3_000))]);
        } else secondEntered();
      },
    });
    try {
      const body = JSON.stringify({ id: "t-slow", status: "completed", reward: 1 });
      const headers = signedHeaders(body, secret, "task.completed", "d-slow");
      const first = post(server.url, body, headers);
      await new Promise<void>((resolve) => {
        const check = () => (handled.length > 0 ? resolve() : setTimeout(check, 10));
        check();
      });
      const retry = post(server.url, body, headers);
      expect(await Promise.all([first, retry])).toEqual([200, 200]);
      expect(handled).toEqual(["d-slow"]);
      expect(server.deliveries).toHaveLength(1);
    } finally {
      await server.close();
    }
  });

  it("a retry after the first delivery's handler failed is handled", async () => {
    const secret = "s3cret";
    const handled: string[] = [];
    const server = await startCallbackServer({
      secret,
      onDelivery: (d) => {
        handled.push(d.deliveryId);
        if (handled.length === 1) throw new Error("trainer busy");
      },
    });
    try {
      const body = JSON.stringify({ id: "t-f", status: "completed", reward: 1 });
      const headers = signedHeaders(body, secret, "task.completed", "d-f");
      expect(await post(server.url, body, headers)).toBe(500);
      expect(await post(server.url, body, headers)).toBe(200);
      expect(await post(server.url, body, headers)).toBe(200);
      expect(handled).toEqual(["d-f", "d-f"]);
      expect(server.deliveries).toHaveLength(1);
    } finally {
      await server.close();
    }
  });

  it("a task's signed body re-sent as group.completed is refused, not filed as its group", async () => {
    const secret = "s3cret";
    const server = await startCallbackServer({ secret });
    try {
      // A genuine task result carries its group_id.
      const body = JSON.stringify(result("g-1-0", "g-1", 1));
      const asTask = signedHeaders(body, secret, "task.completed", "d-x");
      // Relabelled on the way: the event is signed.
      expect(await post(server.url, body, { ...asTask, "x-rollgate-event": "group.completed" })).toBe(401);
      // Signed as a group's by a sender that mixed them up: the body is not a group's.
      expect(await post(server.url, body, signedHeaders(body, secret, "group.completed", "d-y"))).toBe(400);
      await expect(server.waitForGroup("g-1", { timeoutMs: 50 })).rejects.toMatchObject({ type: "timeout" });
      // Sent as what it is, it is taken.
      expect(await post(server.url, body, signedHeaders(body, secret, "task.completed", "d-t"))).toBe(200);
      expect((await server.waitForResult("g-1-0", { timeoutMs: 1000 })).reward).toBe(1);
    } finally {
      await server.close();
    }
  });

  it("forget lets go of a group, its members' results and their deliveries; a retry after it is acknowledged, not kept", async () => {
    const secret = "s3cret";
    const server = await startCallbackServer({ secret });
    try {
      const member = (k: number) => result(`g-2-${k}`, "g-2", k);
      const send = (event: string, delivery: string, b: unknown) => {
        const body = JSON.stringify(b);
        return post(server.url, body, signedHeaders(body, secret, event, delivery));
      };
      const other = result("t-other", null, 0);
      for (const k of [0, 1]) expect(await send("task.completed", `d-${k}`, member(k))).toBe(200);
      expect(await send("task.completed", "d-o", other)).toBe(200);
      const group = { group_id: "g-2", tasks: [member(0), member(1)], summary: {} };
      expect(await send("group.completed", "d-g", group)).toBe(200);
      expect(server.deliveries).toHaveLength(4);

      server.forget("g-2");
      expect(server.deliveries.map((d) => d.deliveryId)).toEqual(["d-o"]);
      await expect(server.waitForGroup("g-2", { timeoutMs: 50 })).rejects.toMatchObject({ type: "timeout" });
      await expect(server.waitForResult("g-2-0", { timeoutMs: 50 })).rejects.toMatchObject({ type: "timeout" });
      expect((await server.waitForResult("t-other", { timeoutMs: 50 })).id).toBe("t-other");
      expect(await send("task.completed", "d-0", member(0))).toBe(200);
      expect(server.deliveries).toHaveLength(1);
      server.forget("t-other");
      expect(server.deliveries).toHaveLength(0);
    } finally {
      await server.close();
    }
  });

  it("a body over maxBodyBytes is refused 413 before it is all held, announced or chunked", async () => {
    const secret = "s3cret";
    const server = await startCallbackServer({ secret, maxBodyBytes: 1024 });
    try {
      const body = JSON.stringify({ ...result("t-big", null, 1), metadata: { pad: "x".repeat(4096) } });
      const headers = signedHeaders(body, secret, "task.completed", "d-big");
      expect(await post(server.url, body, headers).catch(() => 413)).toBe(413);
      // Chunked: no length announced, so it is counted as it arrives.
      const chunked = await new Promise<number>((resolve) => {
        const req = http.request(server.url, { method: "POST", headers: { ...headers, "transfer-encoding": "chunked" } }, (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        });
        req.on("error", () => resolve(-1));
        for (let i = 0; i < 8; i++) req.write(body.slice(i * 600, (i + 1) * 600));
        req.end();
      });
      expect(chunked).toBe(413);
      expect(server.deliveries).toHaveLength(0);
      expect(server.rejected()).toBe(0);
    } finally {
      await server.close();
    }
  });
});
