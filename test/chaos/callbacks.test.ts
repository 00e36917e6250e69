/**
 * Chaos: the trainer's callback receiver is down (connection refused) while a batch finishes,
 * then answers 503 for a while, then comes back. Every result is delivered, signed, and each
 * delivery id arrives exactly once after the receiver is back; every task's delivery state ends
 * `delivered`.
 */
import { createHmac, randomUUID } from "node:crypto";
import http from "node:http";
import type { TaskRecord } from "@rollgate/protocol";
import { freePort, type StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startFleet } from "../support/apps.js";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { readTasks, waitAllTerminal } from "./support.js";

const prefix = uniquePrefix("chaos-callbacks");
let engine: StartedChild;
let fleet: Awaited<ReturnType<typeof startFleet>>;
const api = apiClient(() => fleet.url);

beforeAll(async () => {
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "2"], {});
  // Backoff 200 ms doubled per attempt over 12 attempts: ~7 minutes of patience, far more than the outage.
  fleet = await startFleet({ prefix, engineUrl: engine.ready, workers: 2, workerEnv: { ROLLGATE_CALLBACK_BACKOFF_MS: "200" } });
}, 60_000);

afterAll(async () => {
  await fleet?.stop();
  await stopChild(engine.proc, 5_000);
  await dropPrefix(prefix);
});

interface Got {
  delivery: string;
  event: string;
  body: string;
  signature: string;
}

/** A receiver on a fixed port that can be taken down (refusing connections) and brought back. */
function receiver(port: number) {
  const got: Got[] = [];
  let failing = 0;
  let server: http.Server | null = null;
  const up = () =>
    new Promise<void>((resolve) => {
      server = http.createServer((req, res) => {
        const chunks: Buffer[] = [];
        req.on("data", (c: Buffer) => chunks.push(c));
        req.on("end", () => {
          if (failing > 0) {
            failing--;
            return res.writeHead(503).end("busy");
          }
          got.push({
            delivery: String(req.headers["x-rollgate-delivery"]),
            event: String(req.headers["x-rollgate-event"]),
            body: Buffer.concat(chunks).toString("utf8"),
            signature: String(req.headers["x-rollgate-signature"]),
          });
          res.writeHead(200).end("ok");
        });
      });
      server.listen(port, "127.0.0.1", () => resolve());
    });
  const down = () =>
    new Promise<void>((resolve) => {
      if (!server) return resolve();
      server.closeAllConnections();
      server.close(() => resolve());
      server = null;
    });
  return { got, up, down, failNext: (n: number) => (failing = n) };
}

describe("the callback receiver down for a while", () => {
  it("every result is delivered once it is back, each delivery id exactly once, signed", async () => {
    const port = await freePort();
    const rx = receiver(port);
    const secret = `s-${randomUUID()}`;
    const task = {
      instruction: 'answer\n#sim: [{"text": "done"}]',
      agent: { harness: "command", command: ["rollgate-example-agent"] },
      evaluator: { kind: "command", command: ["true"] },
      limits: { timeout_s: 60 },
      callback: { url: `http://127.0.0.1:${port}/rollouts`, secret },
    };
    // Down (nothing listens) while the whole batch runs.
    const res = await api("/v1/tasks/batch", { body: { group_id: `g-${randomUUID().slice(0, 6)}`, n: 30, task } });
    const ids = (res.body.tasks as { id: string }[]).map((t) => t.id);
    await waitAllTerminal(api, ids, 120_000);
    const pending = await poll(
      () => readTasks(api, ids),
      (rs) => rs.every((r) => r.callback.attempts >= 2),
      30_000,
      500,
    );
    expect(pending.every((r) => r.callback.state === "pending" && /unreachable/.test(r.callback.last_error ?? ""))).toBe(true);

    // Back, but busy for its first 10 deliveries, then fine.
    rx.failNext(10);
    await rx.up();
    try {
      const done = await poll(() => readTasks(api, ids), (rs: TaskRecord[]) => rs.every((r) => r.callback.state === "delivered"), 120_000, 500);
      expect(done.filter((r) => r.callback.state === "delivered")).toHaveLength(30);
      await new Promise((r) => setTimeout(r, 1_000));
      const deliveries = rx.got.map((g) => g.delivery);
      expect(new Set(deliveries).size).toBe(30);
      expect(deliveries).toHaveLength(30); // once per delivery id
      expect(new Set(rx.got.map((g) => (JSON.parse(g.body) as { id: string }).id))).toEqual(new Set(ids));
      for (const g of rx.got) expect(g.signature).toBe(`sha256=${createHmac("sha256", secret).update(g.body).digest("hex")}`);
      // The delivery id on each task is the one that arrived.
      for (const r of done) expect(deliveries).toContain(r.callback.delivery_id);
    } finally {
      await rx.down();
    }
  }, 240_000);
});
