/**
 * Lost calls: an agent call that fails for a reason outside the policy marks its session (the
 * worker then never scores the rollout); a refusal that is the policy's own doing does not. The
 * gateway in-process against an in-process engine-sim on a real port, on the real Redis.
 */
import { getSimState } from "@rollgate/engine-sim";
import type { Session } from "@rollgate/protocol";
import Fastify, { type FastifyInstance } from "fastify";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { listenLocal, startSimFleet, type SimFleet } from "./__fixtures__/harness.js";
import { EngineError } from "./engines/errors.js";
import { lostCallOf } from "./llm/lost-calls.js";

let fleet: SimFleet;
let app: FastifyInstance;

beforeAll(async () => {
  fleet = await startSimFleet("lost", { dpSize: 2 });
  app = await fleet.gateway({ env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
});
afterEach(() => getSimState(fleet.sim).setFault({ mode: "none" }));
afterAll(async () => {
  await app.close();
  await fleet.close();
});

async function open(gw: FastifyInstance = app, body: Record<string, unknown> = {}) {
  const res = await gw.inject({ method: "POST", url: "/v1/sessions", payload: body });
  expect(res.statusCode).toBe(201);
  return res.json() as { id: string; token: string };
}

const session = async (id: string, gw: FastifyInstance = app) => (await gw.inject({ url: `/v1/sessions/${id}` })).json() as Session;

function chat(s: { id: string; token: string }, body: Record<string, unknown>, gw: FastifyInstance = app) {
  return gw.inject({
    method: "POST",
    url: `/s/${s.id}/v1/chat/completions`,
    headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
    payload: JSON.stringify({ messages: [{ role: "user", content: "hi" }], ...body }),
  });
}

describe("lostCallOf", () => {
  const now = new Date("2026-01-01T00:00:00Z");
  it("counts what the gateway or the engine could not serve", () => {
    expect(lostCallOf(new EngineError("engine x is unreachable: ECONNREFUSED", 502, "unreachable"), { status: 502, kind: "engine_unreachable", message: "engine x is unreachable: ECONNREFUSED" }, now)).toEqual({
      at: "2026-01-01T00:00:00.000Z",
      kind: "engine_unreachable",
      status: 502,
      message: "engine x is unreachable: ECONNREFUSED",
    });
    const missingIds = new EngineError("the engine returned no token ids", 502, "bad_response");
    expect(lostCallOf(missingIds, { status: 502, kind: "engine_bad_response", message: missingIds.message }, now)?.kind).toBe("engine_bad_response");
    // The engine has no such model (the served model is wrong): not the policy's doing either.
    const noModel = new EngineError("engine answered 404: The model `m` does not exist.", 404, "rejected");
    expect(lostCallOf(noModel, { status: 404, kind: "engine_rejected", message: noModel.message }, now)?.status).toBe(404);
    // An internal error keeps its real message for the trainer; the agent only saw "internal error".
    expect(lostCallOf(new TypeError("x is undefined"), { status: 500, kind: "internal_error", message: "internal error" }, now)?.message).toBe("x is undefined");
  });

  it("leaves the policy's own refusals alone", () => {
    const tooLong = new EngineError("engine answered 400: maximum context length is 40960 tokens", 400, "rejected");
    expect(lostCallOf(tooLong, { status: 400, kind: "engine_rejected", message: tooLong.message }, now)).toBeNull();
    expect(lostCallOf(new Error("limit"), { status: 400, kind: "session_call_limit", message: "limit" }, now)).toBeNull();
    expect(lostCallOf(new Error("slow down"), { status: 429, kind: "rate_limit_exceeded", message: "slow down" }, now)).toBeNull();
  });
});

describe("agent calls lost to infrastructure", () => {
  it("an unreachable engine: the agent gets 502, not told where the engine is, and the session counts the lost call with its cause", async () => {
    const down = await fleet.gateway({ engines: [{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1, model: "m" }], env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
    try {
      const s = await open(down);
      expect((await session(s.id, down)).lost_calls).toEqual({ count: 0, first: null });
      const whole = await chat(s, {}, down);
      expect(whole.statusCode).toBe(502);
      const streamed = await chat(s, { stream: true }, down);
      expect(streamed.statusCode).toBe(502);
      // The agent runs in a sandbox that is not to learn the cluster's addresses; the trainer's mark names the engine.
      for (const res of [whole, streamed]) {
        expect(res.json().error.message).toMatch(/unreachable/);
        expect(res.body).not.toContain("127.0.0.1");
      }
      const { lost_calls } = await session(s.id, down);
      expect(lost_calls.count).toBe(2);
      expect(lost_calls.first).toMatchObject({ kind: "engine_unreachable", status: 502, message: expect.stringMatching(/^engine http:\/\/127\.0\.0\.1:9 is unreachable/) });
    } finally {
      await down.close();
    }
  });

  it("an engine that leaves out the token ids it was asked for: the call is lost, not recorded", async () => {
    // An older vLLM: an OpenAI answer without token ids (engine-sim always sends them).
    const old = Fastify();
    old.get("/v1/models", async () => ({ data: [{ id: "m" }] }));
    old.post("/v1/chat/completions", async () => ({
      choices: [{ message: { content: "hi" }, finish_reason: "stop", logprobs: { content: [{ token: "hi", logprob: -1 }] } }],
      usage: { prompt_tokens: 3, completion_tokens: 1 },
    }));
    const oldUrl = await listenLocal(old);
    const gw = await fleet.gateway({ engines: [{ kind: "vllm", url: oldUrl, dp_size: 1 }], env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
    try {
      const s = await open(gw);
      expect((await chat(s, {}, gw)).statusCode).toBe(502);
      const { lost_calls, counts } = await session(s.id, gw);
      expect(counts.llm_calls).toBe(0);
      expect(lost_calls).toMatchObject({ count: 1, first: { kind: "engine_bad_response", status: 502, message: expect.stringMatching(/token ids/) } });
    } finally {
      await gw.close();
      await old.close();
    }
  });

  it("an engine answering 503 to every generation, in each protocol", async () => {
    const s = await open();
    // Every rank: a call its rank answers 503 is made again once on another rank, and fails there too.
    getSimState(fleet.sim).setFault({ mode: "down" });
    expect((await chat(s, {})).statusCode).toBeGreaterThanOrEqual(500);
    const anthropic = await app.inject({
      method: "POST",
      url: `/s/${s.id}/v1/messages`,
      headers: { "x-api-key": s.token, "content-type": "application/json" },
      payload: { model: "m", max_tokens: 16, messages: [{ role: "user", content: "hi" }] },
    });
    expect(anthropic.statusCode).toBeGreaterThanOrEqual(500);
    const gemini = await app.inject({
      method: "POST",
      url: `/s/${s.id}/v1beta/models/m:generateContent`,
      headers: { "x-goog-api-key": s.token, "content-type": "application/json" },
      payload: { contents: [{ role: "user", parts: [{ text: "hi" }] }] },
    });
    expect(gemini.statusCode).toBeGreaterThanOrEqual(500);
    const { lost_calls } = await session(s.id);
    expect(lost_calls.count).toBe(3);
    expect(lost_calls.first).toMatchObject({ kind: "engine_rejected", message: expect.stringMatching(/503/) });
  });

  it("a stream the engine cuts after it began: the agent gets an error event, the session a lost call", async () => {
    const s = await open();
    const rank = (await session(s.id)).assignment!.dp_rank;
    getSimState(fleet.sim).setFault({ rank, mode: "disconnect", after_tokens: 2 });
    const res = await chat(s, { stream: true, messages: [{ role: "user", content: `go\n#sim: ${JSON.stringify([{ text: "a long answer", tokens: 40 }])}` }] });
    expect(res.statusCode).toBe(200);
    expect(res.body).toMatch(/"error"/);
    const { lost_calls } = await session(s.id);
    expect(lost_calls.count).toBe(1);
    expect(lost_calls.first?.status).toBeGreaterThanOrEqual(500);
  });

  it("the policy's own refusals are not lost calls: a context too long, a session limit, a bad request", async () => {
    // The refused engine call spends a sequence number: the limit counts it.
    const s = await open(app, { limits: { max_llm_calls: 2 } });
    expect((await chat(s, { max_tokens: 10_000_000 })).statusCode).toBe(400);
    expect((await chat(s, { temperature: "warm" })).statusCode).toBe(400);
    expect((await chat(s, {})).statusCode).toBe(200);
    const overLimit = await chat(s, {});
    expect(overLimit.statusCode).toBe(400);
    expect(overLimit.json().error.code).toBe("session_call_limit");
    expect((await session(s.id)).lost_calls).toEqual({ count: 0, first: null });
  });

  it("a wrong token marks nothing, even on a failing engine", async () => {
    const s = await open();
    const rank = (await session(s.id)).assignment!.dp_rank;
    getSimState(fleet.sim).setFault({ rank, mode: "down" });
    expect((await chat({ id: s.id, token: "not-the-token" }, {})).statusCode).toBe(401);
    expect((await session(s.id)).lost_calls.count).toBe(0);
  });
});

describe("an agent that gives up on its call", () => {
  /** Sends a call from a real client on a real socket and hangs up after `ms`; resolves once it has. */
  async function giveUpAfter(base: string, s: { id: string; token: string }, ms: number): Promise<void> {
    const ac = new AbortController();
    const call = fetch(`${base}/s/${s.id}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hi" }] }),
      signal: ac.signal,
    }).catch((err: Error) => err);
    await new Promise((r) => setTimeout(r, ms));
    ac.abort();
    expect(await call).toBeInstanceOf(Error);
  }

  /** The session's lost calls once they stop changing (the mark is written after the agent left). */
  async function lostAfterLeaving(id: string, gw: FastifyInstance) {
    await new Promise((r) => setTimeout(r, 300));
    return (await session(id, gw)).lost_calls;
  }

  it("while a pause of inference holds it (a weight sync longer than its SDK waits): a lost call, so the rollout is not scored on the failure that follows", async () => {
    const gw = await fleet.gateway({ env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
    const base = await listenLocal(gw);
    try {
      const s = await open(gw);
      expect((await gw.inject({ method: "POST", url: "/admin/inference/pause", payload: { mode: "drain", timeout_s: 5 } })).statusCode).toBe(200);
      try {
        await giveUpAfter(base, s, 300);
      } finally {
        expect((await gw.inject({ method: "POST", url: "/admin/inference/resume" })).statusCode).toBe(200);
      }
      const lost = await lostAfterLeaving(s.id, gw);
      expect(lost.count).toBe(1);
      expect(lost.first).toMatchObject({ kind: "left_during_pause", status: 0 });
      expect(lost.first?.message).toMatch(/held \d+ ms by a pause of inference/);
    } finally {
      await gw.close();
    }
  });

  it("while the engine generates it: its own doing, nothing is marked", async () => {
    const gw = await fleet.gateway({ env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
    const base = await listenLocal(gw);
    try {
      const s = await open(gw);
      getSimState(fleet.sim).setFault({ mode: "slow", delay_ms: 2_000 });
      await giveUpAfter(base, s, 300);
      expect((await lostAfterLeaving(s.id, gw)).count).toBe(0);
    } finally {
      await gw.close();
    }
  });
});
