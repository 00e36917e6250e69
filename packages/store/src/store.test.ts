import { randomUUID } from "node:crypto";
import { Task, type AcceptedTask, type CompletionRecord, type TaskResult } from "@rollgate/protocol";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RankRouter } from "./routing.js";
import { SessionStore, hashToken, tokenMatches } from "./sessions.js";
import { TaskStore } from "./tasks.js";

// Real Redis, a prefix of our own, removed afterwards.
const url = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const prefix = `test-store-${randomUUID().slice(0, 8)}`;
let redis: Redis;

beforeAll(() => {
  redis = new Redis(url);
});
afterAll(async () => {
  // Each test works under `${prefix}-<its own>`: everything starting with the prefix goes.
  const found = [...(await redis.keys(`${prefix}*`)), ...(await redis.keys(`{${prefix}*`))];
  if (found.length) await redis.del(...found);
  redis.disconnect();
});

const members = ["0:0", "0:1", "1:0"];
const session = (id: string) => ({ sampling: {}, limits: {}, metadata: {}, id });
const assignment = { engine: 0, engine_url: "http://e", dp_rank: 0, served_model: "m" };

/** A one-token record of session `sid` (what the record-heads tests append), and its append with its head. */
const smallRecord = (sid: string, seq: number, id: string, content: string): CompletionRecord => ({
  id,
  session_id: sid,
  seq,
  created_at: new Date(0).toISOString(),
  protocol: "openai_chat",
  engine: "http://e",
  dp_rank: 0,
  weight_version: null,
  request: { messages: [{ role: "user", content: "x" }], sampling: {} },
  prompt_ids: [1],
  output_ids: [2],
  output_logprobs: [-1],
  finish_reason: "stop",
  message: { content, reasoning: null, tool_calls: [] },
  usage: { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 0 },
  latency_ms: 1,
});
const appendWithHead = (store: SessionStore, r: CompletionRecord) =>
  store.appendRecord(r, { id: r.id, seq: r.seq, message: r.message, finish_reason: r.finish_reason, message_count: 1, conversation_key: `k${r.seq}` });

describe("RankRouter", () => {
  it("spreads sessions over the least-loaded ranks and keeps an affinity key on one rank", async () => {
    const router = new RankRouter(redis, `${prefix}-r1`);
    const first = await Promise.all([1, 2, 3].map(() => router.assign(members, undefined)));
    expect(new Set(first)).toEqual(new Set(members));
    const g1 = await router.assign(members, "group-a");
    const g2 = await router.assign(members, "group-a");
    const g3 = await router.assign(members, "group-a");
    expect(g2).toBe(g1);
    expect(g3).toBe(g1);
    const loads = await router.loads();
    expect(loads[g1!]).toBe(4);
    expect(Object.values(loads).reduce((a, b) => a + b, 0)).toBe(6);
  });

  it("an affinity rank that is overloaded is left: the key moves to the least-loaded rank and the group follows", async () => {
    const router = new RankRouter(redis, `${prefix}-r5`, { maxSkew: 3 });
    const two = ["0:0", "0:1"];
    const first = await router.assign(two, "big-group");
    // The group fills its rank until it has 3 more sessions than the other one...
    const next = [];
    for (let i = 0; i < 2; i++) next.push(await router.assign(two, "big-group"));
    expect(next).toEqual([first, first]);
    // ...then the next member goes to the least-loaded rank, and the key with it.
    const other = two.find((m) => m !== first);
    expect(await router.assign(two, "big-group")).toBe(other);
    expect(await router.assign(two, "big-group")).toBe(other);
    expect(await router.loads()).toEqual({ [first!]: 3, [other!]: 2 });
  });

  it("round robin takes ranks in turn; least_loaded ignores affinity keys", async () => {
    const rr = new RankRouter(redis, `${prefix}-r3`);
    const got = [];
    for (let i = 0; i < 6; i++) got.push(await rr.assign(members, "g", "round_robin"));
    expect(got).toEqual([...members, ...members]);
    const ll = new RankRouter(redis, `${prefix}-r4`);
    const spread = [];
    for (let i = 0; i < 3; i++) spread.push(await ll.assign(members, "same-group", "least_loaded"));
    expect(new Set(spread).size).toBe(3);
  });

  it("ignores ranks no longer configured", async () => {
    const router = new RankRouter(redis, `${prefix}-r2`);
    await router.assign(["9:9"], undefined);
    expect(await router.assign(["0:0"], undefined)).toBe("0:0");
    expect(await router.assign([], undefined)).toBeNull();
  });
});

describe("SessionStore", () => {
  it("checks tokens, refuses a taken id, and releases the rank slot exactly once on close", async () => {
    const p = `${prefix}-s1`;
    const store = new SessionStore(redis, p);
    const router = new RankRouter(redis, p);
    const member = (await router.assign(["0:0"], undefined))!;
    const token = "tok-" + randomUUID();
    expect(await store.create("s-1", session("s-1"), hashToken(token), assignment, member, new Date())).toBe("created");
    // A refused create gives back the slot its own assign took.
    const again = (await router.assign(["0:0"], undefined))!;
    expect(await store.create("s-1", session("s-1"), hashToken("other"), assignment, again, new Date())).toBe("taken");
    const found = (await store.getForCall("s-1"))!;
    expect(tokenMatches(token, found.tokenHash)).toBe(true);
    expect(tokenMatches("wrong", found.tokenHash)).toBe(false);
    expect(found.session.state).toBe("open");
    expect(await router.loads()).toEqual({ "0:0": 1 });
    expect(await store.close("s-1", new Date())).toBe(true);
    expect(await store.close("s-1", new Date())).toBe(false);
    expect(await router.loads()).toEqual({ "0:0": 0 });
    expect((await store.get("s-1"))!.state).toBe("closed");
  });

  it("an id closed before a session was opened under it can no longer be opened, and the refused open holds no rank slot", async () => {
    const p = `${prefix}-s1c`;
    const store = new SessionStore(redis, p);
    const router = new RankRouter(redis, p);
    expect(await store.closeAndGet("s-late", new Date())).toBeNull();
    expect(await store.closedUnopened("s-late")).toBe(true);
    const member = (await router.assign(["0:0"], undefined))!;
    expect(await store.create("s-late", session("s-late"), hashToken("t"), assignment, member, new Date())).toBe("closed");
    expect(await store.get("s-late")).toBeNull();
    expect(await router.loads()).toEqual({ "0:0": 0 });
    // Other ids are not touched.
    expect(await store.closedUnopened("s-other")).toBe(false);
  });

  it("closeAndGet answers the closed session and gives its rank slot back once, in `released`, sent before it answers", async () => {
    const p = `${prefix}-s1b`;
    const store = new SessionStore(redis, p);
    const router = new RankRouter(redis, p);
    const member = (await router.assign(["0:0"], undefined))!;
    expect(await store.create("s-2", session("s-2"), hashToken("t"), assignment, member, new Date())).toBe("created");
    const first = (await store.closeAndGet("s-2", new Date()))!;
    expect(first.session.state).toBe("closed");
    expect(first.pendingCalls).toBe(0);
    // Sent already: a read issued after the close sees the slot given back.
    expect(await router.loads()).toEqual({ "0:0": 0 });
    await first.released;
    const again = (await store.closeAndGet("s-2", new Date()))!;
    await again.released;
    expect(again.session.state).toBe("closed");
    expect(await router.loads()).toEqual({ "0:0": 0 });
    expect(await store.closeAndGet("s-missing", new Date())).toBeNull();
  });

  it("closeAndGet with the records asked for answers them and the failed-call notes as a later read does, only when no call is pending", async () => {
    const p = `${prefix}-s1c`;
    const store = new SessionStore(redis, p);
    const other = new SessionStore(redis, p);
    await store.create("s-c", { ...session("s-c"), metadata: { note: "é ✓ 字" } }, hashToken("t"), assignment, "0:0", new Date());
    const rec = (seq: number, prompt: number[]): CompletionRecord => ({
      id: `cmpl-${seq}`,
      session_id: "s-c",
      seq,
      created_at: new Date(0).toISOString(),
      protocol: "openai_chat",
      engine: "http://e",
      dp_rank: 0,
      weight_version: null,
      request: { messages: [{ role: "user", content: `ünïcode ${seq} ✓` }], sampling: {} },
      prompt_ids: prompt,
      output_ids: [seq + 100, seq + 101],
      // Not float32: stored 8 bytes wide.
      output_logprobs: [-0.1, -1 / 3],
      finish_reason: "stop",
      message: { content: `answer ${seq} 字`, reasoning: null, tool_calls: [] },
      usage: { prompt_tokens: prompt.length, completion_tokens: 2, cached_tokens: 0 },
      latency_ms: 1,
    });
    const head = (r: CompletionRecord) => ({ id: r.id, seq: r.seq, message: r.message, finish_reason: r.finish_reason, message_count: 1, conversation_key: `k${r.seq}` });
    for (let i = 0; i < 3; i++) await store.nextSeq("s-c");
    const r0 = rec(0, [1, 2, 3]);
    const r1 = rec(1, [1, 2, 3, 100, 101, 7]); // a delta of record 0
    await store.appendRecord(r0, head(r0));
    await store.appendRecord(r1, head(r1));
    await store.appendFailure("s-c", { seq: 2, at: new Date(0).toISOString(), kind: "engine_error", message: "boom ✗", dp_rank: 0 });
    // Call 2 is still pending: nothing final comes with the close.
    const pending = (await store.closeAndGet("s-c", new Date(), { records: true }))!;
    await pending.released;
    expect(pending.pendingCalls).toBe(1);
    expect(pending.final).toBeUndefined();
    await store.settleCall("s-c", 2);
    const closed = (await other.closeAndGet("s-c", new Date(), { records: true }))!;
    await closed.released;
    expect(closed.pendingCalls).toBe(0);
    expect(closed.session.metadata).toEqual({ note: "é ✓ 字" });
    expect(JSON.stringify(closed.final)).toBe(JSON.stringify({ records: await other.records("s-c"), failures: await other.failures("s-c") }));
    expect(closed.final!.records).toEqual([r0, r1]);
    // Without the records asked for: as before.
    const plain = (await other.closeAndGet("s-c", new Date()))!;
    expect(plain.final).toBeUndefined();
    expect(plain.session).toEqual(closed.session);
  });

  it("a session's record heads read while this process deletes and makes it again are not kept for the new one", async () => {
    const p = `${prefix}-s-heads2`;
    const store = new SessionStore(redis, p);
    const rec = (seq: number, tag: string) => smallRecord("s-r", seq, `${tag}${seq}`, `answer ${tag}${seq}`);
    const append = (r: CompletionRecord) => appendWithHead(store, r);
    const ids = async () => (await store.recordHeads("s-r")).map((h) => h.id);
    await store.create("s-r", session("s-r"), hashToken("t"), assignment, "0:0", new Date());
    for (let i = 0; i < 3; i++) await store.nextSeq("s-r");
    for (let i = 0; i < 2; i++) await append(rec(i, "a"));
    expect(await ids()).toEqual(["a0", "a1"]);
    await append(rec(2, "a"));
    // A read in flight (sent before the delete) ends after the session was made again.
    const inFlight = store.recordHeads("s-r");
    const deleted = store.delete("s-r", new Date());
    await inFlight;
    await deleted;
    await store.create("s-r", session("s-r"), hashToken("t"), assignment, "0:0", new Date());
    expect(await ids()).toEqual([]);
    for (let i = 0; i < 4; i++) await store.nextSeq("s-r");
    await append(rec(1, "b"));
    expect(await ids()).toEqual(["b1"]);
    await append(rec(3, "b"));
    await append(rec(0, "b"));
    expect(await ids()).toEqual(["b0", "b1", "b3"]);
  });

  it("record heads read through a small head cache (sessions evicted, some too big to keep) are the stored ones", async () => {
    const p = `${prefix}-s-heads3`;
    const store = new SessionStore(redis, p, { headCacheBytes: 8_000 });
    const fresh = (sid: string) => new SessionStore(redis, p).recordHeads(sid);
    const rec = (sid: string, seq: number, text: string) => smallRecord(sid, seq, `${sid}-${seq}`, text);
    const sids = ["h-a", "h-b", "h-c", "h-big"];
    for (const sid of sids) await store.create(sid, session(sid), hashToken("t"), assignment, "0:0", new Date());
    for (let round = 0; round < 6; round++) {
      for (const sid of sids) {
        const seq = (await store.nextSeq(sid))!;
        // Every other round leaves a hole (a call still pending) filled a round later.
        if (round % 2 === 0 || sid === "h-b") {
          const r = rec(sid, seq, sid === "h-big" ? "y".repeat(600) : `answer ${seq}`);
          await appendWithHead(store, r);
        }
        if (round % 2 === 0 && round > 0 && sid !== "h-b") {
          const r = rec(sid, seq - 1, `late ${seq - 1}`);
          await appendWithHead(store, r);
        }
        expect(await store.recordHeads(sid)).toEqual(await fresh(sid));
      }
    }
    for (const sid of sids) expect((await store.recordHeads(sid)).map((h) => h.seq)).toEqual([0, 1, 2, 3, 4, 5].filter((s) => sid === "h-b" || s < 5));
  });

  it("orders records by the sequence reserved when their call started and counts usage", async () => {
    const store = new SessionStore(redis, `${prefix}-s2`);
    await store.create("s-2", session("s-2"), hashToken("t"), assignment, "0:0", new Date());
    const seqs = await Promise.all([store.nextSeq("s-2"), store.nextSeq("s-2")]);
    expect(seqs.sort()).toEqual([0, 1]);
    const rec = (seq: number): CompletionRecord => ({
      ...smallRecord("s-2", seq, `c${seq}`, "y"),
      usage: { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 1 },
    });
    // The later call finishes first: order still follows seq.
    const head = (r: CompletionRecord) => ({ id: r.id, seq: r.seq, message: r.message, finish_reason: r.finish_reason, message_count: 1, conversation_key: `k${r.seq}` });
    await store.appendRecord(rec(1), head(rec(1)));
    await store.appendRecord(rec(0), head(rec(0)));
    expect((await store.records("s-2")).map((r) => r.id)).toEqual(["c0", "c1"]);
    expect((await store.recordHeads("s-2")).map((h) => [h.id, h.conversation_key])).toEqual([["c0", "k0"], ["c1", "k1"]]);
    expect((await store.record("s-2", 1))!.id).toBe("c1");
    expect(await store.record("s-2", 7)).toBeNull();
    expect((await store.get("s-2"))!.counts).toEqual({ llm_calls: 2, prompt_tokens: 2, completion_tokens: 2, cached_tokens: 2 });
    expect(await store.delete("s-2", new Date())).toBe(true);
    expect(await store.get("s-2")).toBeNull();
    expect(await store.records("s-2")).toEqual([]);
  });

  it("max_total_tokens holds: shared by every store on the prefix, dropped with the call's record, settle or give-back, gone with a close", async () => {
    const p = `${prefix}-holds`;
    const [one, two] = [new SessionStore(redis, p), new SessionStore(redis, p)];
    const holds = () => redis.hgetall(`${p}:{s:s-h}:holds`);
    await one.create("s-h", session("s-h"), hashToken("t"), assignment, "0:0", new Date());
    const ask = (promptLength: number, asked?: number) => ({ limit: 100, promptLength, asked, contextLength: 4_096, ttlMs: 60_000 });
    const [a, b, c, d] = [(await one.nextSeq("s-h"))!, (await two.nextSeq("s-h"))!, (await one.nextSeq("s-h"))!, (await one.nextSeq("s-h"))!];
    expect(await one.fitHold("s-h", a, ask(10, 20))).toEqual({ fits: true, maxTokens: 20, hold: 30, used: 0, heldByOthers: 0 });
    // Another store (replica) sees that hold: its call gets only the rest.
    expect(await two.fitHold("s-h", b, ask(10))).toEqual({ fits: true, maxTokens: 60, hold: 70, used: 0, heldByOthers: 30 });
    expect(await one.fitHold("s-h", c, ask(5))).toEqual({ fits: false, why: "over", used: 0, heldByOthers: 100 });
    // The record of call a is counted in the step that drops its hold: nothing is counted twice.
    await appendWithHead(one, { ...smallRecord("s-h", a, "ca", "y"), usage: { prompt_tokens: 10, completion_tokens: 5, cached_tokens: 0 } });
    expect(Object.keys(await holds())).toEqual([String(b)]);
    expect(await one.fitHold("s-h", c, ask(5))).toEqual({ fits: true, maxTokens: 10, hold: 15, used: 15, heldByOthers: 70 });
    await two.settleOwnCall("s-h", b, hashToken("t"));
    expect(Object.keys(await holds())).toEqual([String(c)]);
    await one.giveBackCall("s-h", c, hashToken("t"));
    expect(await holds()).toEqual({});
    await one.fitHold("s-h", d, ask(5));
    await one.settleCall("s-h", d);
    expect(await holds()).toEqual({});
    await one.fitHold("s-h", d, ask(5));
    expect(await one.close("s-h", new Date())).toBe(true);
    expect(await holds()).toEqual({});
    expect(await one.fitHold("s-h", d, ask(5))).toEqual({ fits: false, why: "closed" });
  });

  it("a max_total_tokens hold past its lifetime (its replica died) no longer counts", async () => {
    const store = new SessionStore(redis, `${prefix}-holds2`);
    await store.create("s-h2", session("s-h2"), hashToken("t"), assignment, "0:0", new Date());
    const ask = (ttlMs: number) => ({ limit: 100, promptLength: 10, asked: undefined, contextLength: 4_096, ttlMs });
    expect(await store.fitHold("s-h2", 0, ask(1_000))).toMatchObject({ fits: true, hold: 100 });
    expect(await store.fitHold("s-h2", 1, ask(60_000))).toMatchObject({ fits: false, why: "over", heldByOthers: 100 });
    await new Promise((r) => setTimeout(r, 1_100));
    expect(await store.fitHold("s-h2", 1, ask(60_000))).toMatchObject({ fits: true, hold: 100, heldByOthers: 0 });
    expect(await store.delete("s-h2", new Date())).toBe(true);
    expect(await redis.exists(`${prefix}-holds2:{s:s-h2}:holds`)).toBe(0);
  });

  it("stores a call's record, or clears its pending mark, only while its session still has the token the call was authorised with", async () => {
    const store = new SessionStore(redis, `${prefix}-s5`);
    const head = (r: CompletionRecord) => ({ id: r.id, seq: r.seq, message: r.message, finish_reason: r.finish_reason, message_count: 1, conversation_key: `k${r.seq}` });
    await store.create("s-5", session("s-5"), hashToken("old"), assignment, "0:0", new Date());
    expect(await store.nextSeq("s-5")).toBe(0);
    const late = smallRecord("s-5", 0, "old0", "the old rollout's answer");
    // Deleted while the call ran: nothing is written, and no hash is made again for it.
    await store.delete("s-5", new Date());
    expect(await store.appendRecord(late, head(late), hashToken("old"))).toBe(false);
    expect(await redis.exists(`${prefix}-s5:{s:s-5}:session`, `${prefix}-s5:{s:s-5}:records`)).toBe(0);
    // Made again under its id for another rollout, whose call 0 is pending: the old record is not its.
    await store.create("s-5", session("s-5"), hashToken("new"), assignment, "0:0", new Date());
    expect(await store.nextSeq("s-5")).toBe(0);
    expect(await store.appendRecord(late, head(late), hashToken("old"))).toBe(false);
    expect(await store.pendingCalls("s-5")).toEqual([0]);
    // Nor does the old call, ending without a record, clear the new call 0's pending mark.
    await store.settleOwnCall("s-5", 0, hashToken("old"));
    expect(await store.pendingCalls("s-5")).toEqual([0]);
    const own = smallRecord("s-5", 0, "new0", "the new rollout's answer");
    expect(await store.appendRecord(own, head(own), hashToken("new"))).toBe(true);
    expect(await store.appendRecord(late, head(late), hashToken("old"))).toBe(false);
    expect((await store.records("s-5")).map((r) => r.id)).toEqual(["new0"]);
    expect((await store.get("s-5"))!.counts.llm_calls).toBe(1);
    await store.delete("s-5", new Date());
  });

  it("gives back the number of a call that never was one: taken again when it is still the last, a gap otherwise, never another token's", async () => {
    const store = new SessionStore(redis, `${prefix}-s6`);
    await store.create("s-6", session("s-6"), hashToken("t"), assignment, "0:0", new Date());
    expect(await store.nextSeq("s-6")).toBe(0);
    expect(await store.nextSeq("s-6")).toBe(1);
    expect(await store.giveBackCall("s-6", 1, hashToken("other"))).toBe(false);
    expect(await store.pendingCalls("s-6")).toEqual([0, 1]);
    expect(await store.giveBackCall("s-6", 1, hashToken("t"))).toBe(true);
    expect(await store.pendingCalls("s-6")).toEqual([0]);
    expect(await store.nextSeq("s-6")).toBe(1);
    expect(await store.nextSeq("s-6")).toBe(2);
    // Call 1 is not the last taken: no longer pending, but its number stays used (a gap).
    expect(await store.giveBackCall("s-6", 1, hashToken("t"))).toBe(false);
    expect(await store.pendingCalls("s-6")).toEqual([0, 2]);
    expect(await store.nextSeq("s-6")).toBe(3);
    // Given back twice: the second finds it no longer pending and changes nothing.
    expect(await store.giveBackCall("s-6", 3, hashToken("t"))).toBe(true);
    expect(await store.giveBackCall("s-6", 3, hashToken("t"))).toBe(false);
    expect(await store.nextSeq("s-6")).toBe(3);
    await store.delete("s-6", new Date());
  });

  it("a session's record heads read again after other replicas wrote, left holes or remade the session are the stored ones", async () => {
    const p = `${prefix}-s-heads`;
    // Two replicas' stores of one Redis: `a` reads heads as the calls it serves do, `b` writes too.
    const a = new SessionStore(redis, p);
    const b = new SessionStore(redis, p);
    const fresh = () => new SessionStore(redis, p).recordHeads("s-h");
    const rec = (seq: number, tag: string) => smallRecord("s-h", seq, `${tag}${seq}`, `answer ${tag}${seq}`);
    const append = appendWithHead;
    const ids = async (store: SessionStore) => (await store.recordHeads("s-h")).map((h) => h.id);

    await a.create("s-h", session("s-h"), hashToken("t"), assignment, "0:0", new Date());
    for (let i = 0; i < 5; i++) await a.nextSeq("s-h");
    expect(await ids(a)).toEqual([]);
    await append(a, rec(1, "c"));
    expect(await ids(a)).toEqual(["c1"]);
    // Seq 0 is still being written elsewhere; 2 and 4 come from the other replica.
    await append(b, rec(2, "c"));
    await append(b, rec(4, "c"));
    expect(await ids(a)).toEqual(["c1", "c2", "c4"]);
    await append(b, rec(0, "c"));
    await append(a, rec(3, "c"));
    expect(await ids(a)).toEqual(["c0", "c1", "c2", "c3", "c4"]);
    expect(await a.recordHeads("s-h")).toEqual(await fresh());
    // Asked again with nothing new: the same heads.
    expect(await a.recordHeads("s-h")).toEqual(await fresh());

    // Deleted by the other replica and made again under its id, with as many calls: its own heads.
    expect(await b.delete("s-h", new Date())).toBe(true);
    await b.create("s-h", session("s-h"), hashToken("t2"), assignment, "0:0", new Date());
    expect(await ids(a)).toEqual([]);
    for (let i = 0; i < 5; i++) await b.nextSeq("s-h");
    for (let i = 0; i < 5; i++) await append(b, rec(i, "d"));
    expect(await ids(a)).toEqual(["d0", "d1", "d2", "d3", "d4"]);
    expect(await a.recordHeads("s-h")).toEqual(await fresh());
    // Far behind (hundreds of calls since, most without a record): still every head.
    await Promise.all(Array.from({ length: 300 }, () => b.nextSeq("s-h")));
    await append(b, rec(303, "d"));
    expect(await ids(a)).toEqual(["d0", "d1", "d2", "d3", "d4", "d303"]);
    await append(b, rec(304, "d"));
    expect(await ids(a)).toEqual(["d0", "d1", "d2", "d3", "d4", "d303", "d304"]);
  });

  it("takes a call's number with its session read, none for a missing or closed session; every read sees the session as it is now", async () => {
    const store = new SessionStore(redis, `${prefix}-s4`);
    expect(await store.getForCall("s-4", { takeSeq: true })).toBeNull();
    // No number was taken for the missing session: no hash was made for it.
    expect(await redis.exists(`${prefix}-s4:{s:s-4}:session`)).toBe(0);
    await store.create("s-4", session("s-4"), hashToken("t"), assignment, "0:0", new Date());
    const first = (await store.getForCall("s-4", { takeSeq: true }))!;
    const second = (await store.getForCall("s-4", { takeSeq: true }))!;
    expect([first.seq, second.seq, await store.nextSeq("s-4")]).toEqual([0, 1, 2]);
    expect((await store.getForCall("s-4"))!.seq).toBeUndefined();
    // What changes between calls is read again each time (the static part is parsed once).
    await store.appendRecord(
      {
        id: "c0", session_id: "s-4", seq: 0, created_at: new Date().toISOString(), protocol: "openai_chat", engine: "http://e", dp_rank: 0, weight_version: null,
        request: { messages: [{ role: "user", content: "x" }], sampling: {} }, prompt_ids: [1], output_ids: [2], output_logprobs: [-1], finish_reason: "stop",
        message: { content: "y", reasoning: null, tool_calls: [] }, usage: { prompt_tokens: 5, completion_tokens: 3, cached_tokens: 0 }, latency_ms: 1,
      },
      { id: "c0", seq: 0, message: { content: "y", reasoning: null, tool_calls: [] }, finish_reason: "stop", message_count: 1, conversation_key: "k" },
    );
    await store.noteLostCalls("s-4", { count: 1, first: { at: new Date().toISOString(), kind: "engine_unreachable", status: 502, message: "down" } });
    const after = (await store.getForCall("s-4"))!.session;
    expect(after.counts).toEqual({ llm_calls: 1, prompt_tokens: 5, completion_tokens: 3, cached_tokens: 0 });
    expect(after.lost_calls.count).toBe(1);
    expect(await store.reassign("s-4", "0:0", { ...assignment, dp_rank: 1 }, "0:1")).toBe(true);
    // A second mover that read it on rank 0 too moves nothing.
    expect(await store.reassign("s-4", "0:0", { ...assignment, dp_rank: 2 }, "0:2")).toBe(false);
    expect((await store.getForCall("s-4"))!.session.assignment?.dp_rank).toBe(1);
    await store.close("s-4", new Date());
    const closed = (await store.getForCall("s-4", { takeSeq: true }))!;
    expect(closed.session.state).toBe("closed");
    expect(closed.seq).toBeUndefined();
    // Nor by a call that read the session open just before the close: its number would come after the close's count of pending calls.
    expect(await store.nextSeq("s-4")).toBeNull();
    expect(await store.nextSeq("s-missing")).toBeNull();
    expect(await redis.exists(`${prefix}-s4:{s:s-missing}:session`)).toBe(0);
  });

  it("counts lost calls and keeps the first cause; an unverified note counts only with the session's own token", async () => {
    const store = new SessionStore(redis, `${prefix}-s3`);
    await store.create("s-3", session("s-3"), hashToken("good"), assignment, "0:0", new Date());
    expect((await store.get("s-3"))!.lost_calls).toEqual({ count: 0, first: null });
    const cause = (kind: string) => ({ at: new Date().toISOString(), kind, status: 502, message: `${kind} happened` });
    expect(await store.noteLostCalls("s-3", { count: 1, first: cause("engine_unreachable") })).toBe(true);
    expect(await store.noteLostCalls("s-3", { count: 2, first: cause("engine_rejected") })).toBe(true);
    expect(await store.noteLostCalls("s-3", { count: 1, first: cause("storage_unavailable") }, hashToken("someone else"))).toBe(false);
    expect(await store.noteLostCalls("s-3", { count: 1, first: cause("storage_unavailable") }, hashToken("good"))).toBe(true);
    expect(await store.noteLostCalls("no-such-session", { count: 1, first: cause("x") })).toBe(false);
    const { lost_calls } = (await store.get("s-3"))!;
    expect(lost_calls.count).toBe(4);
    expect(lost_calls.first).toMatchObject({ kind: "engine_unreachable", status: 502, message: "engine_unreachable happened" });
    expect(await store.get("no-such-session")).toBeNull();
  });
});

const taskInput = (id: string, extra: Record<string, unknown> = {}) =>
  Task.parse({ id, instruction: "do it", agent: { harness: "command", command: ["true"] }, limits: { timeout_s: 5 }, ...extra }) as AcceptedTask;

const resultOf = (id: string, status: TaskResult["status"]): TaskResult => ({
  id,
  group_id: null,
  status,
  reward: status === "completed" ? 1 : null,
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

describe("TaskStore", () => {
  it("creates a task once; later submissions of the same id change nothing", async () => {
    const store = new TaskStore(redis, `${prefix}-t1`);
    expect(await store.create(taskInput("t-1"), new Date())).toBe(true);
    expect(await store.create({ ...taskInput("t-1"), instruction: "other" }, new Date())).toBe(false);
    const rec = (await store.get("t-1"))!;
    expect(rec.status).toBe("queued");
    expect(rec.task.instruction).toBe("do it");
    expect(rec.callback.state).toBe("none");
    expect(await store.get("t-missing")).toBeNull();
  });

  it("keeps the first terminal result: a cancel racing a finishing worker yields one result", async () => {
    const store = new TaskStore(redis, `${prefix}-t2`);
    await store.create(taskInput("t-2"), new Date());
    expect(await store.finish("t-2", resultOf("t-2", "cancelled"), new Date(), 60)).toBe(true);
    expect(await store.finish("t-2", resultOf("t-2", "completed"), new Date(), 60)).toBe(false);
    expect((await store.get("t-2"))!.result!.status).toBe("cancelled");
    expect(await store.finish("t-unknown", resultOf("t-unknown", "completed"), new Date(), 60)).toBe(false);
    const events = await store.events("t-2", null);
    expect(events.map((e) => e.type)).toEqual(["queued", "terminal"]);
    expect(await store.events("t-2", events[0]!.id)).toEqual([events[1]]);
  });

  it("never marks an ended task running again (a cancel that won the race stays cancelled)", async () => {
    const store = new TaskStore(redis, `${prefix}-t5`);
    await store.create(taskInput("t-5"), new Date());
    expect(await store.markRunning("t-5", { worker: "w", attempt: 1, sessionId: "s", now: new Date() })).toBe(true);
    expect(await store.finish("t-5", resultOf("t-5", "cancelled"), new Date(), 60)).toBe(true);
    expect(await store.markRunning("t-5", { worker: "w2", attempt: 2, sessionId: "s2", now: new Date() })).toBe(false);
    const rec = (await store.get("t-5"))!;
    expect(rec.status).toBe("cancelled");
    expect(rec.worker).toBe("w");
    expect(await store.markRunning("t-unknown", { worker: "w", attempt: 1, sessionId: "s", now: new Date() })).toBe(false);
  });

  it("puts a running task back in the queue for another attempt, never an ended one", async () => {
    const store = new TaskStore(redis, `${prefix}-t7`);
    await store.create(taskInput("t-6"), new Date());
    expect(await store.requeue("t-6", "s-a", { reason: "lost_call" })).toBe(false);
    await store.markRunning("t-6", { worker: "w", attempt: 1, sessionId: "s-a", now: new Date() });
    expect(await store.requeue("t-6", "s-a", { reason: "lost_call", cause: "engine down" })).toBe(true);
    const rec = (await store.get("t-6"))!;
    expect(rec).toMatchObject({ status: "queued", attempts: 1, session_id: "s-a" });
    const events = await store.events("t-6", null);
    expect(events.map((e) => e.type)).toEqual(["queued", "started", "retrying"]);
    expect(events[2]!.data).toEqual({ reason: "lost_call", cause: "engine down" });
    await store.finish("t-6", resultOf("t-6", "cancelled"), new Date(), 60);
    expect(await store.requeue("t-6", "s-a", { reason: "lost_call" })).toBe(false);
    expect((await store.status("t-6"))).toBe("cancelled");
  });

  it("an attempt that was taken over can neither store its result nor requeue the task", async () => {
    const store = new TaskStore(redis, `${prefix}-t8`);
    await store.create(taskInput("t-8"), new Date());
    await store.markRunning("t-8", { worker: "w1", attempt: 1, sessionId: "s-old", now: new Date() });
    // Another worker takes the task back from the attempt whose lock lapsed, then runs its own.
    expect(await store.requeue("t-8", "s-old", { reason: "worker_lost" })).toBe(true);
    expect(await store.finish("t-8", resultOf("t-8", "completed"), new Date(), 60, null, null, "s-old")).toBe(false);
    await store.markRunning("t-8", { worker: "w2", attempt: 2, sessionId: "s-new", now: new Date() });
    expect(await store.requeue("t-8", "s-old", { reason: "lost_call" })).toBe(false);
    expect(await store.finish("t-8", resultOf("t-8", "completed"), new Date(), 60, null, { type: "evaluating", data: {} }, "s-old")).toBe(false);
    expect(await store.get("t-8")).toMatchObject({ status: "running", session_id: "s-new", result: null });
    // The stale attempt left no event either.
    expect((await store.events("t-8", null)).map((e) => e.type)).toEqual(["queued", "started", "retrying", "started"]);
    // An attempt that stalled before it marked the task running, and got there after the live one
    // did: it does not displace it.
    expect(await store.markRunning("t-8", { worker: "w3", attempt: 2, sessionId: "s-late", now: new Date() })).toBe(false);
    expect(await store.get("t-8")).toMatchObject({ status: "running", session_id: "s-new", worker: "w2" });
    expect(await store.finish("t-8", resultOf("t-8", "completed"), new Date(), 60, null, null, "s-new")).toBe(true);
    expect(await store.status("t-8")).toBe("completed");
  });

  it("an attempt that was taken over writes neither events nor logs; the live attempt does, until the task ends", async () => {
    const store = new TaskStore(redis, `${prefix}-t11`);
    await store.create(taskInput("t-11"), new Date());
    await store.markRunning("t-11", { worker: "w1", attempt: 1, sessionId: "s-old", now: new Date() });
    expect(await store.setLogs("t-11", "old attempt's output", "s-old")).toBe(true);
    expect(await store.appendAttemptEvent("t-11", "s-old", "llm_call", { seq: 0 })).toBe(true);
    // Taken back (its job lock lapsed), then run by another attempt.
    expect(await store.requeue("t-11", "s-old", { reason: "worker_lost" })).toBe(true);
    expect(await store.setLogs("t-11", "stale, between takeover and the new attempt", "s-old")).toBe(false);
    await store.markRunning("t-11", { worker: "w2", attempt: 2, sessionId: "s-new", now: new Date() });
    expect(await store.setLogs("t-11", "new attempt's output", "s-new")).toBe(true);
    // The stalled attempt comes back: its output and its progress are not the task's.
    expect(await store.setLogs("t-11", "stale output", "s-old")).toBe(false);
    expect(await store.appendAttemptEvent("t-11", "s-old", "llm_call", { seq: 1 })).toBe(false);
    expect(await store.appendAttemptEvent("t-11", "s-old", "evaluating", { agent_exit_code: 0 })).toBe(false);
    expect(await store.logs("t-11")).toBe("new attempt's output");
    expect(await store.appendAttemptEvent("t-11", "s-new", "llm_call", { seq: 0 })).toBe(true);
    expect((await store.events("t-11", null)).map((e) => e.type)).toEqual(["queued", "started", "llm_call", "retrying", "started", "llm_call"]);
    // Once ended, nobody's attempt writes (a cancel that ended the task while a worker was stalled).
    await store.finish("t-11", resultOf("t-11", "cancelled"), new Date(), 60);
    expect(await store.setLogs("t-11", "after the end", "s-new")).toBe(false);
    expect(await store.appendAttemptEvent("t-11", "s-new", "llm_call", { seq: 1 })).toBe(false);
    expect(await store.logs("t-11")).toBe("new attempt's output");
  });

  it("lists newest first with filters and a cursor that neither skips nor repeats", async () => {
    const store = new TaskStore(redis, `${prefix}-t3`);
    const t0 = Date.now();
    for (let i = 0; i < 7; i++) {
      // Two tasks share each millisecond, so the cursor must break ties.
      await store.create(taskInput(`t-${i}`, i % 2 === 0 ? { group_id: "g-1" } : {}), new Date(t0 + Math.floor(i / 2)));
    }
    await store.finish("t-3", resultOf("t-3", "completed"), new Date(), 60);
    const seen: string[] = [];
    let cursor: string | undefined;
    do {
      const page = await store.list({ limit: 3, ...(cursor ? { cursor } : {}) });
      seen.push(...page.tasks.map((t) => t.id));
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
    expect(seen.sort()).toEqual(["t-0", "t-1", "t-2", "t-3", "t-4", "t-5", "t-6"]);
    expect(new Set(seen).size).toBe(7);
    const group = await store.list({ limit: 100, groupId: "g-1" });
    expect(group.tasks.map((t) => t.id).sort()).toEqual(["t-0", "t-2", "t-4", "t-6"]);
    const done = await store.list({ limit: 100, status: "completed" });
    expect(done.tasks.map((t) => t.id)).toEqual(["t-3"]);
    expect(done.next_cursor).toBeNull();
  });

  it("announces a group as complete when its last task ends, counting each task once", async () => {
    const store = new TaskStore(redis, `${prefix}-t4`);
    await store.defineGroup("g-2", 3, { url: "http://x", secret: "s" });
    // t-a told twice (a job re-run after its worker died) still counts once.
    const done = [await store.groupTaskFinished("g-2", "t-a", 600), await store.groupTaskFinished("g-2", "t-a", 600), await store.groupTaskFinished("g-2", "t-b", 600)];
    expect(done).toEqual([null, null, null]);
    const delivery = await store.groupTaskFinished("g-2", "t-c", 600);
    expect(delivery).toMatch(/^group-/);
    // Told again (a re-run): the same delivery id, so the queue keeps one delivery job.
    expect(await store.groupTaskFinished("g-2", "t-c", 600)).toBe(delivery);
    await store.defineGroup("g-3", 1, null);
    expect(await store.groupTaskFinished("g-3", "t-d", 600)).toBeNull();
  });

  it("the task index forgets tasks whose records have long expired instead of growing for good", async () => {
    const p = `${prefix}-t10`;
    const store = new TaskStore(redis, p);
    const day = 24 * 3600 * 1000;
    const now = Date.now();
    // Created 10 days ago with a 7-day result TTL: its record is long gone, its index entry was not.
    await store.create(taskInput("t-old"), new Date(now - 10 * day));
    await redis.del(`${p}:{t:t-old}:task`);
    // Created 7.5 days ago: its record may still be there (a task that ran long), so it stays.
    await store.create(taskInput("t-recent"), new Date(now - 7.5 * day));
    await store.create(taskInput("t-new"), new Date(now));
    expect(await store.finish("t-new", resultOf("t-new", "completed"), new Date(now), 7 * 24 * 3600)).toBe(true);
    expect(await store.pruneIndex(7 * 24 * 3600, new Date(now))).toBe(1);
    expect(await redis.zrange(`${p}:{tasks}:index`, "0", "-1")).toEqual(["t-recent", "t-new"]);
    expect((await store.recentStates(10)).indexed).toBe(2);
  });

  it("a group's keys expire with its members' results instead of staying in Redis for good", async () => {
    // The group hash holds the cached group body (every member's result, trajectories included).
    const p = `${prefix}-t9`;
    const store = new TaskStore(redis, p);
    await store.defineGroup("g-9", 2, { url: "http://x", secret: "s" });
    for (const id of ["g-9-0", "g-9-1"]) await store.create(taskInput(id, { group_id: "g-9" }), new Date());
    await store.groupTaskFinished("g-9", "g-9-0", 600);
    await store.groupBody("g-9", () => Promise.resolve("{}"));
    await store.groupTaskFinished("g-9", "g-9-1", 600);
    const groupKeys = [`${p}:{g:g-9}:group`, `${p}:{g:g-9}:tasks`, `${p}:{g:g-9}:finished`];
    for (const key of groupKeys) {
      const ttl = await redis.ttl(key);
      expect(ttl, key).toBeGreaterThan(0);
      expect(ttl, key).toBeLessThanOrEqual(600);
    }
    // A member created again (the group id reused once its tasks expired) is not finished, and
    // the group's cached body is gone.
    await redis.del(`${p}:{t:g-9-0}:task`);
    await store.create(taskInput("g-9-0", { group_id: "g-9" }), new Date());
    expect(await redis.sismember(`${p}:{g:g-9}:finished`, "g-9-0")).toBe(0);
    expect(await redis.hget(`${p}:{g:g-9}:group`, "body")).toBeNull();
  });

  it("lists a group's tasks in member order, however many were created in one millisecond", async () => {
    // The group callback's tasks (and a branch group's rewards) come in this order: member order.
    const store = new TaskStore(redis, `${prefix}-t8`);
    const now = new Date();
    for (let k = 0; k < 12; k++) await store.create(taskInput(`g-8-${k}`, { group_id: "g-8" }), now);
    expect(await store.groupTaskIds("g-8")).toEqual(Array.from({ length: 12 }, (_, k) => `g-8-${k}`));
    // Tasks not named <group>-<k> keep their creation order, after the numbered members.
    await store.create(taskInput("b", { group_id: "g-9" }), now);
    await store.create(taskInput("g-9-1", { group_id: "g-9" }), new Date(now.getTime() + 1));
    await store.create(taskInput("a", { group_id: "g-9" }), new Date(now.getTime() + 2));
    await store.create(taskInput("g-9-0", { group_id: "g-9" }), new Date(now.getTime() + 3));
    expect(await store.groupTaskIds("g-9")).toEqual(["g-9-0", "g-9-1", "b", "a"]);
  });

  it("stores a pending callback with the result, in one step", async () => {
    const store = new TaskStore(redis, `${prefix}-t6`);
    await store.create(taskInput("t-cb"), new Date());
    const pending = { state: "pending" as const, delivery_id: "d-1", attempts: 0, last_error: null, delivered_at: null };
    expect(await store.finish("t-cb", resultOf("t-cb", "completed"), new Date(), 60, pending)).toBe(true);
    expect((await store.get("t-cb"))!.callback).toEqual(pending);
    // A second finish changes nothing, callback state included.
    expect(await store.finish("t-cb", resultOf("t-cb", "failed"), new Date(), 60, { ...pending, delivery_id: "d-2" })).toBe(false);
    expect((await store.get("t-cb"))!.callback.delivery_id).toBe("d-1");
  });
});

describe("Lua scripts (EVALSHA, EVAL when the server lacks one)", () => {
  it("work on a fresh connection, again after SCRIPT FLUSH, and once defined per connection", async () => {
    // A connection no script was ever defined or run on.
    const fresh = new Redis(url);
    try {
      const store = new TaskStore(fresh, `${prefix}-script`);
      await store.create(taskInput("t-s1"), new Date());
      expect(await store.markRunning("t-s1", { worker: "w", attempt: 1, sessionId: "s-1", now: new Date() })).toBe(true);
      expect(await store.requeue("t-s1", "s-1", {})).toBe(true);
      // The server forgets every script (as a restarted or another cluster node would): the same
      // scripts, which this connection has run, still work (the body is sent again on NOSCRIPT).
      await fresh.script("FLUSH");
      expect(await store.markRunning("t-s1", { worker: "w", attempt: 2, sessionId: "s-2", now: new Date() })).toBe(true);
      expect(await store.requeue("t-s1", "s-2", {})).toBe(true);
      expect(await store.status("t-s1")).toBe("queued");
      // A second store on the same connection uses the same commands.
      const again = new TaskStore(fresh, `${prefix}-script`);
      expect(await again.markRunning("t-s1", { worker: "w", attempt: 3, sessionId: "s-3", now: new Date() })).toBe(true);
      expect(await again.finish("t-s1", resultOf("t-s1", "completed"), new Date(), 60)).toBe(true);
      expect(await store.finish("t-s1", resultOf("t-s1", "failed"), new Date(), 60)).toBe(false);
    } finally {
      fresh.disconnect();
    }
  });

  it("answer binary values on an auto-pipelined connection (the gateway's), before and after SCRIPT FLUSH", async () => {
    const piped = new Redis(url, { enableAutoPipelining: true });
    try {
      const store = new SessionStore(piped, `${prefix}-piped`);
      await store.create("s-p", session("s-p"), hashToken("t"), assignment, "0:0", new Date());
      const record: CompletionRecord = {
        id: "c0", session_id: "s-p", seq: 0, created_at: new Date().toISOString(), protocol: "openai_chat", engine: "http://e", dp_rank: 0, weight_version: null,
        request: { messages: [{ role: "user", content: "x" }], sampling: {} }, prompt_ids: [1, 2], output_ids: [3], output_logprobs: [-0.5], finish_reason: "stop",
        message: { content: "y", reasoning: null, tool_calls: [] }, usage: { prompt_tokens: 2, completion_tokens: 1, cached_tokens: 0 }, latency_ms: 1,
      };
      await store.appendRecord(record, { id: "c0", seq: 0, message: record.message, finish_reason: "stop", message_count: 1, conversation_key: "k" });
      expect((await store.record("s-p", 0))?.output_ids).toEqual([3]);
      await piped.script("FLUSH");
      expect((await store.record("s-p", 0))?.prompt_ids).toEqual([1, 2]);
    } finally {
      piped.disconnect();
    }
  });
});
