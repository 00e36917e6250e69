import { randomUUID } from "node:crypto";
import type { AcceptedTask, CompletionRecord } from "@rollgate/protocol";
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
  const found = await redis.keys(`${prefix}:*`);
  if (found.length) await redis.del(...found);
  redis.disconnect();
});

const members = ["0:0", "0:1", "1:0"];
const session = (id: string) => ({ sampling: {}, limits: {}, metadata: {}, id });
const assignment = { engine: 0, engine_url: "http://e", dp_rank: 0, served_model: "m" };

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
    expect(await store.create("s-1", session("s-1"), hashToken(token), assignment, member, new Date())).toBe(true);
    expect(await store.create("s-1", session("s-1"), hashToken("other"), assignment, member, new Date())).toBe(false);
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

  it("orders records by the sequence reserved when their call started and counts usage", async () => {
    const store = new SessionStore(redis, `${prefix}-s2`);
    await store.create("s-2", session("s-2"), hashToken("t"), assignment, "0:0", new Date());
    const seqs = await Promise.all([store.nextSeq("s-2"), store.nextSeq("s-2")]);
    expect(seqs.sort()).toEqual([0, 1]);
    const rec = (seq: number): CompletionRecord => ({
      id: `c${seq}`,
      session_id: "s-2",
      seq,
      created_at: new Date().toISOString(),
      protocol: "openai_chat",
      engine: "http://e",
      dp_rank: 0,
      weight_version: null,
      request: { messages: [{ role: "user", content: "x" }], sampling: {} },
      prompt_ids: [1],
      output_ids: [2],
      output_logprobs: [-1],
      finish_reason: "stop",
      message: { content: "y", reasoning: null, tool_calls: [] },
      usage: { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 1 },
      latency_ms: 1,
    });
    // The later call finishes first: order still follows seq.
    await store.appendRecord(rec(1));
    await store.appendRecord(rec(0));
    expect((await store.records("s-2")).map((r) => r.id)).toEqual(["c0", "c1"]);
    expect((await store.get("s-2"))!.counts).toEqual({ llm_calls: 2, prompt_tokens: 2, completion_tokens: 2, cached_tokens: 2 });
    expect(await store.delete("s-2", new Date())).toBe(true);
    expect(await store.get("s-2")).toBeNull();
    expect(await store.records("s-2")).toEqual([]);
  });
});

describe("TaskStore", () => {
  it("creates a task once; later submissions of the same id change nothing", async () => {
    const store = new TaskStore(redis, `${prefix}-t1`);
    const task = {
      id: "t-1",
      instruction: "do it",
      agent: { harness: "command", command: ["true"], args: [], env: {} },
      runtime: { kind: "local", files: {}, prepare: [], image: null },
      evaluator: null,
      sampling: {},
      limits: { timeout_s: 5 },
      trajectory: { builder: "prefix_merging" },
      callback: null,
      metadata: {},
    } as AcceptedTask;
    expect(await store.create(task, new Date())).toBe(true);
    expect(await store.create({ ...task, instruction: "other" }, new Date())).toBe(false);
    const rec = (await store.get("t-1"))!;
    expect(rec.status).toBe("queued");
    expect(rec.task.instruction).toBe("do it");
    expect(rec.callback.state).toBe("none");
    expect(await store.get("t-missing")).toBeNull();
  });
});
