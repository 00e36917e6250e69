/**
 * The callback server with deliveries sent the way a worker sends them (signed raw bytes, a
 * delivery id), over real HTTP.
 */
import http from "node:http";
import { describe, expect, it } from "vitest";
import { startCallbackServer, type CallbackDelivery } from "./callback.js";
import { signBody } from "./signature.js";

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

describe("startCallbackServer", () => {
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
      const headers = { "x-rollgate-event": "task.completed", "x-rollgate-delivery": "d-slow", "x-rollgate-signature": signBody(body, secret) };
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
      const headers = { "x-rollgate-event": "task.completed", "x-rollgate-delivery": "d-f", "x-rollgate-signature": signBody(body, secret) };
      expect(await post(server.url, body, headers)).toBe(500);
      expect(await post(server.url, body, headers)).toBe(200);
      expect(await post(server.url, body, headers)).toBe(200);
      expect(handled).toEqual(["d-f", "d-f"]);
      expect(server.deliveries).toHaveLength(1);
    } finally {
      await server.close();
    }
  });
});
