/**
 * A branch's replayed call (llm/replay.ts) adds its source's tokens to the session's counts when
 * its record is stored: until then it holds them on the session's max_total_tokens, as a sampled
 * call holds its worst case, so a call of the branch fitted meanwhile is not given them too. The
 * replayed call is kept between its answer and its record by the engine's /detokenize (an agent
 * that asks for logprobs has the replayed tokens spelled), which this engine-sim holds back.
 * OpenAI-chat bodies through Fastify inject, engine-sim, real Redis.
 */
import { randomUUID } from "node:crypto";
import { buildEngineSim } from "@rollgate/engine-sim";
import type { CompletionRecord } from "@rollgate/protocol";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dropPrefixes, gatewayOnRedis, listenLocal, TEST_REDIS_URL } from "./__fixtures__/harness.js";

const prefix = `test-replayhold-${randomUUID().slice(0, 8)}`;
let sim: FastifyInstance;
let gw: FastifyInstance;
// While closed, the engine answers no /detokenize: `arrived` resolves at the first one held.
let gate: { open: () => void; opened: Promise<void>; arrived: Promise<void>; arrive: () => void } | null = null;

beforeAll(async () => {
  sim = buildEngineSim({ dpSize: 1 });
  sim.addHook("onRequest", async (req) => {
    if (gate && req.url.startsWith("/detokenize")) {
      gate.arrive();
      await gate.opened;
    }
  });
  gw = await gatewayOnRedis(TEST_REDIS_URL, await listenLocal(sim), prefix);
});
afterAll(async () => {
  gate?.open();
  await gw?.close();
  await sim?.close();
  await dropPrefixes([prefix]);
});

type Opened = { id: string; token: string };
async function open(body: Record<string, unknown>): Promise<Opened> {
  const res = await gw.inject({ method: "POST", url: "/v1/sessions", payload: body });
  expect(res.statusCode, res.body).toBe(201);
  return res.json() as Opened;
}
const chat = (s: Opened, payload: Record<string, unknown>) => gw.inject({ method: "POST", url: `/s/${s.id}/v1/chat/completions`, headers: { authorization: `Bearer ${s.token}` }, payload });
const records = async (id: string) => ((await gw.inject({ url: `/v1/sessions/${id}/completions` })).json() as { completions: CompletionRecord[] }).completions;
const used = (rs: CompletionRecord[]) => rs.reduce((n, r) => n + r.prompt_ids.length + r.output_ids.length, 0);

describe("max_total_tokens and a branch's replayed call", () => {
  it("a call fitted while a replayed call's record is not stored yet does not get the replayed tokens: the branch stays within its limit", async () => {
    const first = { model: "m", logprobs: true, messages: [{ role: "user", content: `Start.\n#sim: ${JSON.stringify([{ text: "Begun", tokens: 200 }])}` }] };
    const source = await open({});
    const sourced = await chat(source, first);
    expect(sourced.statusCode, sourced.body).toBe(200);
    const replayedTokens = used(await records(source.id));
    const LIMIT = replayedTokens + 150;
    const branch = await open({ replay: { session_id: source.id, calls: 1 }, limits: { max_total_tokens: LIMIT } });
    let arrive!: () => void;
    let openGate!: () => void;
    const arrived = new Promise<void>((r) => (arrive = r));
    const opened = new Promise<void>((r) => (openGate = r));
    gate = { open: openGate, opened, arrived, arrive };
    const replayed = chat(branch, first);
    // The replayed call is answered from the record and now spells its tokens: its record is not stored yet.
    await arrived;
    const sampled = await chat(branch, { model: "m", messages: [{ role: "user", content: `Other.\n#sim: ${JSON.stringify([{ text: "Long", tokens: 400 }])}` }] });
    gate = null;
    openGate();
    expect((await replayed).statusCode).toBe(200);
    // Fitted beside the replayed call's tokens (cut to what they left), or refused: never given them too.
    expect([200, 400]).toContain(sampled.statusCode);
    const rs = await records(branch.id);
    expect(rs[0]!.replayed_from).toBeTruthy();
    expect(used(rs)).toBeLessThanOrEqual(LIMIT);
  });
});
