/**
 * The same contract for every token-in route, against engine-sim in each engine's mode: from the
 * prompt ids the chat route rendered, token-in generation gives the chat route's own answer (ids,
 * logprobs, parsed reasoning and tool calls), streamed or not. Routes the gateway parses (vLLM
 * /v1/completions, SGLang /generate, for profiles with a gateway parser) also continue a prompt that
 * ends inside the answer, with the parser primed on the text already sent. Capabilities are probed
 * the way the gateway probes them.
 */
import { PRESETS, profileOf } from "@rollgate/models";
import { buildEngineSim, getTokenizer } from "@rollgate/engine-sim";
import type { CanonicalChatRequest } from "@rollgate/protocol";
import { StreamAccumulator } from "@rollgate/transforms";
import type { FastifyInstance } from "fastify";
import { Agent } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { listenLocal } from "../__fixtures__/harness.js";
import { adapterFor } from "./adapter.js";
import { probeCapabilities } from "./capabilities.js";
import { buildSglangGenerateBody } from "./sglang/token-in.js";
import { cutContinuationRoute, historyRoute, parseAnswer, type TokenInCall, type TokenInRoute } from "./token-in.js";
import { engineTokenizer } from "./tokenizer.js";
import type { EngineCall } from "./call.js";
import type { EngineConfig } from "../env.js";

const dispatcher = new Agent();
afterAll(() => dispatcher.close());
const tok = getTokenizer();

const SCRIPT = [{ think: "List first.", text: "Looking.", tool_calls: [{ name: "shell", arguments: { command: "ls -la" } }] }];
const request = (stream: boolean): CanonicalChatRequest => ({
  messages: [{ role: "user", content: `go\n#sim: ${JSON.stringify(SCRIPT)}` }],
  tools: [{ type: "function", function: { name: "shell", parameters: { type: "object" } } }],
  sampling: { temperature: 1 },
  stream,
  client_logprobs: null,
});

const modes = [
  { kind: "vllm", label: "vllm /v1/completions (gateway parser)", sim: { vllmVersion: "0.27.0" }, route: "completions" },
  { kind: "vllm", label: "vllm chat, kv_transfer_params.prompt_token_ids", sim: { vllmVersion: "0.28.0" }, route: "chat_kv_transfer_params" },
  { kind: "vllm", label: "vllm chat, prompt_token_ids", sim: { vllmVersion: "0.29.0" }, route: "chat_prompt_token_ids" },
  { kind: "sglang", label: "sglang /generate (cumulative stream events)", sim: {}, route: "generate" },
  { kind: "sglang", label: "sglang /generate (--incremental-streaming-output)", sim: { incrementalStreamingOutput: true }, route: "generate" },
  { kind: "sglang", label: "sglang chat, input_ids", sim: {}, route: "chat_input_ids" },
] as const;

for (const mode of modes) {
  describe(`${mode.label} token-in contract`, () => {
    let sim: FastifyInstance;
    let engine: EngineConfig;
    let route: TokenInRoute;
    const base = (stream: boolean): EngineCall => ({
      target: { engineIndex: 0, engine, dpRank: 1, profile: PRESETS.qwen3! },
      model: "Qwen/Qwen3-8B",
      request: request(stream),
      requestId: `r-${Math.random()}`,
      signal: new AbortController().signal,
      dispatcher,
    });
    const tokenInCall = (stream: boolean, tokenIds: number[]): TokenInCall => ({ ...base(stream), tokenIds, maxModelLen: 40960 });

    beforeAll(async () => {
      sim = buildEngineSim({ kind: mode.kind, dpSize: 2, ...mode.sim });
      engine = { kind: mode.kind, url: await listenLocal(sim), dp_size: 2 };
      const caps = await probeCapabilities(base(false));
      // The chat routes are the engine's when it has one; the parser-less ones serve the rest. (An
      // SGLang whose parse routes answer sends everything through /generate: tested below.)
      const chosen =
        mode.route === "generate" ? { route: cutContinuationRoute(mode.kind, PRESETS.qwen3!) } : historyRoute(mode.kind, { ...caps, parseRoutes: false }, PRESETS.qwen3!);
      route = chosen.route!;
    });
    afterAll(() => sim.close());

    it(`the gateway picks the ${mode.route} route`, () => {
      expect(route.name).toBe(mode.route);
      expect(route.parsedBy).toBe(mode.route.startsWith("chat_") ? "engine" : "gateway");
    });

    it("gives the chat route's answer from its prompt ids, streamed or not", async () => {
      const chat = await adapterFor(mode.kind)!.chat(base(false));
      const whole = await route.generate(tokenInCall(false, chat.prompt_ids));
      expect(whole.output_ids).toEqual(chat.output_ids);
      expect(whole.output_logprobs).toEqual(chat.output_logprobs);
      expect(whole.prompt_ids).toEqual(chat.prompt_ids);
      expect(whole.finish_reason).toBe("tool_calls");
      expect(whole.message).toMatchObject({ content: chat.message.content, reasoning: chat.message.reasoning });
      expect(whole.message.tool_calls.map((c) => c.function)).toEqual(chat.message.tool_calls.map((c) => c.function));

      const acc = new StreamAccumulator();
      for await (const ev of route.generateStream(tokenInCall(true, chat.prompt_ids))) acc.push(ev);
      const streamed = acc.result();
      expect(streamed.output_ids).toEqual(chat.output_ids);
      expect(streamed.output_logprobs).toEqual(chat.output_logprobs);
      expect(streamed.finish_reason).toBe("tool_calls");
      // Streamed content keeps the whitespace around the think block and the tool call, as vLLM's streaming parsers do.
      expect(streamed.message.content?.trim()).toBe("Looking.");
      expect(streamed.message.reasoning).toBe(chat.message.reasoning);
      expect(streamed.message.tool_calls.map((c) => c.function)).toEqual(chat.message.tool_calls.map((c) => c.function));
    });

    it("the engine's prompt is the ids it is given, not the messages' render", async () => {
      const other = await engineTokenizer.renderChat(base(false), [{ role: "user", content: "something else entirely" }]);
      const r = await route.generate(tokenInCall(false, other.ids));
      expect(r.prompt_ids).toEqual(other.ids);
    });

    // Only routes the gateway parses continue a cut answer (the whole text is parsed again).
    if (mode.route === "completions" || mode.route === "generate") {
      it("continues an answer cut after some tokens; a primed stream emits only what is new", async () => {
        const chat = await adapterFor(mode.kind)!.chat(base(false));
        const cut = 3; // "<think>", "\n", "List": inside the reasoning
        const sent = chat.output_ids.slice(0, cut);
        const rest = await route.generate(tokenInCall(false, [...chat.prompt_ids, ...sent]));
        expect([...sent, ...rest.output_ids]).toEqual(chat.output_ids);
        // The whole text parsed at once is the uncut message.
        const text = await engineTokenizer.detokenize(base(false), chat.output_ids);
        expect(text.endsWith("<|im_end|>")).toBe(true);
        const answer = parseAnswer(base(false), text, "stop");
        expect(answer.finish_reason).toBe("tool_calls");
        expect(answer.message).toMatchObject({ content: chat.message.content, reasoning: chat.message.reasoning });

        const primeText = await engineTokenizer.detokenize(base(false), sent);
        const acc = new StreamAccumulator();
        for await (const ev of route.generateStream({ ...tokenInCall(true, [...chat.prompt_ids, ...sent]), primeText })) acc.push(ev);
        const tail = acc.result();
        expect(tail.output_ids).toEqual(chat.output_ids.slice(cut));
        // Reasoning picks up mid-thought; nothing already sent is repeated.
        expect(tok.decode(sent.slice(1)) + tail.message.reasoning).toBe(chat.message.reasoning);
        expect(tail.message.content?.trim()).toBe("Looking.");
        expect(tail.message.tool_calls.map((c) => c.function)).toEqual(chat.message.tool_calls.map((c) => c.function));
      });
    }

    it("reads the context length from the engine", async () => {
      expect(await engineTokenizer.maxModelLen(base(false))).toBe(40960);
    });
  });
}

/** engine-sim family → the rollgate profile serving it (the same facts as the harness's table). */
const FAMILY_PROFILE: Record<string, string> = { qwen3: "qwen3", "llama3.1": "llama3", "deepseek-v3": "deepseek-v3", "gpt-oss": "gpt-oss" };

describe("SGLang /generate read by SGLang's own parse routes (/separate_reasoning, /parse_function_call)", () => {
  const STEP: Record<string, Record<string, unknown>> = {
    qwen3: { think: "List first.", tool_calls: [{ name: "shell", arguments: { command: "ls -la" } }] },
    "llama3.1": { tool_calls: [{ name: "shell", arguments: { command: "ls -la" } }] },
    "deepseek-v3": { text: "Looking.", tool_calls: [{ name: "shell", arguments: { command: "ls -la" } }] },
    "gpt-oss": { think: "List first.", tool_calls: [{ name: "shell", arguments: { command: "ls -la" } }] },
  };
  for (const family of Object.keys(STEP)) {
    it(`${family}: the chat route's answer (ids, logprobs, tool call, reasoning), streamed or not`, async () => {
      const sim = buildEngineSim({ kind: "sglang", family: family as never, dpSize: 1, startDate: "2026-01-05" });
      try {
        const engine: EngineConfig = { kind: "sglang", url: await listenLocal(sim), dp_size: 1 };
        // A profile of this family without a gateway parser (token-in on, even gpt-oss's: the route itself is under test), on an SGLang whose chat route takes no ids.
        const profile = profileOf({ extends: FAMILY_PROFILE[family], gateway_parser: null, token_in: "auto" });
        const call = (stream: boolean): EngineCall => ({
          target: { engineIndex: 0, engine, dpRank: 0, profile },
          model: "m",
          request: { ...request(stream), messages: [{ role: "user", content: `go\n#sim: ${JSON.stringify([STEP[family]])}` }] },
          requestId: `r-${Math.random()}`,
          signal: new AbortController().signal,
          dispatcher,
        });
        const caps = await probeCapabilities(call(false));
        expect(caps.parseRoutes).toBe(true);
        const route = historyRoute("sglang", { ...caps, chatPromptField: null }, profile).route!;
        expect(route).toMatchObject({ name: "generate_engine_parsed", parsedBy: "engine" });
        const chat = await adapterFor("sglang")!.chat(call(false));
        const tokenInCall = (stream: boolean): TokenInCall => ({ ...call(stream), tokenIds: chat.prompt_ids, maxModelLen: null });
        const whole = await route.generate(tokenInCall(false));
        const acc = new StreamAccumulator();
        for await (const ev of route.generateStream(tokenInCall(true))) acc.push(ev);
        for (const r of [whole, acc.result()]) {
          expect(r.output_ids).toEqual(chat.output_ids);
          expect(r.output_logprobs).toEqual(chat.output_logprobs);
          expect(r.finish_reason).toBe("tool_calls");
          expect(r.message.tool_calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) }))).toEqual(
            chat.message.tool_calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) })),
          );
          expect((r.message.reasoning ?? "").trim()).toBe((chat.message.reasoning ?? "").trim());
          expect((r.message.content ?? "").trim()).toBe((chat.message.content ?? "").trim());
        }
      } finally {
        await sim.close();
      }
    });
  }
});

describe("capability probes", () => {
  it("a vLLM older than the chat token-in fields and keep pauses: no chat route, abort-and-continue for a profile with a parser", async () => {
    const sim = buildEngineSim({ kind: "vllm", dpSize: 1, vllmVersion: "0.15.1" });
    try {
      const engine: EngineConfig = { kind: "vllm", url: await listenLocal(sim), dp_size: 1 };
      const call: EngineCall = { target: { engineIndex: 0, engine, dpRank: 0, profile: PRESETS.qwen3! }, model: "Qwen/Qwen3-8B", request: request(false), requestId: "r", signal: new AbortController().signal, dispatcher };
      const caps = await probeCapabilities(call);
      expect(caps).toEqual({ version: "0.15.1", chatPromptField: null, parseRoutes: false });
      expect(historyRoute("vllm", caps, PRESETS.qwen3!).route?.name).toBe("completions");
      expect(historyRoute("vllm", caps, PRESETS.llama3!)).toMatchObject({ route: null, why: expect.stringMatching(/no gateway parser/) });
      expect(historyRoute("vllm", caps, PRESETS["gpt-oss"]!)).toMatchObject({ route: null, why: expect.stringMatching(/turns token-in off/) });
    } finally {
      await sim.close();
    }
  });

  it("SGLang takes input_ids on the chat route, and its chat stream ends with PR #34488's ids", async () => {
    const sim = buildEngineSim({ kind: "sglang", dpSize: 2 });
    try {
      const engine: EngineConfig = { kind: "sglang", url: await listenLocal(sim), dp_size: 2 };
      const call: EngineCall = { target: { engineIndex: 0, engine, dpRank: 1, profile: PRESETS.qwen3! }, model: "Qwen/Qwen3-8B", request: request(false), requestId: "r", signal: new AbortController().signal, dispatcher };
      expect(await probeCapabilities(call)).toMatchObject({ chatPromptField: "input_ids", streamedIds: true });
    } finally {
      await sim.close();
    }
  });
});

describe("SGLang /generate body", () => {
  it("sends the token ids, the whole budget (SGLang's default is 128), logprobs with text, and the rank in the body", () => {
    const call = {
      target: { engineIndex: 0, engine: { kind: "sglang" as const, url: "http://e", dp_size: 4 }, dpRank: 3, profile: PRESETS.qwen3! },
      model: "m",
      request: { ...request(false), sampling: { temperature: 0.7, top_p: 0.9, seed: 5, stop: ["x"] } },
      requestId: "sess-1-cont1",
      signal: new AbortController().signal,
      dispatcher,
      tokenIds: [1, 2, 3],
      maxModelLen: 100,
    };
    expect(buildSglangGenerateBody(call)).toEqual({
      input_ids: [1, 2, 3],
      sampling_params: { max_new_tokens: 97, temperature: 0.7, top_p: 0.9, stop: ["x"], sampling_seed: 5 },
      return_logprob: true,
      logprob_start_len: -1,
      top_logprobs_num: 0,
      return_text_in_logprobs: true,
      stream: false,
      rid: "sess-1-cont1",
      routed_dp_rank: 3,
    });
    const capped = buildSglangGenerateBody({ ...call, request: { ...call.request, sampling: { max_tokens: 10 } } });
    expect(capped.sampling_params).toEqual({ max_new_tokens: 10 });
  });
});
