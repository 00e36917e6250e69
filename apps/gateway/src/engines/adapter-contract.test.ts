/**
 * The same contract for every engine adapter, run against engine-sim in each engine's mode:
 * token ids and logprobs are the engine's, parsed reasoning and tool calls come through, the
 * session's rank is the one that serves, streaming gives the same result, and an engine that
 * leaves out what we asked for fails clearly.
 */
import { PRESETS } from "@rollgate/models";
import { buildEngineSim, getSimState, getTokenizer, simLogprob } from "@rollgate/engine-sim";
import type { CanonicalChatRequest } from "@rollgate/protocol";
import { StreamAccumulator } from "@rollgate/transforms";
import Fastify, { type FastifyInstance } from "fastify";
import { Agent } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adapterFor } from "./adapter.js";
import { EngineError } from "./errors.js";
import type { EngineCall } from "./call.js";
import type { EngineConfig } from "../env.js";

const dispatcher = new Agent();
afterAll(() => dispatcher.close());

const SCRIPT = [{ think: "List first.", tool_calls: [{ name: "shell", arguments: { command: "ls -la", timeout: 5 } }] }];
const request = (stream: boolean, text = `go\n#sim: ${JSON.stringify(SCRIPT)}`): CanonicalChatRequest => ({
  messages: [{ role: "user", content: text }],
  tools: [{ type: "function", function: { name: "shell", parameters: { type: "object", properties: { command: { type: "string" } } } } }],
  sampling: { temperature: 1 },
  stream,
  client_logprobs: null,
});

async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: "127.0.0.1" });
  const addr = app.server.address();
  return `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
}

for (const kind of ["vllm", "sglang"] as const) {
  describe(`${kind} adapter contract`, () => {
    let sim: FastifyInstance;
    let engine: EngineConfig;
    const adapter = adapterFor(kind)!;
    const call = (req: CanonicalChatRequest, dpRank = 1, model = "Qwen/Qwen3-8B"): EngineCall => ({
      target: { engineIndex: 0, engine, dpRank, profile: PRESETS.qwen3! },
      model,
      request: req,
      requestId: `r-${Math.random()}`,
      signal: new AbortController().signal,
      dispatcher,
    });

    beforeAll(async () => {
      sim = buildEngineSim({ kind, dpSize: 2 });
      engine = { kind, url: await listen(sim), dp_size: 2 };
    });
    afterAll(() => sim.close());

    it("returns the engine's own ids and logprobs with reasoning and tool calls parsed", async () => {
      const r = await adapter.chat(call(request(false)));
      const tok = getTokenizer();
      expect(tok.decode(r.output_ids, false)).toBe(
        '<think>\nList first.\n</think>\n\n<tool_call>\n{"name": "shell", "arguments": {"command": "ls -la", "timeout": 5}}\n</tool_call><|im_end|>',
      );
      expect(tok.decode(r.prompt_ids, false)).toContain("<|im_start|>user\ngo\n#sim:");
      expect(r.message.reasoning?.trim()).toBe("List first.");
      expect(r.message.tool_calls.map((t) => t.function)).toEqual([{ name: "shell", arguments: '{"command": "ls -la", "timeout": 5}' }]);
      expect(r.finish_reason).toBe("tool_calls");
      const version = getSimState(sim).weightVersion;
      r.output_ids.forEach((id, i) => {
        expect(r.output_logprobs[i]).toBe(simLogprob(version, [...r.prompt_ids, ...r.output_ids.slice(0, i)], id));
      });
      expect(r.usage).toMatchObject({ prompt_tokens: r.prompt_ids.length, completion_tokens: r.output_ids.length });
    });

    it("sends the call to the session's data-parallel rank", async () => {
      const ranks = getSimState(sim).ranks.ranks;
      const before = ranks.map((x) => x.served);
      await adapter.chat(call(request(false), 0));
      await adapter.chat(call(request(false), 1));
      await adapter.chat(call(request(false), 1));
      expect(ranks.map((x, i) => x.served - before[i]!)).toEqual([1, 2]);
    });

    it("streams events that fold into the non-streaming result", async () => {
      const acc = new StreamAccumulator();
      for await (const e of adapter.chatStream(call(request(true)))) acc.push(e);
      const streamed = acc.result();
      const plain = await adapter.chat(call(request(false)));
      expect(streamed.prompt_ids).toEqual(plain.prompt_ids);
      expect(streamed.output_ids).toEqual(plain.output_ids);
      expect(streamed.output_logprobs).toEqual(plain.output_logprobs);
      expect(streamed.message.tool_calls.map((t) => t.function)).toEqual(plain.message.tool_calls.map((t) => t.function));
      expect(streamed.finish_reason).toBe(plain.finish_reason);
    });

    if (kind === "sglang") {
      it("streams from the engine when its chat stream ends with the ids (PR #34488), folding into the same result", async () => {
        const events = [];
        for await (const e of adapter.chatStream({ ...call(request(true)), streamedIds: true })) events.push(e);
        const deltas = events.filter((e) => e.type === "delta");
        // Text and logprobs as they are generated, the ids once at the end (not one replayed answer).
        const firstText = deltas.findIndex((d) => d.reasoning || d.content || d.tool_calls);
        const ids = deltas.findIndex((d) => d.token_ids.length > 0);
        expect(firstText).toBeGreaterThanOrEqual(0);
        expect(firstText).toBeLessThan(2);
        expect(ids).toBe(deltas.length - 1);
        expect(deltas.length).toBeGreaterThan(3);
        const acc = new StreamAccumulator();
        for (const e of events) acc.push(e);
        const streamed = acc.result();
        const plain = await adapter.chat(call(request(false)));
        expect(streamed.prompt_ids).toEqual(plain.prompt_ids);
        expect(streamed.output_ids).toEqual(plain.output_ids);
        expect(streamed.output_logprobs).toEqual(plain.output_logprobs);
        expect(streamed.message.reasoning?.trim()).toBe(plain.message.reasoning?.trim());
        expect(streamed.message.tool_calls.map((t) => t.function)).toEqual(plain.message.tool_calls.map((t) => t.function));
        expect(streamed.finish_reason).toBe(plain.finish_reason);
        expect(streamed.usage).toEqual(plain.usage);
      });
    }

    it("counts prompt tokens with the engine's own template", async () => {
      const plain = await adapter.chat(call(request(false)));
      expect(await adapter.countTokens(call(request(false)))).toBe(plain.prompt_ids.length);
    });

    it("passes an engine's 4xx on with its message", async () => {
      const tooLong = { ...request(false), sampling: { max_tokens: 10_000_000 } };
      const err = await adapter.chat(call(tooLong)).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(EngineError);
      expect((err as EngineError).status).toBe(400);
      expect((err as EngineError).message).toMatch(/max|context|length/i);
    });

    // A streamed call's engine request goes through stream-request.ts (not undici's request()).
    const streamed = (c: EngineCall): EngineCall => ({ ...c, streamedIds: true });
    const drain = async (c: EngineCall) => {
      const events = [];
      for await (const e of adapter.chatStream(c)) events.push(e);
      return events;
    };

    it("passes an engine's 4xx on with its message, streamed too", async () => {
      const tooLong = { ...request(true), sampling: { max_tokens: 10_000_000 } };
      const err = await drain(streamed(call(tooLong))).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(EngineError);
      expect((err as EngineError).status).toBe(400);
      expect((err as EngineError).message).toMatch(/max|context|length/i);
    });

    it("says an unreachable engine is unreachable, streamed too", async () => {
      const c = { ...streamed(call(request(true))), target: { engineIndex: 0, engine: { kind, url: "http://127.0.0.1:9", dp_size: 1 }, dpRank: 0, profile: PRESETS.qwen3! } };
      const err = await drain(c).catch((e: unknown) => e);
      expect(err).toMatchObject({ status: 502, kind: "unreachable" });
    });

    it("a streamed call aborted midway, or left by its reader, ends at once and the engine stops generating it", async () => {
      const slow = buildEngineSim({ kind, tpotMs: 40 });
      const url = await listen(slow);
      const target = { engineIndex: 0, engine: { kind, url, dp_size: 1 }, dpRank: 0, profile: PRESETS.qwen3! };
      const long = request(true, `go\n#sim: ${JSON.stringify([{ text: "word ".repeat(200) }])}`);
      const rank = getSimState(slow).ranks.ranks[0]!;
      try {
        // Aborted by its signal (the agent went away) after its first text.
        const abort = new AbortController();
        const started = Date.now();
        const err = await (async () => {
          for await (const e of adapter.chatStream({ ...streamed(call(long)), target, signal: abort.signal })) {
            if (e.type === "delta" && e.content) abort.abort(new Error("the agent left"));
          }
        })().catch((e: unknown) => e);
        expect(err).toBeInstanceOf(Error);
        expect(Date.now() - started).toBeLessThan(2_000);
        await expect.poll(() => rank.running, { timeout: 2_000 }).toBe(0);
        // Left by its reader (return()) after its first text: the engine's stream is closed too.
        for await (const e of adapter.chatStream({ ...streamed(call(long)), target })) {
          if (e.type === "delta" && e.content) break;
        }
        await expect.poll(() => rank.running, { timeout: 2_000 }).toBe(0);
        // The connection pool still serves the next call whole.
        expect((await drain({ ...streamed(call(request(true))), target })).some((e) => e.type === "finish")).toBe(true);
      } finally {
        await slow.close();
      }
    });

    it("fails clearly (502) when the engine leaves out the token ids it was asked for", async () => {
      const old = Fastify();
      old.post("/v1/chat/completions", async () => ({
        choices: [{ message: { content: "hi" }, finish_reason: "stop", logprobs: { content: [{ token: "hi", logprob: -1 }] } }],
        usage: { prompt_tokens: 3, completion_tokens: 1 },
      }));
      const url = await listen(old);
      const err = await adapter
        .chat({ ...call(request(false)), target: { engineIndex: 0, engine: { kind, url, dp_size: 1 }, dpRank: 0, profile: PRESETS.qwen3! } })
        .catch((e: unknown) => e);
      await old.close();
      expect(err).toBeInstanceOf(EngineError);
      expect(err).toMatchObject({ status: 502, kind: "bad_response", message: expect.stringMatching(/token ids/) });
    });

    it("says an unreachable engine is unreachable", async () => {
      const err = await adapter
        .chat({ ...call(request(false)), target: { engineIndex: 0, engine: { kind, url: "http://127.0.0.1:9", dp_size: 1 }, dpRank: 0, profile: PRESETS.qwen3! } })
        .catch((e: unknown) => e);
      expect(err).toMatchObject({ status: 502, kind: "unreachable" });
    });
  });
}
