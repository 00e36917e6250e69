/**
 * A task's `llm_call` events are its live attempt's: a call on the session of an attempt another
 * attempt took over (its worker stalled past its job lock, then came back) is recorded in that
 * session, but is not the task's progress. Real engine-sim, gateway and Redis; the attempts are
 * written with the store's own calls, as their workers write them.
 */
import { TaskStore } from "@rollgate/store";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TEST_REDIS_URL, startHarness, type Harness } from "./__fixtures__/harness.js";

let h: Harness;
let redis: Redis;
let tasks: TaskStore;

beforeAll(async () => {
  h = await startHarness("attempt-events");
  redis = new Redis(TEST_REDIS_URL);
  tasks = new TaskStore(redis, h.prefix);
});

afterAll(async () => {
  redis.disconnect();
  await h?.close();
});

/** A session of the task's attempt `attempt`, as a worker opens it. */
async function attemptSession(taskId: string, attempt: number): Promise<{ id: string; token: string }> {
  const res = await fetch(`${h.url}/v1/sessions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ metadata: { task_id: taskId, attempt } }),
  });
  expect(res.status).toBe(201);
  return (await res.json()) as { id: string; token: string };
}

/** One call, then the session's close (which waits for the call's record and event to be written). */
async function callAndClose(s: { id: string; token: string }): Promise<void> {
  const res = await fetch(`${h.url}/s/${s.id}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${s.token}` },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 4 }),
  });
  expect(res.status).toBe(200);
  await res.text();
  expect((await fetch(`${h.url}/v1/sessions/${s.id}/close`, { method: "POST" })).status).toBe(200);
}

describe("llm_call events", () => {
  it("come from the live attempt's session only, not from one taken over", async () => {
    await tasks.create({ id: "t-stale", instruction: "x", agent: { harness: "command", command: ["true"] } } as never, new Date());
    const old = await attemptSession("t-stale", 1);
    await tasks.markRunning("t-stale", { worker: "w-stalled", attempt: 1, sessionId: old.id, now: new Date() });
    // The stalled worker's lock lapsed: another worker takes the task back and runs attempt 2.
    expect(await tasks.requeue("t-stale", old.id, { reason: "worker_lost" })).toBe(true);
    const live = await attemptSession("t-stale", 2);
    await tasks.markRunning("t-stale", { worker: "w-next", attempt: 2, sessionId: live.id, now: new Date() });

    // The stalled agent's call lands before its session is closed: recorded there, not the task's.
    await callAndClose(old);
    expect(await h.records(old.id)).toHaveLength(1);
    await callAndClose(live);
    const types = (await tasks.events("t-stale", null)).map((e) => e.type);
    expect(types).toEqual(["queued", "started", "retrying", "started", "llm_call"]);
  });
});
