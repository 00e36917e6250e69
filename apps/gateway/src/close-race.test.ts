/**
 * A session closed while one of its calls is between its session check and the number it takes.
 * Close reads, in one step, how many calls are pending and waits for those; a call that takes its
 * number after the close must therefore be refused, or the close's trajectory (the one the rollout
 * is scored with) would miss a call the agent was answered, and nothing would say so.
 *
 * Calls take their number apart from the session check when the gateway has not checked the
 * session's token before (a replica's first call of the session; also every call when the session
 * rate limit is on, and a branch's calls). The interleaving is made exact on a Redis of this test's own: a script keeps
 * it busy while the call's session read and the close queue up behind it on the gateway's one
 * connection, so the close runs right after the read and before the call's next command.
 */
import { once } from "node:events";
import { connect, type Socket } from "node:net";
import { buildEngineSim } from "@rollgate/engine-sim";
import type { Session, Trajectory } from "@rollgate/protocol";
import { startPrivateRedis, type PrivateRedis } from "@rollgate/testkit";
import type { FastifyInstance } from "fastify";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { gatewayOnRedis, listenLocal } from "./__fixtures__/harness.js";

let redis: PrivateRedis;
let sim: FastifyInstance;
let simUrl: string;
let blocker: Redis;

beforeAll(async () => {
  redis = await startPrivateRedis();
  blocker = new Redis(redis.url);
  sim = buildEngineSim({ dpSize: 1, tpotMs: 2 });
  simUrl = await listenLocal(sim);
}, 30_000);

afterAll(async () => {
  blocker?.disconnect();
  await sim?.close();
  await redis?.stop();
});

const gateway = () => gatewayOnRedis(redis.url, simUrl, "close-race");

/** Keeps the Redis server busy for `ms` (a script runs to its end before any other command). */
function busy(ms: number): Promise<unknown> {
  return blocker.eval(
    `local t = redis.call('TIME'); local s = t[1] * 1000000 + t[2]
     repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - s >= tonumber(ARGV[1]) * 1000
     return 1`,
    0,
    String(ms),
  );
}

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("a session closed while a call is between its session check and its number", () => {
  it("a replica's first call of the session: the call is refused as the session is closed, and the close's trajectory is the whole rollout", async () => {
    const opener = await gateway();
    const app = await gateway();
    try {
      // Opened through another replica: `app` has never checked this session's token.
      const s = (await opener.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
      // Warm the gateway's own connection and caches, so the call's first command is its session read.
      await app.inject({ url: "/readyz" });
      const blocked = busy(400);
      await pause(50);
      const call = app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
        payload: { model: "m", messages: [{ role: "user", content: 'hi\n#sim: [{"text": "answered"}]' }] },
      });
      await pause(50);
      const close = app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close?trajectory=prefix_merging` });
      await blocked;
      const [answered, closed] = await Promise.all([call, close]);
      const atClose = closed.json() as Session & { trajectory: Trajectory };
      expect(atClose.state).toBe("closed");
      // Whatever the agent was told, the rollout's record of it is honest: an answered call is in
      // the close's trajectory (or counted lost); a call not in it was refused.
      if (answered.statusCode === 200) {
        expect(atClose.counts.llm_calls + atClose.lost_calls.count, "an answered call is in the close's counts or lost").toBe(1);
      } else {
        expect(answered.statusCode).toBe(403);
        expect(answered.json().error.code).toBe("session_closed");
      }
      // And nothing is added to the session after its close.
      await pause(100);
      const later = (await app.inject({ url: `/v1/sessions/${s.id}` })).json() as Session;
      expect(later.counts).toEqual(atClose.counts);
      const records = (await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: unknown[] };
      expect(records.completions).toHaveLength(atClose.counts.llm_calls);
      expect(atClose.trajectory.traces).toHaveLength(atClose.counts.llm_calls);
    } finally {
      await app.close();
      await opener.close();
    }
  });
});

describe("a session deleted while a call is in flight, and opened again under its id", () => {
  it("the old call lost after the delete (its agent left while a pause held it) is not charged to the new session", async () => {
    const app = await gateway();
    const url = await listenLocal(app);
    const id = `s-remade-${Date.now()}`;
    const open = async () => (await app.inject({ method: "POST", url: "/v1/sessions", payload: { id } })).json() as { id: string; token: string };
    try {
      const old = await open();
      expect((await app.inject({ method: "POST", url: "/admin/inference/pause", payload: { mode: "drain", timeout_s: 5 } })).statusCode).toBe(200);
      const leave = new AbortController();
      try {
        const held = fetch(`${url}/s/${id}/v1/chat/completions`, {
          method: "POST",
          signal: leave.signal,
          headers: { authorization: `Bearer ${old.token}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "old rollout" }] }),
        }).catch(() => null);
        await pause(150);
        expect((await app.inject({ method: "DELETE", url: `/v1/sessions/${id}` })).statusCode).toBe(204);
        await open();
        // The old rollout's agent gives up on its held call: a lost call, of the old session.
        leave.abort();
        await held;
      } finally {
        expect((await app.inject({ method: "POST", url: "/admin/inference/resume" })).statusCode).toBe(200);
      }
      await pause(200);
      const remade = (await app.inject({ url: `/v1/sessions/${id}` })).json() as Session;
      expect(remade.lost_calls.count).toBe(0);
    } finally {
      await app.inject({ method: "DELETE", url: `/v1/sessions/${id}` });
      await app.close();
    }
  });

  it("the old call's record, stored after the delete, is not the new session's", async () => {
    const app = await gateway();
    const id = `s-remade-${Date.now()}`;
    const open = async () => (await app.inject({ method: "POST", url: "/v1/sessions", payload: { id } })).json() as { id: string; token: string };
    const chat = (s: { id: string; token: string }, text: string, tokens: number) =>
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
        payload: { model: "m", messages: [{ role: "user", content: `${text}\n#sim: ${JSON.stringify([{ text, tokens }])}` }] },
      });
    try {
      const old = await open();
      // The old rollout's call: a long answer, still being generated when its session is dropped.
      const slow = chat(old, "old rollout", 300);
      await pause(150);
      expect((await app.inject({ method: "DELETE", url: `/v1/sessions/${id}` })).statusCode).toBe(204);
      const remade = await open();
      expect(remade.id).toBe(id);
      expect((await chat(remade, "new rollout", 3)).statusCode).toBe(200);
      await slow;
      await pause(100);
      const records = (await app.inject({ url: `/v1/sessions/${id}/completions` })).json() as { completions: { seq: number; request: { messages: { content: string }[] } }[] };
      expect(records.completions.map((r) => r.request.messages[0]!.content.split("\n")[0])).toEqual(["new rollout"]);
      const closed = (await app.inject({ method: "POST", url: `/v1/sessions/${id}/close` })).json() as Session;
      expect(closed.counts.llm_calls).toBe(1);
    } finally {
      await app.inject({ method: "DELETE", url: `/v1/sessions/${id}` });
      await app.close();
    }
  });

  it("the old call ending without a record (its agent left) does not clear the new session's pending call of the same number: the new close waits for it", async () => {
    const app = await gateway();
    const url = await listenLocal(app);
    const id = `s-remade-${Date.now()}`;
    const open = async () => (await app.inject({ method: "POST", url: "/v1/sessions", payload: { id } })).json() as { id: string; token: string };
    const chat = (s: { id: string; token: string }, text: string, tokens: number, signal?: AbortSignal) =>
      fetch(`${url}/s/${s.id}/v1/chat/completions`, {
        method: "POST",
        signal,
        headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: `${text}\n#sim: ${JSON.stringify([{ text, tokens }])}` }] }),
      });
    try {
      const old = await open();
      const leave = new AbortController();
      const slow = chat(old, "old rollout", 300, leave.signal).catch(() => null);
      await pause(100);
      expect((await app.inject({ method: "DELETE", url: `/v1/sessions/${id}` })).statusCode).toBe(204);
      const remade = await open();
      // The new rollout's call 0, still running when its agent's run ends and the session closes.
      const running = chat(remade, "new rollout", 150);
      await pause(50);
      // The old rollout's agent gives up: its call 0 ends without a record.
      leave.abort();
      await slow;
      await pause(50);
      const closing = app.inject({ method: "POST", url: `/v1/sessions/${id}/close?trajectory=prefix_merging` });
      const answered = await running;
      expect(answered.status).toBe(200);
      const closed = (await closing).json() as Session & { trajectory: Trajectory };
      // The close waited for the new call 0 (or counted it lost): its trajectory is not silently short.
      expect(closed.counts.llm_calls + closed.lost_calls.count).toBe(1);
      expect(closed.trajectory.traces).toHaveLength(closed.counts.llm_calls);
    } finally {
      await app.inject({ method: "DELETE", url: `/v1/sessions/${id}` });
      await app.close();
    }
  });
});

describe("the gateway closed while an agent's connection has no request on it", () => {
  it("the gateway ends the connection and its close goes on, not waiting for the agent's client to drop it", async () => {
    const app = await gateway();
    const url = await listenLocal(app);
    // Connections an agent's client ended itself (its FIN) while the close was under way.
    let closing = false;
    const droppedByAgent: number[] = [];
    const accepted = new Map<number, Socket>();
    const seen = new EventTarget();
    app.server.on("connection", (socket: Socket) => {
      accepted.set(socket.remotePort!, socket);
      seen.dispatchEvent(new Event("connection"));
      socket.on("end", () => closing && droppedByAgent.push(socket.remotePort!));
    });
    const s = (await app.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
    // An agent on Node's fetch leaves a call: its client connects again for the aborted request
    // and keeps that connection, unused, until its keep-alive timeout.
    const leave = new AbortController();
    const left = fetch(`${url}/s/${s.id}/v1/chat/completions`, {
      method: "POST",
      signal: leave.signal,
      headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: `leave\n#sim: ${JSON.stringify([{ text: "long", tokens: 300 }])}` }] }),
    }).catch(() => null);
    await pause(100);
    leave.abort();
    await left;
    // And a client that has connected and not yet asked anything; like Node's fetch, it drops an
    // unused connection after 4 s.
    const agent = connect(Number(new URL(url).port), "127.0.0.1");
    agent.on("error", () => {});
    await once(agent, "connect");
    while (!accepted.has(agent.localPort!)) await once(seen, "connection");
    agent.setTimeout(4000);
    const endedBy = Promise.race([once(agent, "end").then(() => "gateway"), once(agent, "timeout").then(() => "agent")]);
    closing = true;
    const closed = app.close();
    try {
      expect(await endedBy, "who ended the unused connection").toBe("gateway");
      await closed;
      expect(droppedByAgent, "connections the close waited for their agents to drop").toEqual([]);
    } finally {
      agent.destroy();
      await closed;
    }
  });
});
