import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ZodError } from "zod";
import { agentRequests } from "./__fixtures__/agent-requests.js";
import type { EngineResult } from "./canonical.js";
import { StreamAccumulator, resultAsEvents } from "./accumulate.js";
import { OpenAIChatRequest, fromOpenAIChat, fromValidOpenAIChat, toOpenAIChatChunk, toOpenAIChatResponse } from "./openai-chat.js";
import { applySessionSampling } from "./sampling.js";

// What the OpenAI SDK sends for an agent's second turn: the assistant message echoed back as it
// came (vLLM's `reasoning` field and `content: "\n\n"` included), then the tool result.
const secondTurn = {
  model: "policy",
  messages: [
    { role: "developer", content: [{ type: "text", text: "Be brief." }] },
    { role: "user", content: "Write hello.txt" },
    {
      role: "assistant",
      content: "\n\n",
      reasoning: "I will use the shell.",
      tool_calls: [{ id: "chatcmpl-tool-1", type: "function", function: { name: "shell", arguments: '{"command": "echo hi"}' } }],
    },
    { role: "tool", tool_call_id: "chatcmpl-tool-1", content: "(no output)" },
  ],
  tools: [{ type: "function", function: { name: "shell", parameters: { type: "object" } } }],
  temperature: 0.7,
  max_completion_tokens: 512,
  stop: "END",
  stream: true,
  stream_options: { include_usage: true },
  parallel_tool_calls: true,
  user: "ignored",
};

describe("fromOpenAIChat", () => {
  it("turns an OpenAI SDK body into the canonical request", () => {
    const call = fromOpenAIChat(secondTurn);
    expect(call.clientModel).toBe("policy");
    expect(call.includeUsage).toBe(true);
    expect(call.canonical).toEqual({
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Write hello.txt" },
        {
          role: "assistant",
          content: "\n\n",
          reasoning: "I will use the shell.",
          tool_calls: [{ id: "chatcmpl-tool-1", type: "function", function: { name: "shell", arguments: '{"command": "echo hi"}' } }],
        },
        { role: "tool", tool_call_id: "chatcmpl-tool-1", content: "(no output)" },
      ],
      tools: secondTurn.tools,
      sampling: { temperature: 0.7, max_tokens: 512, stop: ["END"] },
      stream: true,
      client_logprobs: null,
    });
  });

  it("accepts what qwen-code, opencode and pi send (agent suite): content parts in tool messages, store, strict", () => {
    // Shapes the real CLIs sent through the gateway in test/e2e-agents (our own text). `store` and
    // tool `strict` are ignored on purpose (vLLM ignores them too); `max_tokens` (qwen-code,
    // opencode) and `max_completion_tokens` (pi) are both the ceiling.
    const body = {
      model: "rollgate-policy",
      messages: [
        { role: "system", content: "You are a coding agent." },
        { role: "user", content: [{ type: "text", text: "Write the file." }] },
        {
          role: "assistant",
          content: "",
          reasoning_content: "I will use the shell.",
          tool_calls: [{ id: "call_1", type: "function", function: { name: "run_shell_command", arguments: '{"command":"ls"}' } }],
        },
        { role: "tool", tool_call_id: "call_1", content: [{ type: "text", text: "Exit Code: 0" }] },
      ],
      tools: [{ type: "function", function: { name: "run_shell_command", description: "Run", parameters: { type: "object" }, strict: false } }],
      tool_choice: "auto",
      store: false,
      stream: true,
      stream_options: { include_usage: true },
    };
    for (const limit of [{ max_tokens: 8000 }, { max_completion_tokens: 8000 }]) {
      const call = fromOpenAIChat({ ...body, ...limit });
      expect(call.includeUsage).toBe(true);
      expect(call.canonical.sampling).toEqual({ max_tokens: 8000 });
      expect(call.canonical.messages).toEqual([
        { role: "system", content: "You are a coding agent." },
        { role: "user", content: [{ type: "text", text: "Write the file." }] },
        {
          role: "assistant",
          content: "",
          reasoning: "I will use the shell.",
          tool_calls: [{ id: "call_1", type: "function", function: { name: "run_shell_command", arguments: '{"command":"ls"}' } }],
        },
        { role: "tool", tool_call_id: "call_1", content: "Exit Code: 0" },
      ]);
      expect(call.canonical.tool_choice).toBe("auto");
      expect(call.canonical).not.toHaveProperty("store");
    }
  });

  it("reads reasoning_content (older vLLM) and maps reasoning_effort to enable_thinking", () => {
    const call = fromOpenAIChat({
      messages: [
        { role: "user", content: "q" },
        { role: "assistant", content: "a", reasoning_content: "r" },
        { role: "user", content: "q2" },
      ],
      reasoning_effort: "none",
    });
    expect(call.canonical.messages[1]).toEqual({ role: "assistant", content: "a", reasoning: "r" });
    expect(call.canonical.enable_thinking).toBe(false);
    expect(call.canonical.reasoning_effort).toBe("none");
  });

  it("keeps the client's chat_template_kwargs whole (the model profile decides what reaches the engine)", () => {
    const call = fromOpenAIChat({
      messages: [{ role: "user", content: "q" }],
      chat_template_kwargs: { enable_thinking: true, thinking: true, custom: { a: [1] } },
      reasoning_effort: "high",
    });
    expect(call.canonical).toMatchObject({
      enable_thinking: true,
      reasoning_effort: "high",
      chat_template_kwargs: { enable_thinking: true, thinking: true, custom: { a: [1] } },
    });
    expect(fromOpenAIChat({ messages: [{ role: "user", content: "q" }] }).canonical).not.toHaveProperty("chat_template_kwargs");
  });

  it("names the bad field when the body is wrong", () => {
    const bad = (body: unknown) => {
      try {
        fromOpenAIChat(body);
      } catch (err) {
        expect(err).toBeInstanceOf(ZodError);
        return (err as ZodError).issues.map((i) => i.path.join("."));
      }
      throw new Error("accepted a bad body");
    };
    expect(bad({ messages: [] })).toEqual(["messages"]);
    expect(bad({ messages: [{ role: "user", content: "x" }], temperature: "hot" })).toEqual(["temperature"]);
    expect(bad({ messages: [{ role: "wizard", content: "x" }] })).toEqual(["messages.0.role"]);
    expect(bad({ messages: [{ role: "user", content: "x" }], n: 3 })).toEqual(["n"]);
    expect(bad({ messages: [{ role: "user", content: "x" }], top_logprobs: 2 })).toEqual(["top_logprobs"]);
  });
});

const result: EngineResult = {
  prompt_ids: [1, 2, 3],
  output_ids: [10, 11, 151645],
  output_logprobs: [-0.5, -0.25, -0.125],
  logprobs: [
    { token: "Hi", logprob: -0.5, bytes: [72, 105], top_logprobs: [{ token: "Hi", logprob: -0.5, bytes: [72, 105] }, { token: "Yo", logprob: -1, bytes: null }] },
    { token: "!", logprob: -0.25, bytes: [33], top_logprobs: [] },
    { token: "", logprob: -0.125, bytes: null, top_logprobs: [] },
  ],
  message: { content: "Hi!", reasoning: "think", tool_calls: [] },
  finish_reason: "stop",
  stop_reason: null,
  usage: { prompt_tokens: 3, completion_tokens: 3, cached_tokens: 2 },
};

describe("toOpenAIChatResponse", () => {
  it("hides the engine's token extensions and shows logprobs only when asked", () => {
    const ctx = { id: "chatcmpl-x", created: 7, model: "policy", clientLogprobs: null };
    const res = toOpenAIChatResponse(result, ctx);
    expect(res).toEqual({
      id: "chatcmpl-x",
      object: "chat.completion",
      created: 7,
      model: "policy",
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: "Hi!", reasoning: "think", reasoning_content: "think" },
          logprobs: null,
          finish_reason: "stop",
        },
      ],
      usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6, prompt_tokens_details: { cached_tokens: 2 } },
    });
    const withLogprobs = toOpenAIChatResponse(result, { ...ctx, clientLogprobs: { top_logprobs: 1 } });
    expect(withLogprobs.choices[0]!.logprobs!.content[0]!.top_logprobs).toHaveLength(1);
    expect(withLogprobs.choices[0]!.logprobs!.content).toHaveLength(3);
  });
});

describe("streaming", () => {
  const ctx = { id: "c", created: 1, model: "m", clientLogprobs: null, includeUsage: false };
  it("drops token-only deltas and unrequested usage, keeps text and tool-call deltas", () => {
    expect(toOpenAIChatChunk({ type: "delta", token_ids: [151667], logprobs: [] }, ctx)).toBeNull();
    expect(toOpenAIChatChunk({ type: "usage", usage: result.usage }, ctx)).toBeNull();
    expect(toOpenAIChatChunk({ type: "usage", usage: result.usage }, { ...ctx, includeUsage: true })).toMatchObject({
      choices: [],
      usage: { total_tokens: 6 },
    });
    expect(toOpenAIChatChunk({ type: "delta", content: "Hi", token_ids: [10], logprobs: [] }, ctx)).toMatchObject({
      choices: [{ index: 0, delta: { content: "Hi" }, finish_reason: null }],
    });
  });

  it("keeps the logprob of a token that shows nothing when the client asked for logprobs (one per generated token, as non-streamed)", () => {
    const piece = { type: "delta" as const, token_ids: [9], logprobs: [{ token: "\ufffd", logprob: -0.25, bytes: [240, 159], top_logprobs: [] }] };
    expect(toOpenAIChatChunk(piece, ctx)).toBeNull();
    expect(toOpenAIChatChunk(piece, { ...ctx, clientLogprobs: { top_logprobs: 0 } })).toMatchObject({
      choices: [{ index: 0, delta: {}, logprobs: { content: [{ logprob: -0.25 }] }, finish_reason: null }],
    });
  });

  it("accumulates a stream into the same result a non-streaming call gives", () => {
    const acc = new StreamAccumulator();
    acc.push({ type: "start", prompt_ids: [1, 2, 3] });
    acc.push({ type: "delta", reasoning: "th", token_ids: [], logprobs: [] });
    acc.push({ type: "delta", reasoning: "ink", token_ids: [], logprobs: [] });
    acc.push({ type: "delta", content: "Hi", token_ids: [10], logprobs: [result.logprobs[0]!] });
    acc.push({ type: "delta", content: "!", token_ids: [11], logprobs: [result.logprobs[1]!] });
    acc.push({ type: "delta", token_ids: [151645], logprobs: [result.logprobs[2]!] });
    acc.push({ type: "finish", finish_reason: "stop", stop_reason: null });
    acc.push({ type: "usage", usage: result.usage });
    expect(acc.isFinished).toBe(true);
    expect(acc.result()).toEqual(result);
  });

  it("keeps the weight version the engine tells with its finish, through a whole answer told as events and back", () => {
    const acc = new StreamAccumulator();
    for (const event of resultAsEvents({ ...result, engine_weight_version: "step-7" })) acc.push(event);
    expect(acc.result()).toEqual({ ...result, engine_weight_version: "step-7" });
    const none = new StreamAccumulator();
    for (const event of resultAsEvents(result)) none.push(event);
    expect(none.result()).not.toHaveProperty("engine_weight_version");
  });

  it("assembles streamed tool calls by index", () => {
    const acc = new StreamAccumulator();
    acc.push({ type: "delta", tool_calls: [{ index: 0, id: "t1", type: "function", function: { name: "shell" } }], token_ids: [], logprobs: [] });
    acc.push({ type: "delta", tool_calls: [{ index: 0, function: { arguments: '{"command": ' } }], token_ids: [], logprobs: [] });
    acc.push({ type: "delta", tool_calls: [{ index: 0, function: { arguments: '"ls"}' } }], token_ids: [], logprobs: [] });
    expect(acc.result().message.tool_calls).toEqual([{ id: "t1", type: "function", function: { name: "shell", arguments: '{"command": "ls"}' } }]);
    expect(acc.result().message.content).toBeNull();
  });

  it("takes a delta of any length (a whole long answer arriving as one delta, as a replayed call's does)", () => {
    const n = 300_000; // past what a spread argument list can carry
    const acc = new StreamAccumulator();
    acc.push({ type: "start", prompt_ids: [1] });
    acc.push({ type: "delta", content: "x", token_ids: Array.from({ length: n }, (_, i) => i % 1000), logprobs: Array.from({ length: n }, () => ({ token: "x", logprob: -0.5, bytes: null, top_logprobs: [] })) });
    acc.push({ type: "finish", finish_reason: "length", stop_reason: null });
    expect(acc.result().output_ids).toHaveLength(n);
    expect(acc.result().logprobs).toHaveLength(n);
  });
});

describe("applySessionSampling", () => {
  it("lets the session's pinned sampling win and caps max_tokens", () => {
    expect(applySessionSampling({ temperature: 0, max_tokens: 9000, seed: 1 }, { temperature: 1, top_p: 0.9, max_tokens: 4096 })).toEqual({
      temperature: 1,
      top_p: 0.9,
      max_tokens: 4096,
      seed: 1,
    });
    expect(applySessionSampling({ max_tokens: 100 }, { max_tokens: 4096 }).max_tokens).toBe(100);
  });

  it("keeps the agent's stop strings beside the session's (each once)", () => {
    expect(applySessionSampling({ stop: ["Observation:", "END"] }, { stop: ["END"] }).stop).toEqual(["END", "Observation:"]);
    expect(applySessionSampling({ stop: ["Observation:"] }, {}).stop).toEqual(["Observation:"]);
    expect(applySessionSampling({}, { stop: ["END"] }).stop).toEqual(["END"]);
  });
});

describe("fromOpenAIChat round trip (property)", () => {
  // Random valid chat conversations: no message, tool call or argument may be lost or altered.
  const jsonValue = fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown);
  const args = fc.dictionary(fc.string({ minLength: 1, maxLength: 8 }), jsonValue, { maxKeys: 4 }).map((o) => JSON.stringify(o));
  const text = fc.string({ maxLength: 30 });
  const parts = fc.array(fc.record({ type: fc.constant("text" as const), text }), { minLength: 1, maxLength: 3 });
  const toolCall = fc.record({ id: fc.uuid(), type: fc.constant("function" as const), function: fc.record({ name: fc.stringMatching(/^[a-z_]{1,12}$/), arguments: args }) });
  const message = fc.oneof(
    fc.record({ role: fc.constant("system" as const), content: fc.oneof(text, parts) }),
    fc.record({ role: fc.constant("user" as const), content: fc.oneof(text, parts) }),
    fc.record({ role: fc.constant("assistant" as const), content: fc.option(text, { nil: null }), tool_calls: fc.array(toolCall, { maxLength: 3 }) }),
    fc.record({ role: fc.constant("tool" as const), tool_call_id: fc.uuid(), content: fc.oneof(text, parts) }),
  );
  const joined = (c: string | { text: string }[] | null) => (c === null ? null : typeof c === "string" ? c : c.map((p) => p.text).join(""));

  it("keeps every message, tool call and argument", () => {
    fc.assert(
      fc.property(fc.array(message, { minLength: 1, maxLength: 8 }), fc.boolean(), (messages, stream) => {
        const { canonical } = fromOpenAIChat({ model: "m", messages, stream });
        expect(canonical.stream).toBe(stream);
        expect(canonical.messages).toHaveLength(messages.length);
        canonical.messages.forEach((m, i) => {
          const src = messages[i]!;
          expect(m.role).toBe(src.role);
          if (src.role === "assistant" && m.role === "assistant") {
            expect(m.content).toEqual(src.content);
            expect(m.tool_calls ?? []).toEqual(src.tool_calls);
          } else if (src.role === "tool" && m.role === "tool") {
            expect(m.tool_call_id).toBe(src.tool_call_id);
            expect(m.content).toBe(joined(src.content));
          } else if (src.role === "system") {
            expect(m.content).toBe(joined(src.content));
          } else {
            expect(m.content).toEqual(src.content);
          }
        });
      }),
      { numRuns: 300 },
    );
  });
});

// Real agent CLIs' requests, recorded through rollgate (__fixtures__/agent-requests/README.md).
const recorded = agentRequests("openai_chat");

describe("recorded agent requests (OpenAI chat)", () => {
  it("hold a main turn and a tool-result turn of every CLI that speaks chat completions", () => {
    expect(recorded.map((r) => `${r.cli}.${r.kind}`)).toEqual(
      expect.arrayContaining(["qwen-code", "opencode", "pi"].flatMap((cli) => [`${cli}.main`, `${cli}.tool-result`])),
    );
  });

  // The gateway's route parses the body once (its schema) and converts that: the same call as
  // parsing here, so a body's meaning does not depend on which entry point read it.
  it.each(recorded.map((r) => [r.file, r] as const))("%s: the body the route validated converts to the same call", (_file, { body }) => {
    expect(fromValidOpenAIChat(OpenAIChatRequest.parse(body))).toEqual(fromOpenAIChat(body));
  });

  it("refuses top_logprobs without logprobs from a validated body too", () => {
    const body = OpenAIChatRequest.parse({ messages: [{ role: "user", content: "hi" }], top_logprobs: 2 });
    expect(() => fromValidOpenAIChat(body)).toThrow(/top_logprobs requires logprobs: true/);
  });

  it.each(recorded.map((r) => [r.file, r] as const))("accepts %s and keeps every message and tool", (_file, { body: raw }) => {
    type Call = { id: string; function: { name: string; arguments: string } };
    const body = raw as { messages: { role: string; content?: unknown; tool_calls?: Call[]; tool_call_id?: string }[]; tools?: { function: { name: string } }[] };
    const { canonical } = fromOpenAIChat(body);
    expect(canonical.messages).toHaveLength(body.messages.length);
    canonical.messages.forEach((m, i) => expect(m.role).toBe(body.messages[i]!.role === "developer" ? "system" : body.messages[i]!.role));
    expect(canonical.tools?.map((t) => t.function.name) ?? []).toEqual((body.tools ?? []).map((t) => t.function.name));
    // Every call with its id, name and arguments; every result paired with its call.
    const calls = body.messages.flatMap((m) => m.tool_calls ?? []);
    expect(canonical.messages.flatMap((m) => (m.role === "assistant" ? (m.tool_calls ?? []) : [])).map((t) => [t.id, t.function.name, t.function.arguments])).toEqual(
      calls.map((t) => [t.id, t.function.name, t.function.arguments]),
    );
    expect(canonical.messages.flatMap((m) => (m.role === "tool" ? [m.tool_call_id] : []))).toEqual(body.messages.flatMap((m) => (m.role === "tool" ? [m.tool_call_id] : [])));
  });
});
