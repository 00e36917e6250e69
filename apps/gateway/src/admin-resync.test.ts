/**
 * A replica whose admin-channel subscription dropped and came back (a network blip, a Redis
 * failover, Redis killing a pub/sub client over its output buffer limit) missed whatever was
 * published meanwhile: Redis pub/sub keeps nothing for an absent subscriber. The replica must
 * read the pause state and the weight version again once it is subscribed again, or it stamps
 * its calls' tokens with a weight version the trainer has moved on from, stays paused after a
 * resume (every call waits forever), or goes on calling engines through a pause.
 *
 * Two in-process replicas on a Redis of this test's own (so its clients can be killed and
 * refused): replica A's subscription is cut and kept from coming back (maxclients) while the
 * trainer acts through replica B; then A reconnects by itself.
 */
import { buildEngineSim } from "@rollgate/engine-sim";
import type { CompletionRecord } from "@rollgate/protocol";
import { startPrivateRedis, type PrivateRedis } from "@rollgate/testkit";
import type { FastifyInstance } from "fastify";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { gatewayOnRedis, listenLocal } from "./__fixtures__/harness.js";

let redis: PrivateRedis;
let sim: FastifyInstance;
let simUrl: string;
let admin: Redis;
let a: FastifyInstance;
let b: FastifyInstance;

const gateway = () => gatewayOnRedis(redis.url, simUrl, "resync");

beforeAll(async () => {
  redis = await startPrivateRedis();
  admin = new Redis(redis.url);
  sim = buildEngineSim({ dpSize: 1 });
  simUrl = await listenLocal(sim);
  b = await gateway();
  // B's subscription is up before A's: A's is the newest pub/sub client.
  a = await gateway();
}, 30_000);

afterAll(async () => {
  await a?.close();
  await b?.close();
  admin?.disconnect();
  await sim?.close();
  await redis?.stop();
});

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Cuts the newest pub/sub client (A's subscription) and refuses new connections until `reopen`. */
async function cutNewestSubscriber(): Promise<() => Promise<void>> {
  const list = (await admin.call("CLIENT", "LIST", "TYPE", "pubsub")) as string;
  const ids = list
    .trim()
    .split("\n")
    .map((line) => Number(/(?:^| )id=(\d+)/.exec(line)![1]));
  expect(ids.length).toBe(2);
  const newest = Math.max(...ids);
  const connected = Number(/connected_clients:(\d+)/.exec((await admin.info("clients")) as string)![1]);
  const before = (await admin.config("GET", "maxclients")) as string[];
  await admin.config("SET", "maxclients", String(connected - 1));
  await admin.client("KILL", "ID", String(newest));
  return async () => {
    await admin.config("SET", "maxclients", before[1]!);
  };
}

async function call(gw: FastifyInstance, sid: string, token: string) {
  return gw.inject({
    method: "POST",
    url: `/s/${sid}/v1/chat/completions`,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    payload: { model: "m", messages: [{ role: "user", content: 'hi\n#sim: [{"text": "answered"}]' }] },
  });
}

async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  let v = await read();
  while (!ok(v) && Date.now() < deadline) {
    await pause(50);
    v = await read();
  }
  return v;
}

describe("a replica whose admin subscription dropped while the trainer acted through another", () => {
  it("weights moved while it was not listening: once subscribed again it reads the version again, and its records carry the new one", async () => {
    expect((await b.inject({ method: "POST", url: "/admin/weights", payload: { version: "v1" } })).statusCode).toBe(200);
    const s = (await b.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
    expect((await call(a, s.id, s.token)).statusCode).toBe(200);

    const reopen = await cutNewestSubscriber();
    // Through B while A is not listening: a pause, the new weights, a resume.
    expect((await b.inject({ method: "POST", url: "/admin/inference/pause", payload: { mode: "drain", timeout_s: 5 } })).statusCode).toBe(200);
    expect((await b.inject({ method: "POST", url: "/admin/weights", payload: { version: "v2" } })).statusCode).toBe(200);
    expect((await b.inject({ method: "POST", url: "/admin/inference/resume" })).statusCode).toBe(200);
    await reopen();
    // A's subscriber connects again by itself (ioredis retries, resubscribes).
    await until(
      async () => ((await admin.call("CLIENT", "LIST", "TYPE", "pubsub")) as string).trim().split("\n").length,
      (n) => n === 2,
    );
    await pause(300);

    const answered = await Promise.race([call(a, s.id, s.token), pause(3_000).then(() => null)]);
    expect(answered, "a resume A missed holds its calls").not.toBeNull();
    expect(answered!.statusCode).toBe(200);
    const records = (await b.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: CompletionRecord[] };
    expect(records.completions.map((r) => r.weight_version)).toEqual(["v1", "v2"]);
  });

  it("a resume it missed while it was paused: its calls go on once it is subscribed again, not held for ever", async () => {
    const s = (await b.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
    expect((await b.inject({ method: "POST", url: "/admin/inference/pause", payload: { mode: "drain", timeout_s: 5 } })).statusCode).toBe(200);
    // A hears the pause: a call through it waits.
    await pause(200);
    const held = call(a, s.id, s.token);
    const early = await Promise.race([held, pause(300).then(() => null)]);
    expect(early, "A holds calls while paused").toBeNull();

    const reopen = await cutNewestSubscriber();
    expect((await b.inject({ method: "POST", url: "/admin/inference/resume" })).statusCode).toBe(200);
    await reopen();
    const answered = await Promise.race([held, pause(5_000).then(() => null)]);
    expect(answered, "a resume A missed holds its calls").not.toBeNull();
    expect(answered!.statusCode).toBe(200);
  });
});
