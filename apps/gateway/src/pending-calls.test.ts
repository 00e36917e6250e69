/**
 * An agent is answered before its call's record is stored. Whoever must see every record waits
 * for those still being written, on any replica: close (and its trajectory), the next call that
 * echoes the previous answer; a record that never comes, or cannot be stored, is a lost call.
 * "Another replica" here is a second SessionStore on its own connection under the gateway's key
 * prefix: it takes a call's number as a replica's pre-engine step does and stores the record when
 * the test says, so the slow or missing write is exact, not a race.
 */
import { randomUUID } from "node:crypto";
import type { ClosedSession, CompletionRecord, Session } from "@rollgate/protocol";
import { keys, SessionStore } from "@rollgate/store";
import { recordHead } from "@rollgate/transforms";
import type { FastifyInstance } from "fastify";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dropPrefixes, startSimFleet, TEST_REDIS_URL, type SimFleet } from "./__fixtures__/harness.js";

const WAIT_MS = 1_500;
const prefix = `test-pending-${randomUUID().slice(0, 8)}`;
let fleet: SimFleet;
let app: FastifyInstance;
let redis: Redis;
/** Another replica's store of the same sessions. */
let replica: SessionStore;

beforeAll(async () => {
  fleet = await startSimFleet("pending", { dpSize: 1 });
  app = await fleet.gateway({ env: { ROLLGATE_HEALTH_INTERVAL_S: "0", ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_APPEND_WAIT_MS: String(WAIT_MS) } });
  redis = new Redis(TEST_REDIS_URL);
  replica = new SessionStore(redis, prefix);
});
afterAll(async () => {
  await app.close();
  redis.disconnect();
  await fleet.close();
  await dropPrefixes([prefix]);
});

async function open(): Promise<{ id: string; token: string }> {
  const res = await app.inject({ method: "POST", url: "/v1/sessions", payload: {} });
  expect(res.statusCode).toBe(201);
  return res.json() as { id: string; token: string };
}

const sim = (text: string) => `go\n#sim: ${JSON.stringify([{ text }])}`;

function chat(s: { id: string; token: string }, messages: unknown[], extra: Record<string, unknown> = {}) {
  return app.inject({
    method: "POST",
    url: `/s/${s.id}/v1/chat/completions`,
    headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
    payload: JSON.stringify({ messages, ...extra }),
  });
}

const close = async (id: string) => (await app.inject({ method: "POST", url: `/v1/sessions/${id}/close?trajectory=per_request` })).json() as ClosedSession;
const session = async (id: string) => (await app.inject({ url: `/v1/sessions/${id}` })).json() as Session;

/** A real record of the gateway's, made call `seq` of session `sid` (what another replica would store). */
async function recordFor(sid: string, seq: number, text: string): Promise<CompletionRecord> {
  const donor = await open();
  expect((await chat(donor, [{ role: "user", content: sim(text) }])).statusCode).toBe(200);
  await app.inject({ method: "POST", url: `/v1/sessions/${donor.id}/close` });
  const record = (await replica.record(donor.id, 0))!;
  return { ...record, id: `cmpl-${randomUUID()}`, session_id: sid, seq };
}

describe("records written after the answer", () => {
  it("close waits for a record another replica is still storing: the trajectory has it, nothing is lost", async () => {
    const s = await open();
    const record = await recordFor(s.id, 0, "stored late");
    // Replica X took call 0 (its pre-engine step) and answered the agent; its record is on its way.
    expect((await replica.getForCall(s.id, { takeSeq: true }))?.seq).toBe(0);
    const started = Date.now();
    const closing = close(s.id);
    await new Promise((r) => setTimeout(r, 200));
    await replica.appendRecord(record, recordHead(record));
    const closed = await closing;
    expect(Date.now() - started).toBeGreaterThanOrEqual(200);
    expect(closed.state).toBe("closed");
    expect(closed.counts.llm_calls).toBe(1);
    expect(closed.lost_calls).toEqual({ count: 0, first: null });
    expect(closed.trajectory?.traces).toHaveLength(1);
    expect(closed.trajectory?.traces[0]!.response_ids).toEqual(record.output_ids);
    expect(await replica.pendingCalls(s.id)).toEqual([]);
  });

  it("a call whose record never comes (its replica stopped after answering) is a lost call at close", async () => {
    const s = await open();
    expect((await chat(s, [{ role: "user", content: sim("kept") }])).statusCode).toBe(200);
    expect((await replica.getForCall(s.id, { takeSeq: true }))?.seq).toBe(1);
    const started = Date.now();
    const closed = await close(s.id);
    expect(Date.now() - started).toBeGreaterThanOrEqual(WAIT_MS);
    expect(closed.counts.llm_calls).toBe(1);
    expect(closed.lost_calls.count).toBe(1);
    expect(closed.lost_calls.first).toMatchObject({ kind: "record_missing", message: expect.stringMatching(/call 1 had no record/) });
    expect(closed.trajectory?.traces).toHaveLength(1);
    // Marked once: the next read neither waits nor counts it again.
    expect(await replica.pendingCalls(s.id)).toEqual([]);
    expect((await session(s.id)).lost_calls.count).toBe(1);
  });

  it("calls that end without a record (refused, failed) leave nothing pending: close does not wait", async () => {
    const s = await open();
    expect((await chat(s, [{ role: "user", content: sim("one") }])).statusCode).toBe(200);
    // The second call takes its number with the session read (known token), then its body is refused.
    expect((await chat(s, [{ role: "user", content: "x" }], { max_tokens: 10_000_000 })).statusCode).toBe(400);
    expect((await chat(s, [{ role: "user", content: "x" }], { temperature: "warm" })).statusCode).toBe(400);
    const started = Date.now();
    const closed = await close(s.id);
    expect(Date.now() - started).toBeLessThan(WAIT_MS);
    expect(closed.lost_calls.count).toBe(0);
    expect(closed.counts.llm_calls).toBe(1);
    expect(await replica.pendingCalls(s.id)).toEqual([]);
  });

  it("a body that fails its schema after its session read took a number gives it back: the next call takes it, OpenAI and Anthropic alike", async () => {
    const s = await open();
    expect((await chat(s, [{ role: "user", content: sim("one") }])).statusCode).toBe(200);
    // Known token: the session read (sent before the body's check) takes number 1 with it, then the body is refused.
    const bad = await chat(s, [{ role: "user", content: "x" }], { temperature: "warm" });
    expect(bad.statusCode).toBe(400);
    expect((bad.json() as { error: { message: string } }).error.message).toMatch(/temperature/);
    const anthropic = (body: Record<string, unknown>) =>
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/messages`,
        headers: { "x-api-key": s.token, "content-type": "application/json" },
        payload: JSON.stringify({ model: "m", max_tokens: 16, messages: [{ role: "user", content: sim("two") }], ...body }),
      });
    const badAnthropic = await anthropic({ temperature: "warm" });
    expect(badAnthropic.statusCode).toBe(400);
    expect((badAnthropic.json() as { type: string }).type).toBe("error");
    expect((await anthropic({})).statusCode).toBe(200);
    const closed = await close(s.id);
    expect(closed.lost_calls.count).toBe(0);
    expect(closed.counts.llm_calls).toBe(2);
    // The refused bodies left no gap: the second good call is number 1.
    expect((await replica.record(s.id, 1))?.request.messages.at(-1)?.content).toContain("two");
    expect(await replica.pendingCalls(s.id)).toEqual([]);
  });

  it("a record that cannot be stored after the answer went out: logged, counted, and the call is lost", async () => {
    const s = await open();
    // A real failure: the session's records key is not a hash, so the append script fails (WRONGTYPE).
    await redis.set(keys(prefix).records(s.id), "not a hash");
    const res = await chat(s, [{ role: "user", content: sim("answered anyway") }]);
    expect(res.statusCode).toBe(200);
    expect(res.json().choices[0].message.content).toBe("answered anyway");
    // The mark is written after the answer: it is there once the write has failed.
    const deadline = Date.now() + 5_000;
    while ((await session(s.id)).lost_calls.count === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    const marked = await session(s.id);
    expect(marked.lost_calls.count).toBe(1);
    expect(marked.lost_calls.first).toMatchObject({ kind: "record_not_written", status: 200, message: expect.stringMatching(/WRONGTYPE/) });
    const metrics = (await app.inject({ url: "/metrics" })).body;
    expect(metrics).toMatch(/rollgate_store_errors_total\{what="record_append"\} 1/);
    // Not counted twice at close, and close does not wait for it.
    const started = Date.now();
    const closed = (await app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close` })).json() as ClosedSession;
    expect(Date.now() - started).toBeLessThan(WAIT_MS);
    expect(closed.lost_calls.count).toBe(1);
    expect(closed.counts.llm_calls).toBe(0);
  });

  it("a gateway that stops right after answering stores the record first", async () => {
    const gw = await fleet.gateway({ env: { ROLLGATE_HEALTH_INTERVAL_S: "0", ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_APPEND_WAIT_MS: String(WAIT_MS) } });
    const s = (await gw.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
    const res = await gw.inject({
      method: "POST",
      url: `/s/${s.id}/v1/chat/completions`,
      headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
      payload: JSON.stringify({ messages: [{ role: "user", content: sim("last words") }] }),
    });
    expect(res.statusCode).toBe(200);
    await gw.close();
    expect((await replica.record(s.id, 0))?.message.content).toBe("last words");
    expect(await replica.pendingCalls(s.id)).toEqual([]);
  });

  it("the next call echoes this gateway's answer, right after it or once stored (its record heads then read with the session): each turn is restored as generated", async () => {
    const s = await open();
    const generated = "\n\nthe answer  ";
    const first = await chat(s, [{ role: "user", content: sim(generated) }]);
    expect(first.statusCode).toBe(200);
    const user = { role: "user", content: sim(generated) };
    // Sent at once: the first record may still be on its way (the call waits for it).
    const second = await chat(s, [user, { role: "assistant", content: "the answer" }, { role: "user", content: sim(generated) }]);
    expect(second.statusCode).toBe(200);
    await new Promise((r) => setTimeout(r, 100));
    // Sent once both are stored: the heads come with the session read, in the OpenAI and the Anthropic shape.
    const history = [user, { role: "assistant", content: "the answer" }, { role: "user", content: sim(generated) }, { role: "assistant", content: "the answer" }];
    expect((await chat(s, [...history, { role: "user", content: sim("next") }])).statusCode).toBe(200);
    const anthropic = await app.inject({
      method: "POST",
      url: `/s/${s.id}/v1/messages`,
      headers: { "x-api-key": s.token, "content-type": "application/json", "anthropic-version": "2023-06-01" },
      payload: JSON.stringify({ max_tokens: 32, messages: [...history, { role: "user", content: sim("more") }] }),
    });
    expect(anthropic.statusCode).toBe(200);
    const { completions } = (await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: CompletionRecord[] };
    expect(completions.map((r) => r.seq)).toEqual([0, 1, 2, 3]);
    expect(completions[1]!.request.messages[1]).toMatchObject({ role: "assistant", content: generated });
    for (const r of completions.slice(2)) {
      expect(r.request.messages[1]).toMatchObject({ role: "assistant", content: generated });
      expect(r.request.messages[3]).toMatchObject({ role: "assistant", content: generated });
    }
  });

  it("the next call echoes an answer whose record another replica is still storing: it waits and restores it", async () => {
    const s = await open();
    // The engine's answer has whitespace around it; the agent echoes it trimmed. A matched turn is
    // restored as generated, so the next call's record shows whether the previous record was seen.
    const generated = "\n\nthe answer  ";
    const record = await recordFor(s.id, 0, generated);
    expect(record.message.content).toBe(generated);
    expect(generated.trim()).not.toBe(generated);
    expect((await replica.getForCall(s.id, { takeSeq: true }))?.seq).toBe(0);
    const user = record.request.messages[0]!;
    const calling = chat(s, [user, { role: "assistant", content: "the answer" }, { role: "user", content: sim("next") }]);
    await new Promise((r) => setTimeout(r, 100));
    await replica.appendRecord(record, recordHead(record));
    expect((await calling).statusCode).toBe(200);
    // Read through the gateway: the records route waits for this replica's writes still under way.
    const { completions } = (await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: CompletionRecord[] };
    expect(completions.map((r) => r.seq)).toEqual([0, 1]);
    expect(completions[1]!.request.messages[1]).toMatchObject({ role: "assistant", content: generated });
  });
});
