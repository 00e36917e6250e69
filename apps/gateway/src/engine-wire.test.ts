/**
 * What engines send back, attacked on the wire: a real engine-sim generates each answer and a
 * misbehaving engine in front of it (__fixtures__/wire-engine.ts, a real HTTP server) rewrites the
 * bytes the gateway gets. Whatever it sends, the gateway must either record the answer the policy
 * really sampled (the ids and logprobs the agent's text came from) or fail the call: the agent
 * gets an error in its protocol (here the real OpenAI SDK), the session counts a lost call (the
 * rollout is not scored) and nothing is recorded as the call's answer.
 */
import { randomUUID } from "node:crypto";
import { buildEngineSim, type EngineSimOptions } from "@rollgate/engine-sim";
import type { CompletionRecord, Session } from "@rollgate/protocol";
import type { FastifyInstance } from "fastify";
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import OpenAI from "openai";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildGateway } from "./app.js";
import { GatewayEnv } from "./env.js";
import { dropPrefixes, listenLocal, TEST_REDIS_URL } from "./__fixtures__/harness.js";
import { ssePayloads, sseText, startWireEngine, type WireEngine, type WireFault } from "./__fixtures__/wire-engine.js";

interface Stack {
  sim: FastifyInstance;
  wire: WireEngine;
  gateway: FastifyInstance;
  url: string;
  prefix: string;
}

/**
 * engine-sim (2 ranks) behind the misbehaving engine, behind a listening gateway on the qwen3
 * profile; `probeFault` rewrites the answers to the gateway's capability probes, `extraEnv` adds
 * to the gateway's environment.
 */
async function startStack(name: string, sim: EngineSimOptions, probeFault: WireFault | null = null, extraEnv: Record<string, string> = {}): Promise<Stack> {
  const engine = buildEngineSim({ dpSize: 2, ...sim });
  const wire = await startWireEngine(await listenLocal(engine));
  wire.probeFault = probeFault;
  const prefix = `test-wire-${name}-${randomUUID().slice(0, 8)}`;
  const env = GatewayEnv.parse({
    REDIS_URL: TEST_REDIS_URL,
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: sim.kind ?? "vllm", url: wire.url, dp_size: 2, profile: "qwen3" }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0",
    // An engine that stops sending mid-answer is given up on after this long.
    ROLLGATE_ENGINE_TIMEOUT_S: "2",
    ...extraEnv,
  });
  const gateway = await buildGateway({ env, logger: pino({ level: "silent" }) });
  return { sim: engine, wire, gateway, url: await listenLocal(gateway), prefix };
}

async function stopStack(s: Stack | undefined): Promise<void> {
  if (!s) return;
  await s.gateway.close();
  await s.wire.close();
  await s.sim.close();
  await dropPrefixes([s.prefix]);
}

interface Outcome {
  /** What the agent's SDK threw, if it threw. */
  error: (Error & { status?: number }) | null;
  /** The assembled answer's text, when the SDK gave one. */
  text: string | null;
  session: Session;
  records: CompletionRecord[];
}

/** One agent call through the OpenAI SDK, with `fault` on the engine's answer; what the agent and the session got. */
async function callThrough(stack: Stack, fault: WireFault | null, stream: boolean, content = "hi"): Promise<Outcome> {
  const opened = await fetch(`${stack.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const s = (await opened.json()) as { id: string; token: string; urls: { openai: string } };
  const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
  const params = { model: "m", messages: [{ role: "user" as const, content }] };
  stack.wire.fault = fault;
  let error: Outcome["error"] = null;
  let text: string | null = null;
  try {
    const answer = stream ? await client.chat.completions.stream(params).finalChatCompletion() : await client.chat.completions.create(params);
    text = answer.choices[0]?.message.content ?? null;
  } catch (err) {
    error = err as Outcome["error"];
  } finally {
    stack.wire.fault = null;
  }
  // The session's word on the call: read once its record (if any) is written.
  const closed = await fetch(`${stack.url}/v1/sessions/${s.id}/close`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  expect(closed.status).toBe(200);
  const session = (await (await fetch(`${stack.url}/v1/sessions/${s.id}`)).json()) as Session;
  const records = ((await (await fetch(`${stack.url}/v1/sessions/${s.id}/completions`)).json()) as { completions: CompletionRecord[] }).completions;
  return { error, text, session, records };
}

/** The call failed cleanly: the agent got an error, the session a lost call of `kind`, and no record. */
function expectLost(o: Outcome, kind: string, message: RegExp): void {
  expect(o.error, `the agent got an answer: ${o.text}`).not.toBeNull();
  expect(o.records).toEqual([]);
  expect(o.session.lost_calls.count).toBe(1);
  expect(o.session.lost_calls.first).toMatchObject({ kind, message: expect.stringMatching(message) });
}

const CONTENT_CHUNK = /"delta":\{[^}]*"content":"[^"]/;
const FINISH_CHUNK = /"finish_reason":"[a-z_]+"/;

/**
 * The engine's stream with one of its content chunks sent again after its finish (`where`: right
 * after the finish chunk, or after `[DONE]`). SGLang tells the answer's ids once, at the end: they
 * get the repeated chunk's id too, so the ids still count one per logprob (a self-consistent lie).
 */
function lateChunk(where: "after the finish" | "after [DONE]"): WireFault {
  return (up) => {
    const p = ssePayloads(up.text);
    const first = p.findIndex((x) => CONTENT_CHUNK.test(x));
    const late = p[first]!;
    const out = p.map((x) => {
      const ext = /"output_ids":\[\[(\d+)/.exec(x);
      return ext ? x.replace(/\]\]\}/, `,${ext[1]}]]}`) : x;
    });
    if (where === "after [DONE]") out.push(late);
    else out.splice(out.findIndex((x) => FINISH_CHUNK.test(x)) + 1, 0, late);
    return { pieces: [sseText(out)] };
  };
}

const STACKS: [string, EngineSimOptions][] = [
  ["vLLM", { kind: "vllm" }],
  ["SGLang", { kind: "sglang" }],
];

describe.each(STACKS)("%s answers that go on after their end", (name, sim) => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack(name.toLowerCase(), sim);
  });
  afterAll(() => stopStack(stack));

  it.each([
    ["after the finish", false],
    ["after the finish", true],
    ["after [DONE]", false],
    ["after [DONE]", true],
  ] as const)("a chunk of text and tokens %s (streamed %s): an error, a lost call, no record with tokens past the end", async (where, stream) => {
    const o = await callThrough(stack, lateChunk(where), stream);
    expectLost(o, "engine_bad_response", where === "after [DONE]" ? /after \[DONE\]/ : /after its finish/);
  });
});

/** The engine's answer with `pattern`'s first match (or every match) replaced: the same bytes otherwise, streamed or whole. */
const rewrite =
  (pattern: RegExp, by: string): WireFault =>
  (up) => ({ pieces: [up.text.replace(pattern, by)] });

const WHOLE_ANSWERS: [string, EngineSimOptions] = ["vLLM 0.15 (whole answers)", { kind: "vllm", vllmVersion: "0.15.1" }];

describe.each([...STACKS, WHOLE_ANSWERS])("%s answers that cannot be the policy's sample", (name, sim) => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack(name.replace(/\W+/g, "-").toLowerCase(), sim);
  });
  afterAll(() => stopStack(stack));

  // Output ids: vLLM's choice `token_ids`, SGLang's `sglext.output_ids`; the prompt's: `prompt_token_ids`, `sglext.input_ids`.
  const firstOutputId = sim.kind === "sglang" ? /"output_ids":\[\[\d+/ : /"token_ids":\[\d+/;
  const outputIdsStart = sim.kind === "sglang" ? '"output_ids":[[' : '"token_ids":[';
  const promptIds = sim.kind === "sglang" ? /"input_ids":\[[\d,]*\]/ : /"prompt_token_ids":\[[\d,]*\]/g;
  const CASES: [string, WireFault, RegExp][] = [
    // vLLM's `--logprobs-mode raw_logits` sends logits where the logprobs go.
    ["a logprob above 0 (a logit sent as a logprob)", rewrite(/"logprob":-[\d.e-]+/, '"logprob":3.5'), /logprob 3\.5, not a log-probability/],
    ["a negative token id", rewrite(firstOutputId, `${outputIdsStart}-5`), /= -5 is not a token id/],
    ["an id beyond the profile's vocabulary (Qwen3: 151,936)", rewrite(firstOutputId, `${outputIdsStart}151936`), /= 151936 is not a token id in \[0, 151936\)/],
    ["a prompt of no token ids", rewrite(promptIds, sim.kind === "sglang" ? '"input_ids":[]' : '"prompt_token_ids":[]'), /prompt has no token ids/],
    [
      "text with no token ids or logprobs at all",
      (up) => ({
        pieces: [
          up.text
            .replace(/"token_ids":\[[\d,]*\]/g, '"token_ids":[]')
            .replace(/"output_ids":\[\[[\d,]*\]\]/g, '"output_ids":[[]]')
            .replace(/"logprobs":\{"content":\[.*?\]\}(?=,"finish_reason")/g, '"logprobs":null'),
        ],
      }),
      /text came with no token ids/,
    ],
  ];
  it.each(CASES.flatMap(([what, fault, message]) => [false, true].map((stream) => [what, stream, fault, message] as const)))(
    "%s (streamed %s): an error, a lost call, nothing recorded",
    async (_what, stream, fault, message) => {
      expectLost(await callThrough(stack, fault, stream), "engine_bad_response", message);
    },
  );
});

describe.each([...STACKS, WHOLE_ANSWERS])("%s answers that break off after their headers", (name, sim) => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack(`broke-${name.replace(/\W+/g, "-").toLowerCase()}`, sim);
  });
  afterAll(() => stopStack(stack));

  const half = (text: string) => text.slice(0, Math.floor(text.length / 2));
  const CASES: [string, WireFault][] = [
    ["the connection is reset halfway through", (up) => ({ pieces: [half(up.text)], end: "destroy" })],
    ["the engine goes silent halfway through (past the engine timeout)", (up) => ({ pieces: [half(up.text)], end: "hang" })],
  ];
  it.each(CASES.flatMap(([what, fault]) => [false, true].map((stream) => [what, stream, fault] as const)))(
    "%s (streamed %s): the engine is unreachable (502, a lost call), not an internal error; the agent is not told its address",
    async (_what, stream, fault) => {
      const o = await callThrough(stack, fault, stream);
      expectLost(o, "engine_unreachable", /broke off its answer/);
      expect(o.session.lost_calls.first?.status).toBe(502);
      expect(o.error?.message).toMatch(/the engine broke off its answer/);
      expect(o.error?.message).not.toContain("127.0.0.1");
    },
  );

  it.each([
    [503, "engine_rejected", 502],
    [429, "engine_rejected", 429],
  ] as const)("an error status (%i) whose body breaks off: the engine's refusal (%s, %i, a lost call), not an internal error", async (status, kind, told) => {
    for (const stream of [false, true]) {
      const o = await callThrough(stack, () => ({ status, pieces: ['{"error": {"message": "over'], end: "destroy" }), stream);
      expectLost(o, kind, new RegExp(`answered ${status}`));
      expect(o.session.lost_calls.first?.status).toBe(told);
    }
  });

  it.each([false, true])("a body cut short that ends cleanly (streamed %s): a bad response (502, a lost call), not an internal error", async (stream) => {
    const o = await callThrough(stack, (up) => ({ pieces: [half(up.text)] }), stream);
    expectLost(o, "engine_bad_response", /./);
    expect(o.session.lost_calls.first?.status).toBe(502);
  });
});

describe.each([...STACKS, WHOLE_ANSWERS])("%s usage counts that disagree with its ids", (name, sim) => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack(`usage-${name.replace(/\W+/g, "-").toLowerCase()}`, sim);
  });
  afterAll(() => stopStack(stack));

  it.each([false, true])("the record and the session count the ids recorded, not the engine's counts (streamed %s)", async (stream) => {
    const o = await callThrough(stack, (up) => ({ pieces: [up.text.replace(/"prompt_tokens":\d+/g, '"prompt_tokens":1').replace(/"completion_tokens":\d+/g, '"completion_tokens":3')] }), stream);
    expect(o.error).toBeNull();
    expect(o.records).toHaveLength(1);
    const [r] = o.records;
    expect(r!.output_ids.length).toBeGreaterThan(3);
    expect(r!.usage).toMatchObject({ prompt_tokens: r!.prompt_ids.length, completion_tokens: r!.output_ids.length });
    expect(o.session.counts).toMatchObject({ prompt_tokens: r!.prompt_ids.length, completion_tokens: r!.output_ids.length });
  });
});

describe("SGLang /generate with --incremental-streaming-output (an SGLang whose chat stream has no ids: every call goes through /generate)", () => {
  let stack: Stack;
  beforeAll(async () => {
    // The streamed-ids probe finds no sglext: the gateway reads each call from /generate instead.
    const noStreamedIds: WireFault = (up) => ({ pieces: [up.text.replaceAll('"sglext"', '"not_sglext"')] });
    stack = await startStack("sglang-incremental", { kind: "sglang", incrementalStreamingOutput: true }, noStreamedIds);
  });
  afterAll(() => stopStack(stack));

  // Qwen3 spells digits one token each: "11" is the same id twice, so the second event's ids are
  // the first's again, as a cumulative stream's would be.
  it.each([false, true])("an answer whose second token repeats its first is recorded whole (streamed %s)", async (stream) => {
    const o = await callThrough(stack, null, stream, `count\n#sim: ${JSON.stringify([{ text: "11 apples and 22 pears" }])}`);
    expect(stack.wire.seen.at(-1)?.path).toBe("/generate");
    expect(o.error).toBeNull();
    expect(o.text).toBe("11 apples and 22 pears");
    expect(o.records).toHaveLength(1);
    const [r] = o.records;
    expect(r!.message.content).toBe("11 apples and 22 pears");
    // The digits, the words and the end of turn: every id the engine generated, one logprob each.
    expect(r!.output_ids.slice(0, 2)).toEqual([16, 16]);
    expect(r!.output_ids.length).toBeGreaterThan(8);
    expect(r!.output_logprobs).toHaveLength(r!.output_ids.length);
  });

  // /generate's logprobs are [logprob, id, text] triples: one for another id than the output's at
  // its place is another token's logprob (a shifted or reordered list), not this one's.
  it.each([false, true])("a logprob triple whose id is not the output id at its place: an error, a lost call, nothing recorded (streamed %s)", async (stream) => {
    const shifted: WireFault = (up) => ({ pieces: [up.text.replace(/("output_token_logprobs":\[\[-?[\d.e-]+,)(\d+)/, "$17")] });
    expectLost(await callThrough(stack, shifted, stream), "engine_bad_response", /logprob for token 0 is the logprob of id 7/);
  });
});

describe("vLLM /v1/completions (a continued call sent token-in, its output read by the profile's gateway parser)", () => {
  let stack: Stack;
  beforeAll(async () => {
    // The token-in probe finds the chat route ignoring prompt_token_ids: continued calls go to /v1/completions.
    const chatIgnoresIds: WireFault = (up) => ({ pieces: [up.text.replace(/"prompt_token_ids":\[[\d,]*\]/g, '"prompt_token_ids":null')] });
    stack = await startStack("completions", { kind: "vllm" }, chatIgnoresIds, { ROLLGATE_CONTINUATION: "token_in" });
  });
  afterAll(() => stopStack(stack));

  it.each([false, true])("a chunk of text and tokens after the finish (streamed %s): an error, a lost call; the first call's record stands alone", async (stream) => {
    const opened = await fetch(`${stack.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    const s = (await opened.json()) as { id: string; token: string; urls: { openai: string } };
    const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
    const first = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] });
    const messages = [
      { role: "user" as const, content: "hi" },
      { role: "assistant" as const, content: first.choices[0]!.message.content },
      { role: "user" as const, content: "and then?" },
    ];
    stack.wire.fault = (up) => {
      const p = ssePayloads(up.text);
      const late = p.find((x) => /"text":"[^"]/.test(x))!;
      p.splice(p.findIndex((x) => FINISH_CHUNK.test(x)) + 1, 0, late);
      return { pieces: [sseText(p)] };
    };
    const second = stream ? client.chat.completions.stream({ model: "m", messages }).finalChatCompletion() : client.chat.completions.create({ model: "m", messages });
    await expect(second).rejects.toThrow(/after its finish/);
    stack.wire.fault = null;
    expect(stack.wire.seen.at(-1)?.path).toBe("/v1/completions");
    await fetch(`${stack.url}/v1/sessions/${s.id}/close`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    const session = (await (await fetch(`${stack.url}/v1/sessions/${s.id}`)).json()) as Session;
    expect(session.lost_calls).toMatchObject({ count: 1, first: { kind: "engine_bad_response" } });
    const records = ((await (await fetch(`${stack.url}/v1/sessions/${s.id}/completions`)).json()) as { completions: CompletionRecord[] }).completions;
    expect(records.map((r) => r.seq)).toEqual([0]);
  });
});

describe("every agent SDK gets an error in its own protocol, and the call is lost (vLLM)", () => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack("sdks", { kind: "vllm" });
  });
  afterAll(() => stopStack(stack));

  type Opened = { id: string; token: string; urls: { openai: string; anthropic: string } };
  const messages = [{ role: "user" as const, content: "hi" }];
  const contents = [{ role: "user", parts: [{ text: "hi" }] }];
  const openai = (s: Opened) => new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
  const anthropic = (s: Opened) => new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
  const gemini = (s: Opened) => new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: `${stack.url}/s/${s.id}` } });
  /** An SDK call that returned an answer (not one saying it failed). */
  const answered = async (call: Promise<unknown>) => {
    await call;
    return { failed: false };
  };
  /** Each SDK's call; what it returns when it does not throw: whether it says the answer failed. */
  const SDKS: Record<string, (s: Opened) => Promise<{ failed: boolean }>> = {
    "openai chat": (s) => answered(openai(s).chat.completions.create({ model: "m", messages })),
    "openai chat, streamed": (s) => answered(openai(s).chat.completions.stream({ model: "m", messages }).finalChatCompletion()),
    anthropic: (s) => answered(anthropic(s).messages.create({ model: "c", max_tokens: 500, messages })),
    "anthropic, streamed": (s) => answered(anthropic(s).messages.stream({ model: "c", max_tokens: 500, messages }).finalMessage()),
    gemini: (s) => answered(gemini(s).models.generateContent({ model: "m", contents })),
    "gemini, streamed": async (s) => {
      for await (const chunk of await gemini(s).models.generateContentStream({ model: "m", contents })) void chunk;
      return { failed: false };
    },
    responses: (s) => answered(openai(s).responses.create({ model: "m", input: "hi" })),
    // The Responses stream says a failure with its own event: the response ends "failed".
    "responses, streamed": async (s) => ({ failed: (await openai(s).responses.stream({ model: "m", input: "hi" }).finalResponse()).status === "failed" }),
  };
  const FAULTS: [string, WireFault, string][] = [
    ["text after the finish", lateChunk("after the finish"), "engine_bad_response"],
    ["a logprob above 0", rewrite(/"logprob":-[\d.e-]+/, '"logprob":3.5'), "engine_bad_response"],
    ["a connection reset halfway", (up) => ({ pieces: [up.text.slice(0, up.text.length >> 1)], end: "destroy" }), "engine_unreachable"],
  ];
  it.each(FAULTS)("%s", async (_what, fault, kind) => {
    for (const [sdk, run] of Object.entries(SDKS)) {
      const opened = await fetch(`${stack.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
      const s = (await opened.json()) as Opened;
      stack.wire.fault = fault;
      const outcome = await run(s).catch(() => ({ failed: true }));
      stack.wire.fault = null;
      expect(outcome.failed, `${sdk} was given an answer`).toBe(true);
      await fetch(`${stack.url}/v1/sessions/${s.id}/close`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
      const session = (await (await fetch(`${stack.url}/v1/sessions/${s.id}`)).json()) as Session;
      expect(session.lost_calls, sdk).toMatchObject({ count: 1, first: { kind } });
      const records = ((await (await fetch(`${stack.url}/v1/sessions/${s.id}/completions`)).json()) as { completions: CompletionRecord[] }).completions;
      expect(records, sdk).toEqual([]);
    }
  });
});
