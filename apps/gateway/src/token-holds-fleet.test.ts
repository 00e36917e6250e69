/**
 * A session's max_total_tokens across gateway replicas: calls of one session served by two
 * gateways on one key prefix (Fastify inject, one engine-sim with slow scripted answers, real Redis)
 * share what is left as calls on one gateway do. Each call's worst case is held in Redis until its
 * record is stored, so the session's recorded total never passes its limit; a call that does not
 * fit beside the others waits for them; a hold whose gateway died expires.
 */
import { randomUUID } from "node:crypto";
import type { CompletionRecord } from "@rollgate/protocol";
import { SessionStore } from "@rollgate/store";
import type { FastifyInstance } from "fastify";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dropPrefixes, startSimFleet, TEST_REDIS_URL, type SimFleet } from "./__fixtures__/harness.js";

const prefix = `test-fleetholds-${randomUUID().slice(0, 8)}`;
// How long the dead replica's hold below counts (its own ROLLGATE_TOKEN_HOLD_TTL_S).
const DEAD_HOLD_TTL_MS = 1_500;
let fleet: SimFleet;
let A: FastifyInstance;
let B: FastifyInstance;
let redis: Redis;

// An answer far longer than any limit below, slow enough that calls sent together overlap.
const LONG = (i: number) => `Story ${i}.\n#sim: ${JSON.stringify([{ text: "Once", tokens: 400 }])}`;

beforeAll(async () => {
  fleet = await startSimFleet("fleetholds", { dpSize: 1, tpotMs: 2 });
  const replica = () => fleet.gateway({ env: { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_HEALTH_INTERVAL_S: "0" } });
  A = await replica();
  B = await replica();
  redis = new Redis(TEST_REDIS_URL);
});
afterAll(async () => {
  for (const app of [A, B]) await app?.close();
  redis?.disconnect();
  await fleet?.close();
  await dropPrefixes([prefix]);
});

type Opened = { id: string; token: string };

async function limited(maxTotalTokens: number): Promise<Opened> {
  const res = await A.inject({ method: "POST", url: "/v1/sessions", payload: { limits: { max_total_tokens: maxTotalTokens } } });
  expect(res.statusCode, res.body).toBe(201);
  return res.json() as Opened;
}

const chat = (via: FastifyInstance, s: Opened, payload: Record<string, unknown>) =>
  via.inject({ method: "POST", url: `/s/${s.id}/v1/chat/completions`, headers: { authorization: `Bearer ${s.token}` }, payload });
const records = async (id: string) => ((await B.inject({ url: `/v1/sessions/${id}/completions` })).json() as { completions: CompletionRecord[] }).completions;
const used = (rs: CompletionRecord[]) => rs.reduce((n, r) => n + r.prompt_ids.length + r.output_ids.length, 0);

describe("max_total_tokens across replicas", () => {
  it("calls of one session sent together through two replicas never record more than the limit; the ones that do not fit wait, then end cut or refused", async () => {
    const LIMIT = 600;
    const s = await limited(LIMIT);
    const calls = [0, 1, 2, 3, 4, 5].map((i) => chat(i % 2 === 0 ? A : B, s, { model: "m", messages: [{ role: "user", content: LONG(i) }] }));
    const answers = await Promise.all(calls);
    for (const res of answers) {
      // Answered (cut to what was left), or refused once the session was used up: never a failure.
      if (res.statusCode !== 200) {
        expect(res.statusCode, res.body).toBe(400);
        expect(res.json().error.code).toBe("session_token_limit");
      } else {
        expect(["stop", "length"]).toContain(res.json().choices[0].finish_reason);
      }
    }
    const rs = await records(s.id);
    expect(rs.length).toBeGreaterThan(0);
    expect(used(rs)).toBeLessThanOrEqual(LIMIT);
  });

  it("a hold taken by a replica that died expires: the session's next call waits for it, then is answered", async () => {
    const s = await limited(600);
    // A third replica's store takes call 0's hold on the whole budget and stops there (its process gone).
    const dead = new SessionStore(redis, prefix);
    const seq = await dead.nextSeq(s.id);
    const held = await dead.fitHold(s.id, seq!, { limit: 600, promptLength: 10, asked: undefined, contextLength: null, ttlMs: DEAD_HOLD_TTL_MS });
    expect(held.fits).toBe(true);
    const started = Date.now();
    const res = await chat(A, s, { model: "m", max_tokens: 5, messages: [{ role: "user", content: LONG(9) }] });
    expect(res.statusCode, res.body).toBe(200);
    // It could not fit beside the dead call's hold: it was answered only once that hold had expired.
    expect(Date.now() - started).toBeGreaterThanOrEqual(DEAD_HOLD_TTL_MS - 200);
    expect(used(await records(s.id))).toBeLessThanOrEqual(600);
  });
});
