/**
 * The same contract for every token-in engine, against engine-sim in each engine's mode: from the
 * prompt ids the chat route rendered, token-in generation gives the chat route's own answer (ids,
 * logprobs, parsed reasoning and tool calls), streamed or not; a prompt that ends inside the answer
 * is continued, with the parser primed on the text already sent; detokenize and the context length
 * come from the engine.
 */
import { PRESETS } from "@rollgate/models";
import { buildEngineSim, getTokenizer } from "@rollgate/engine-sim";
import type { CanonicalChatRequest, EngineConfig } from "@rollgate/protocol";
import { StreamAccumulator } from "@rollgate/transforms";
import type { FastifyInstance } from "fastify";
import { Agent } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { listenLocal } from "../__fixtures__/harness.js";
import { adapterFor } from "./adapter.js";
import { buildSglangGenerateBody } from "./sglang-token-in.js";
import { tokenInFor, type TokenInCall } from "./token-in.js";
import type { EngineCall } from "./vllm.js";

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
  { kind: "vllm", label: "vllm" },
  { kind: "sglang", label: "sglang (cumulative stream events)" },
  { kind: "sglang", label: "sglang (--incremental-streaming-output)", incremental: true },
] as const;

for (const mode of modes) {
  describe(`${mode.label} token-in contract`, () => {
    let sim: FastifyInstance;
    let engine: EngineConfig;
    const tokenIn = tokenInFor(mode.kind);
    const base = (stream: boolean): EngineCall => ({
      target: { engineIndex: 0, engine, dpRank: 1, profile: PRESETS.qwen3! },
      model: "Qwen/Qwen3-8B",
      request: request(stream),
      requestId: `r-${Math.random()}`,
      signal: new AbortController().signal,
      dispatcher,
    });
    const tokenInCall = (stream: boolean, promptIds: number[]): TokenInCall => ({ ...base(stream), promptIds, maxModelLen: 40960 });

    beforeAll(async () => {
      sim = buildEngineSim({ kind: mode.kind, dpSize: 2, ...("incremental" in mode ? { incrementalStreamingOutput: true } : {}) });
      engine = { kind: mode.kind, url: await listenLocal(sim), dp_size: 2 };
    });
    afterAll(() => sim.close());

    it("gives the chat route's answer from its prompt ids, streamed or not", async () => {
      const chat = await adapterFor(mode.kind)!.chat(base(false));
      const whole = await tokenIn.generate(tokenInCall(false, chat.prompt_ids));
      expect(whole.output_ids).toEqual(chat.output_ids);
      expect(whole.output_logprobs).toEqual(chat.output_logprobs);
      expect(whole.prompt_ids).toEqual(chat.prompt_ids);
      expect(whole.finish_reason).toBe("tool_calls");
      expect(whole.message).toMatchObject({ content: chat.message.content, reasoning: chat.message.reasoning });
      expect(whole.message.tool_calls.map((c) => c.function)).toEqual(chat.message.tool_calls.map((c) => c.function));

      const acc = new StreamAccumulator();
      for await (const ev of tokenIn.generateStream(tokenInCall(true, chat.prompt_ids))) acc.push(ev);
      const streamed = acc.result();
      expect(streamed.output_ids).toEqual(chat.output_ids);
      expect(streamed.output_logprobs).toEqual(chat.output_logprobs);
      expect(streamed.finish_reason).toBe("tool_calls");
      // Streamed content keeps the whitespace around the think block and the tool call, as vLLM's streaming parsers do.
      expect(streamed.message.content?.trim()).toBe("Looking.");
      expect(streamed.message.reasoning).toBe(chat.message.reasoning);
      expect(streamed.message.tool_calls.map((c) => c.function)).toEqual(chat.message.tool_calls.map((c) => c.function));
    });

    it("continues an answer cut after some tokens; a primed stream emits only what is new", async () => {
      const chat = await adapterFor(mode.kind)!.chat(base(false));
      const cut = 3; // "<think>", "\n", "List": inside the reasoning
      const sent = chat.output_ids.slice(0, cut);
      const rest = await tokenIn.generate(tokenInCall(false, [...chat.prompt_ids, ...sent]));
      expect([...sent, ...rest.output_ids]).toEqual(chat.output_ids);
      // The whole text parsed at once is the uncut message.
      const text = await tokenIn.detokenize(base(false), chat.output_ids);
      expect(text.endsWith("<|im_end|>")).toBe(true);
      const answer = tokenIn.parseAnswer(tokenInCall(false, chat.prompt_ids), text, "stop");
      expect(answer.finish_reason).toBe("tool_calls");
      expect(answer.message).toMatchObject({ content: chat.message.content, reasoning: chat.message.reasoning });

      const primeText = await tokenIn.detokenize(base(false), sent);
      const acc = new StreamAccumulator();
      for await (const ev of tokenIn.generateStream({ ...tokenInCall(true, [...chat.prompt_ids, ...sent]), primeText })) acc.push(ev);
      const tail = acc.result();
      expect(tail.output_ids).toEqual(chat.output_ids.slice(cut));
      // Reasoning picks up mid-thought; nothing already sent is repeated.
      expect(tok.decode(sent.slice(1)) + tail.message.reasoning).toBe(chat.message.reasoning);
      expect(tail.message.content?.trim()).toBe("Looking.");
      expect(tail.message.tool_calls.map((c) => c.function)).toEqual(chat.message.tool_calls.map((c) => c.function));
    });

    it("reads the context length from the engine", async () => {
      expect(await tokenIn.maxModelLen(base(false))).toBe(40960);
    });
  });
}

describe("SGLang /generate body", () => {
  it("sends the token ids, the whole budget (SGLang's default is 128), logprobs with text, and the rank in the body", () => {
    const call = {
      target: { engineIndex: 0, engine: { kind: "sglang" as const, url: "http://e", dp_size: 4 }, dpRank: 3, profile: PRESETS.qwen3! },
      model: "m",
      request: { ...request(false), sampling: { temperature: 0.7, top_p: 0.9, seed: 5, stop: ["x"] } },
      requestId: "sess-1-cont1",
      signal: new AbortController().signal,
      dispatcher,
      promptIds: [1, 2, 3],
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
