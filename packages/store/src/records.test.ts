import { randomUUID } from "node:crypto";
import { CompletionRecord, type RecordHead } from "@rollgate/protocol";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { keys } from "./keys.js";
import { encodeRecord, messageHash, RecordBases } from "./records.js";
import { hashToken, SessionStore } from "./sessions.js";

// Real Redis, a prefix of our own, removed afterwards.
const url = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const prefix = `test-records-${randomUUID().slice(0, 8)}`;
let redis: Redis;

beforeAll(() => {
  redis = new Redis(url);
});
afterAll(async () => {
  const found = await redis.keys(`${prefix}*`);
  if (found.length) await redis.del(...found);
  redis.disconnect();
});

const assignment = { engine: 0, engine_url: "http://e", dp_rank: 0, served_model: "m" };
const head = (r: CompletionRecord): RecordHead => ({ id: r.id, seq: r.seq, message: r.message, finish_reason: r.finish_reason, message_count: r.request.messages.length, conversation_key: `k${r.seq}` });

async function open(p: string, sid: string) {
  const store = new SessionStore(redis, `${prefix}-${p}`);
  await store.create(sid, { sampling: {}, limits: {}, metadata: {} }, hashToken("t"), assignment, "0:0", new Date());
  return store;
}

let seed = 7;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
const ids = (n: number) => Array.from({ length: n }, () => Math.floor(rand() * 151_000));

type Message = CompletionRecord["request"]["messages"][number];

/** An agent's conversation: each call's prompt is the last one's prompt and output plus a tool result. */
function conversation(sid: string, seqs: number[], opts: { system?: number[]; logprob?: () => number; tools?: boolean; reasoning?: boolean } = {}): CompletionRecord[] {
  const out: CompletionRecord[] = [];
  let prompt = [...(opts.system ?? ids(40)), ...ids(20)];
  let messages: Message[] = [
    { role: "system", content: "You are an agent." },
    { role: "user", content: `task of ${sid} ${seqs[0]}` },
  ];
  for (const seq of seqs) {
    const output = ids(16);
    const text = `answer ${seq} ${rand()}`;
    const reasoning = opts.reasoning ? `thinking about call ${seq} of ${sid}` : null;
    const toolCalls = seq % 2 ? [{ id: `call_${sid}_${seq}`, type: "function" as const, function: { name: "shell", arguments: JSON.stringify({ cmd: `ls -la dir${seq}` }) } }] : [];
    const rec: CompletionRecord = {
      id: `c${seq}`,
      session_id: sid,
      seq,
      created_at: new Date(1_700_000_000_000 + seq).toISOString(),
      protocol: "openai_chat",
      engine: "http://e",
      dp_rank: 0,
      weight_version: "v1",
      request: {
        messages,
        sampling: { temperature: 1 },
        ...(opts.tools ? { tools: [{ type: "function", function: { name: "shell", description: "runs a command", parameters: { type: "object" } } }] } : {}),
      },
      prompt_ids: prompt,
      output_ids: output,
      output_logprobs: output.map(opts.logprob ?? (() => -rand() * 5)),
      finish_reason: "stop",
      message: { content: text, reasoning, tool_calls: toolCalls },
      usage: { prompt_tokens: prompt.length, completion_tokens: output.length, cached_tokens: 0 },
      latency_ms: 12,
    };
    out.push(rec);
    prompt = [...prompt, ...output, ...ids(12)];
    // The agent echoes the answer back (every third time reworded: not an echo then).
    const echoed = seq % 3 === 2 ? `${text} (edited)` : text;
    messages = [...messages, { role: "assistant", content: echoed, ...(reasoning ? { reasoning } : {}), ...(toolCalls.length ? { tool_calls: toolCalls } : {}) }, { role: "user", content: `tool output ${seq}` }];
  }
  return out;
}

/** What recordIds answers for a record: its seq and its ids, as typed arrays. */
const idsOf = (r: CompletionRecord) => ({ seq: r.seq, prompt_ids: Int32Array.from(r.prompt_ids), output_ids: Int32Array.from(r.output_ids) });

const storedBytes = async (key: string) => {
  const fields = await redis.hkeys(key);
  let n = 0;
  for (const f of fields) n += await redis.hstrlen(key, f);
  return n;
};

describe("completion records in Redis", () => {
  it("store a conversation's calls as deltas and give back every record exactly, all at once or one by one", async () => {
    const store = await open("a", "s-a");
    const records = conversation("s-a", [0, 1, 2, 3, 4, 5, 6, 7], { tools: true, reasoning: true });
    for (const r of records) await store.appendRecord(r, head(r));
    expect(await store.records("s-a")).toEqual(records);
    // A reader that wrote nothing (another replica) follows the chain of bases in Redis.
    const other = new SessionStore(redis, `${prefix}-a`);
    for (const r of records) expect(await other.record("s-a", r.seq)).toEqual(r);
    expect(await other.record("s-a", 99)).toBeNull();
    // Only the ids (what a token-in continuation reads): the record's own, through its chain.
    for (const r of records) expect(await other.recordIds("s-a", r.seq)).toEqual(idsOf(r));
    expect(await other.recordIds("s-a", 99)).toBeNull();
    // The records as the API sends them are the JSON the previous format gave, key order included.
    const asBefore = records.map((r) => CompletionRecord.parse(JSON.parse(JSON.stringify(r))));
    expect(JSON.stringify(await other.records("s-a")) === JSON.stringify(asBefore)).toBe(true);
    // Each token is stored once: a later call costs what is new in it, not its whole conversation.
    const k = keys(`${prefix}-a`).records("s-a");
    const [second, last] = await Promise.all([redis.hstrlen(k, "1"), redis.hstrlen(k, "7")]);
    expect(last).toBeLessThanOrEqual(second + 8);
    // ...and not the answer it echoes back either.
    const third = (await redis.hgetBuffer(k, "3"))!.toString("latin1");
    expect(third).not.toContain(records[2]!.message.reasoning);
    expect(third).toContain(records[3]!.message.reasoning);
    const second2 = (await redis.hgetBuffer(k, "2"))!.toString("latin1");
    expect(second2).not.toContain("call_s-a_1");
    expect(second2).toContain(records[2]!.message.content);
    const json = records.reduce((a, r) => a + JSON.stringify(r).length, 0);
    expect(await storedBytes(k)).toBeLessThan(json / 2.5);
  });

  it("keeps logprobs exactly as the engine gave them: float32 values in 4 bytes, any other double in 8", async () => {
    const store = await open("b", "s-b");
    const f32 = conversation("s-b", [0], { logprob: () => Math.fround(-rand() * 3) })[0]!;
    const f64 = { ...conversation("s-b", [1], { logprob: () => -rand() * 3 })[0]!, output_logprobs: [] as number[] };
    f64.output_logprobs = f64.output_ids.map((_, i) => [-0.1, -Math.PI, -1e-300, -9999, 0, -0, -Number.MIN_VALUE][i % 7]!);
    await store.appendRecord(f32, head(f32));
    await store.appendRecord(f64, head(f64));
    const [a, b] = await store.records("s-b");
    expect(a!.output_logprobs).toEqual(f32.output_logprobs);
    // -0 reads back as 0, as the JSON records did.
    expect(b!.output_logprobs).toEqual(f64.output_logprobs.map((x) => x + 0));
    expect(Object.is(b!.output_logprobs[5], 0)).toBe(true);
    const k = keys(`${prefix}-b`).records("s-b");
    const [raw32, raw64] = await Promise.all([redis.hstrlen(k, "0"), redis.hstrlen(k, "1")]);
    const out = f32.output_ids.length;
    // Same shape of record otherwise: the float64 one is 4 bytes per output token larger (give or take the JSON).
    expect(raw64 - raw32).toBeGreaterThanOrEqual(4 * out - 64);
  });

  it("read records written before format 2 (plain JSON in the hash), beside new ones", async () => {
    const store = await open("c", "s-c");
    const [old0, old1, new2, new3] = conversation("s-c", [0, 1, 2, 3], {
      logprob: () => -rand(),
    });
    const k = keys(`${prefix}-c`).records("s-c");
    // What the previous format wrote: HSET seq → the record's JSON.
    await redis.hset(k, "0", JSON.stringify(old0), "1", JSON.stringify(old1));
    await store.appendRecord(new2!, head(new2!));
    await store.appendRecord(new3!, head(new3!));
    expect(await store.records("s-c")).toEqual([old0, old1, new2, new3]);
    expect(await store.record("s-c", 1)).toEqual(old1);
    expect(await store.record("s-c", 3)).toEqual(new3);
    for (const r of [old1!, new3!]) expect(await store.recordIds("s-c", r.seq)).toEqual(idsOf(r));
    expect((await redis.hgetBuffer(k, "3"))![0]).toBe(2);
  });

  it("pick the base sharing the longest prefix when conversations interleave, whatever order calls finish in", async () => {
    const store = await open("d", "s-d");
    const system = ids(50);
    // A main agent and three sub-agents with the same system prompt, taking turns; some calls finish out of order.
    const convs = [0, 1, 2, 3].map((c) => conversation("s-d", [c, c + 4, c + 8, c + 12], { system }));
    const all = convs.flat().sort((a, b) => a.seq - b.seq);
    const order = [...all];
    for (const i of [1, 6, 9]) [order[i], order[i + 1]] = [order[i + 1]!, order[i]!];
    for (const r of order) await store.appendRecord(r, head(r));
    expect(await store.records("s-d")).toEqual(all);
    const fresh = new SessionStore(redis, `${prefix}-d`);
    for (const seq of [15, 14, 9]) expect(await fresh.record("s-d", seq)).toEqual(all[seq]);
    // Each record extends its own conversation's last call.
    const k = keys(`${prefix}-d`).records("s-d");
    const base = async (seq: number) => {
      const raw = (await redis.hgetBuffer(k, String(seq)))!;
      return raw.toString("latin1", 1, raw.indexOf(";"));
    };
    const later = all.slice(4).map((r) => r.seq);
    expect(await Promise.all(later.map(base))).toEqual(later.map((s) => String(s - 4)));
  });

  it("remember recent records within a byte budget, least recently written sessions dropped first", () => {
    const bases = new RecordBases(8, 3000);
    const cand = (seq: number, n: number) => ({ seq, id: `c${seq}`, ids: new Int32Array(n), promptLength: n, messages: [], rest: "", answer: { content: null, reasoning: null, tool_calls: null } });
    bases.add("a", cand(0, 200));
    bases.add("b", cand(0, 200));
    bases.add("a", cand(1, 300), 0); // a's call 1 holds all of call 0: it replaces it
    expect(bases.of("a").map((c) => c.seq)).toEqual([1]);
    bases.add("c", cand(0, 300));
    // 3 × (ids + bookkeeping) is over the budget: b, written least recently, goes.
    expect(bases.of("b")).toEqual([]);
    expect(bases.of("a").length + bases.of("c").length).toBe(2);
    expect(bases.heldBytes).toBeLessThanOrEqual(3000);
    bases.drop("a");
    bases.drop("c");
    expect(bases.heldBytes).toBe(0);
  });

  it("keep routed experts, replays, reroutes and pause fields", async () => {
    const store = await open("e", "s-e");
    const [r0, r1] = conversation("s-e", [0, 1]);
    const rich: CompletionRecord = {
      ...r1!,
      rerouted_from: { engine: 1, dp_rank: 2 },
      output_weight_versions: r1!.output_ids.map((_, i) => (i < 4 ? "v1" : "v2")),
      continued_after_pause: 1,
      routed_experts: { layers: 2, topk: 2, width: 4, data: Buffer.from(new Int32Array([1, 2, 3, 4, -1, -1, -1, -1]).buffer).toString("base64") },
      replayed_from: "cmpl-source-1",
    };
    await store.appendRecord(r0!, head(r0!));
    await store.appendRecord(rich, head(rich));
    expect(await store.records("s-e")).toEqual([r0, rich]);
    expect(await new SessionStore(redis, `${prefix}-e`).record("s-e", 1)).toEqual(rich);
  });

  it("store a record with ids beyond int32 as JSON, and a session closed and deleted leaves nothing behind", async () => {
    const store = await open("f", "s-f");
    const [r0, r1] = conversation("s-f", [0, 1]);
    const huge = { ...r1!, prompt_ids: [...r1!.prompt_ids, 2 ** 40] };
    await store.appendRecord(r0!, head(r0!));
    await store.appendRecord(huge, head(huge));
    expect(await store.records("s-f")).toEqual([r0, huge]);
    expect(await store.delete("s-f", new Date())).toBe(true);
    expect(await store.records("s-f")).toEqual([]);
  });

  it("a replica remembering records of a session since deleted and made again under its id stores the new one whole", async () => {
    const a = await open("h", "s-h");
    const b = new SessionStore(redis, `${prefix}-h`);
    const [old0] = conversation("s-h", [0]);
    await a.appendRecord(old0!, head(old0!));
    // Another replica deletes the session and a new one of the same id records other calls.
    expect(await b.delete("s-h", new Date())).toBe(true);
    await b.create("s-h", { sampling: {}, limits: {}, metadata: {} }, hashToken("t2"), assignment, "0:0", new Date());
    const [new0, new1] = conversation("s-h", [0, 1], { system: old0!.prompt_ids.slice(0, 40) });
    const other0 = { ...new0!, id: "c0-second-life", prompt_ids: old0!.prompt_ids };
    await b.appendRecord(other0, head(other0));
    // `a` would extend its own record 0, which is no longer there.
    const next = { ...new1!, prompt_ids: [...old0!.prompt_ids, ...old0!.output_ids, 7, 8, 9] };
    await a.appendRecord(next, head(next));
    expect(await a.records("s-h")).toEqual([other0, next]);
    expect(await b.record("s-h", 1)).toEqual(next);
  });

  it("answer a record's ids from what this process wrote only for that very record: evicted, another replica's or another life of the session read from Redis", async () => {
    const a = await open("i", "s-i");
    const records = conversation("s-i", [0, 1, 2]);
    for (const r of records) await a.appendRecord(r, head(r));
    const k = keys(`${prefix}-i`).records("s-i");
    const stored = await redis.hgetallBuffer(k);
    // The last record is remembered (it is the base of the next call): answered without Redis.
    await redis.del(k);
    const got = (await a.recordIds("s-i", 2, "c2"))!;
    expect(got).toEqual(idsOf(records[2]!));
    // The caller's own copy: changing it changes nothing remembered.
    got.prompt_ids[0] = -1;
    got.output_ids[0] = -1;
    expect(await a.recordIds("s-i", 2, "c2")).toEqual(idsOf(records[2]!));
    // Not remembered (superseded by the record extending it) or not asked by id: read from Redis, which has none now.
    expect(await a.recordIds("s-i", 1, "c1")).toBeNull();
    expect(await a.recordIds("s-i", 2)).toBeNull();
    // Another record at that seq (the session deleted and made again under its id): not the remembered one.
    expect(await a.recordIds("s-i", 2, "c2-second-life")).toBeNull();
    for (const [seq, v] of Object.entries(stored)) await redis.hset(k, seq, v);
    const b = new SessionStore(redis, `${prefix}-i`);
    await b.delete("s-i", new Date());
    await b.create("s-i", { sampling: {}, limits: {}, metadata: {} }, hashToken("t2"), assignment, "0:0", new Date());
    const [, , again] = conversation("s-i", [0, 1, 2]);
    const second = { ...again!, id: "c2-second-life" };
    await b.appendRecord(second, head(second));
    expect(await a.recordIds("s-i", 2, "c2-second-life")).toEqual(idsOf(second));
    // Another replica's record: read from Redis by `a`, from memory by `b`.
    const [, , , next] = conversation("s-i", [0, 1, 2, 3]);
    await b.appendRecord(next!, head(next!));
    expect(await a.recordIds("s-i", 3, "c3")).toEqual(idsOf(next!));
    expect(await b.recordIds("s-i", 3, "c3")).toEqual(idsOf(next!));
    // A session this process deleted is forgotten.
    await b.delete("s-i", new Date());
    expect(await b.recordIds("s-i", 3, "c3")).toBeNull();
  });

  it("a record whose memory the byte budget dropped is read from Redis, exactly", async () => {
    const store = new SessionStore(redis, `${prefix}-j`, { baseCacheBytes: 4096 });
    for (const sid of ["s-j1", "s-j2"]) await store.create(sid, { sampling: {}, limits: {}, metadata: {} }, hashToken("t"), assignment, "0:0", new Date());
    const one = conversation("s-j1", [0, 1], { system: ids(600) });
    const two = conversation("s-j2", [0, 1], { system: ids(600) });
    for (const r of [...one, ...two]) await store.appendRecord(r, head(r));
    // s-j1's records no longer fit beside s-j2's: its last one is read through its chain.
    const k = keys(`${prefix}-j`).records("s-j1");
    expect((await redis.hgetBuffer(k, "1"))!.toString("latin1", 0, 3)).toBe("\x020;");
    expect(await store.recordIds("s-j1", 1, "c1")).toEqual(idsOf(one[1]!));
    await redis.del(k);
    expect(await store.recordIds("s-j1", 1, "c1")).toBeNull();
    expect(await store.recordIds("s-j2", 1, "c1")).toEqual(idsOf(two[1]!));
  });

  it("a corrupt stored record is an error naming it, not a guess", async () => {
    const store = await open("g", "s-g");
    const [r0, r1] = conversation("s-g", [0, 1]);
    await store.appendRecord(r0!, head(r0!));
    await store.appendRecord(r1!, head(r1!));
    const k = keys(`${prefix}-g`).records("s-g");
    await redis.hdel(k, "0");
    await expect(store.records("s-g")).rejects.toThrow(/record 1 of session s-g extends record 0, which is missing/);
    await expect(store.recordIds("s-g", 1)).rejects.toThrow(/record 1 of session s-g extends record 0, which is missing/);
    const raw = (await redis.hgetBuffer(k, "1"))!;
    await redis.hset(k, "1", raw.subarray(0, raw.length - 3));
    await redis.hset(k, "0", JSON.stringify(r0));
    await expect(store.records("s-g")).rejects.toThrow(/stored record 1 of session s-g is corrupt/);
    await expect(store.recordIds("s-g", 1)).rejects.toThrow(/stored record 1 of session s-g is corrupt/);
  });
});

describe("messageHash", () => {
  // A delta takes the base's messages while their hashes agree: equal hashes must mean equal JSON.
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
  const texts = ["", "ls -la", "a\"b\\c\n\t\u0001", "\u00e9t\u00e9 \u4e2d\u6587", "\ud83d\ude00 ok", "\ud800", "\udc00", "\ud801", "\ud800\udc00", "s3:abc", "}{[]", "k1:a"];
  const leaf = (): unknown => pick<() => unknown>([() => pick(texts), () => pick(texts) + pick(texts), () => pick([0, -0, 1, 1.5, -2e-300, NaN, Infinity]), () => pick([true, false, null]), () => undefined])();
  const value = (depth: number): unknown => {
    if (depth <= 0 || rand() < 0.35) return leaf();
    if (rand() < 0.4) return Array.from({ length: Math.floor(rand() * 4) }, () => value(depth - 1));
    const o: Record<string, unknown> = {};
    for (let i = Math.floor(rand() * 4); i > 0; i--) o[pick(["role", "content", "name", "tool_calls", "\ud800", "k1:a", "s3"])] = value(depth - 1);
    return o;
  };
  /** The same value, or one changed a little: a leaf swapped, a key order, a key added or dropped. */
  const variant = (v: unknown): unknown => {
    if (rand() < 0.3) return rand() < 0.5 ? leaf() : structuredClone(v);
    if (Array.isArray(v)) return rand() < 0.2 ? [...v, leaf()] : v.map((x) => (rand() < 0.5 ? variant(x) : x));
    if (v && typeof v === "object") {
      const entries = Object.entries(v).map(([k, x]) => [k, rand() < 0.5 ? variant(x) : x] as const);
      if (rand() < 0.2) entries.reverse();
      if (rand() < 0.2) entries.pop();
      return Object.fromEntries(entries);
    }
    return rand() < 0.5 ? v : leaf();
  };

  it("is equal for two messages exactly when their JSON is", () => {
    let equal = 0;
    for (let i = 0; i < 20_000; i++) {
      const a = value(4);
      if (a === undefined || typeof a !== "object" || a === null) continue;
      const b = variant(a);
      if (b === undefined) continue;
      const same = JSON.stringify(a) === JSON.stringify(b);
      if (same) equal++;
      expect(messageHash(a) === messageHash(b), `${JSON.stringify(a)} vs ${JSON.stringify(b)}`).toBe(same);
    }
    // Both outcomes were tried, many times.
    expect(equal).toBeGreaterThan(2000);
    // Strings that only differ in a lone surrogate (the same UTF-8), and values JSON writes alike.
    expect(messageHash({ content: "\ud800" })).not.toBe(messageHash({ content: "\ud801" }));
    expect(messageHash({ content: "\ud800" })).not.toBe(messageHash({ content: "\ufffd" }));
    expect(messageHash({ ["\ud800"]: 1 })).not.toBe(messageHash({ ["\udc00"]: 1 }));
    expect(messageHash({ a: [undefined, NaN], b: undefined, c: -0 })).toBe(messageHash({ a: [null, null], c: 0 }));
    expect(messageHash({ at: new Date(0) })).toBe(messageHash({ at: new Date(0) }));
    expect(messageHash({ at: new Date(0) })).not.toBe(messageHash({ at: new Date(1) }));
  });

  it("keeps apart, in a delta, messages whose text differs only in a lone surrogate", async () => {
    const store = await open("k", "s-k");
    const [r0, r1] = conversation("s-k", [0, 1]);
    const lone = (r: CompletionRecord, c: string): CompletionRecord => ({ ...r, request: { ...r.request, messages: [{ role: "user", content: c }, ...r.request.messages.slice(1)] } });
    const a = lone(r0!, "see \ud800 here");
    const b = lone(r1!, "see \udbff here");
    await store.appendRecord(a, head(a));
    await store.appendRecord(b, head(b));
    const [x, y] = await new SessionStore(redis, `${prefix}-k`).records("s-k");
    expect(JSON.stringify(x!.request.messages[0])).toBe(JSON.stringify(a.request.messages[0]));
    expect(JSON.stringify(y!.request.messages[0])).toBe(JSON.stringify(b.request.messages[0]));
    // Record 1 is still a delta of record 0 (its ids), only without its first message.
    const raw = (await redis.hgetBuffer(keys(`${prefix}-k`).records("s-k"), "1"))!.toString("latin1");
    expect(raw.startsWith("\x020;")).toBe(true);
    expect(raw).toContain('"m":0');
  });
});

describe("format 2's bytes", () => {
  // Stored records are read by every later version: the encoding may get cheaper, never different.
  const first: CompletionRecord = {
    id: "c0",
    session_id: "s",
    seq: 0,
    created_at: "2023-11-14T22:13:20.000Z",
    protocol: "openai_chat",
    engine: "http://e",
    dp_rank: 0,
    weight_version: "v1",
    request: { messages: [{ role: "system", content: "You are an agent." }, { role: "user", content: "list the files, then say which is largest" }], sampling: { max_tokens: 16 } },
    prompt_ids: [1, 2, 3, 70000],
    output_ids: [5, -6],
    output_logprobs: [-0.5, -0],
    finish_reason: "stop",
    message: { content: "the largest file is notes.txt", reasoning: null, tool_calls: [] },
    usage: { prompt_tokens: 4, completion_tokens: 2, cached_tokens: 0 },
    latency_ms: 12,
  };
  const le = (width: number, write: (b: Buffer, x: number, at: number) => unknown) => (...xs: number[]) => {
    const b = Buffer.alloc(width * xs.length);
    xs.forEach((x, i) => write(b, x, width * i));
    return b;
  };
  const u32 = le(4, (b, x, at) => b.writeUInt32LE(x, at));
  const i32 = le(4, (b, x, at) => b.writeInt32LE(x, at));
  const f32 = le(4, (b, x, at) => b.writeFloatLE(x, at));
  const f64 = le(8, (b, x, at) => b.writeDoubleLE(x, at));
  const stored = (headText: string, meta: string, tail: Buffer[]) => Buffer.concat([Buffer.from(headText, "latin1"), u32(Buffer.byteLength(meta)), Buffer.from(meta), ...tail]);
  const { id: _i, prompt_ids: _p, output_ids: _o, output_logprobs: _l, ...rest } = first;

  it("a whole record: its JSON part, then its ids and float32 logprobs (-0 kept), little-endian", () => {
    const meta = `{"i":"c0","r":${JSON.stringify(rest)}}`;
    const tail = [u32(4, 2), Buffer.from([4]), i32(1, 2, 3, 70000, 5, -6), f32(-0.5, -0)];
    expect(encodeRecord(first, []).value).toEqual(stored("\x02;", meta, tail));
  });

  it("a delta of it: the ids and messages it adds, its echo of the base's answer, float64 logprobs, keys in the record's order", () => {
    const base = encodeRecord(first, []).candidate!;
    const next: CompletionRecord = {
      ...first,
      id: "c1",
      seq: 1,
      request: { ...first.request, messages: [...first.request.messages, { role: "assistant", content: "the largest file is notes.txt" }, { role: "user", content: "thanks" }] },
      prompt_ids: [1, 2, 3, 70000, 5, -6, 9],
      output_ids: [10],
      output_logprobs: [-0.1],
      rerouted_from: { engine: 0, dp_rank: 1 },
    };
    const request = { messages: [{ role: "assistant", content: null }, { role: "user", content: "thanks" }] };
    const meta = `{"i":"c1","d":{"p":6,"m":2,"r":1,"e":[[0,"content","content"]]},"r":${JSON.stringify({ ...rest, seq: 1, request, rerouted_from: { engine: 0, dp_rank: 1 } })}}`;
    const tail = [u32(1, 1), Buffer.from([8]), i32(9, 10), f64(-0.1)];
    expect(encodeRecord(next, [base]).value).toEqual(stored("\x020;", meta, tail));
  });
});
