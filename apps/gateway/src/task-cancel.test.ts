/**
 * Cancelling a task no worker is running (DELETE /v1/tasks/:id answers 200 `cancelled`): what the
 * gateway ends itself. Real engine-sim, gateway and Redis; the attempt a dead or stalled worker
 * left behind is written with the store's own calls, as that worker wrote it.
 */
import { TaskStore } from "@rollgate/store";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TEST_REDIS_URL, startHarness, type Harness } from "./__fixtures__/harness.js";

const RESULT_TTL_S = 3600;
let h: Harness;
let redis: Redis;
let tasks: TaskStore;

beforeAll(async () => {
  // The TTL the workers are given too (not the default): the gateway must keep what it ends as long.
  h = await startHarness("task-cancel", {}, { ROLLGATE_RESULT_TTL_S: String(RESULT_TTL_S) });
  redis = new Redis(TEST_REDIS_URL);
  tasks = new TaskStore(redis, h.prefix);
});

afterAll(async () => {
  redis.disconnect();
  await h?.close();
});

const submit = async (id: string) => {
  const res = await fetch(`${h.url}/v1/tasks`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ id, instruction: "x", agent: { harness: "command", command: ["true"] } }),
  });
  expect(res.status).toBe(202);
};

const chat = (s: { id: string; token: string }) =>
  fetch(`${h.url}/s/${s.id}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${s.token}` },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 4 }),
  });

describe("DELETE /v1/tasks/:id of a task no worker runs", () => {
  it("closes the session its last attempt left open (a worker that died or stalled past its job lock): its agent can write no more", async () => {
    await submit("orphaned");
    // Attempt 1 opened a session, was marked running, made a call, and its worker went away: the
    // job is back in the queue (waiting), the task still `running` on that session.
    const s = await h.openSession();
    expect(await tasks.markRunning("orphaned", { worker: "w-gone", attempt: 1, sessionId: s.id, now: new Date() })).toBe(true);
    expect((await chat(s)).status).toBe(200);

    const res = await fetch(`${h.url}/v1/tasks/orphaned`, { method: "DELETE" });
    expect(await res.json()).toEqual({ id: "orphaned", status: "cancelled" });

    const session = (await (await fetch(`${h.url}/v1/sessions/${s.id}`)).json()) as { state: string; closed_at: string | null };
    expect(session.state).toBe("closed");
    expect(session.closed_at).not.toBeNull();
    // The orphaned agent's next call is refused, and the session keeps the one call it made.
    const late = await chat(s);
    expect(late.status).toBe(403);
    expect(await h.records(s.id)).toHaveLength(1);
    expect((await tasks.get("orphaned"))?.status).toBe("cancelled");
  });

  it("a task cancelled while queued, never started, has no session to close and ends cancelled", async () => {
    await submit("never-started");
    const res = await fetch(`${h.url}/v1/tasks/never-started`, { method: "DELETE" });
    expect(await res.json()).toEqual({ id: "never-started", status: "cancelled" });
    expect((await tasks.get("never-started"))?.result?.session_id).toBeNull();
  });

  it("keeps what it ended for the configured ROLLGATE_RESULT_TTL_S, as the workers keep theirs, not a fixed 7 days", async () => {
    await submit("ttl");
    expect((await fetch(`${h.url}/v1/tasks/ttl`, { method: "DELETE" })).status).toBe(200);
    const ttl = await redis.ttl(`${h.prefix}:{t:ttl}:task`);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(RESULT_TTL_S);
    expect(await redis.ttl(`${h.prefix}:{t:ttl}:events`)).toBeLessThanOrEqual(RESULT_TTL_S);
  });
});
