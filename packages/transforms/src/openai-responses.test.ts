import fc from "fast-check";
import type { AssistantOutput, ChatMessage } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { ZodError } from "zod";
import { agentRequests } from "./__fixtures__/agent-requests.js";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";
import {
  ResponsesStreamEncoder,
  fromResponses,
  namespacedToolName,
  responsesSseFrame,
  toResponsesOutput,
  toResponsesResponse,
  type ResponsesContext,
  type ResponsesStreamEvent,
} from "./openai-responses.js";
import { openReasoning, sealReasoning } from "./reasoning-seal.js";

const KEY = "session-token-hash";

/** A Codex-shaped second turn (our own text): developer prompts, namespace and hosted tools, the replayed turn. */
function codexLikeSecondTurn(key = KEY) {
  return {
    model: "gpt-agent",
    instructions: "",
    input: [
      { type: "message", role: "developer", content: [{ type: "input_text", text: "You are a careful agent." }] },
      {
        type: "message",
        role: "developer",
        content: [
          { type: "input_text", text: "<rules>a</rules>" },
          { type: "input_text", text: "<rules>b</rules>" },
        ],
      },
      { type: "message", role: "user", content: [{ type: "input_text", text: "Make out.txt" }] },
      { type: "reasoning", id: "rs_1", summary: [{ type: "summary_text", text: "not trusted" }], encrypted_content: sealReasoning(key, "I should run a command.") },
      { type: "function_call", id: "fc_1", call_id: "call_1", name: "exec_command", arguments: '{"cmd":"echo hi > out.txt"}', status: "completed" },
      { type: "function_call", id: "fc_2", call_id: "call_2", name: "spawn_agent", namespace: "multi_agent", arguments: "{}" },
      { type: "function_call_output", call_id: "call_1", output: "exit 0" },
      { type: "function_call_output", call_id: "call_2", output: [{ type: "input_text", text: "spawned" }] },
    ],
    tools: [
      { type: "function", name: "exec_command", description: "Run a command", strict: false, parameters: { type: "object", properties: { cmd: { type: "string" } } } },
      {
        type: "namespace",
        name: "multi_agent",
        description: "Sub-agents",
        tools: [
          { type: "function", name: "spawn_agent", description: "Spawn", strict: false, parameters: { type: "object", properties: {} } },
          { type: "function", name: "wait_agent", parameters: { type: "object", properties: {} } },
        ],
      },
      { type: "web_search", external_web_access: true },
    ],
    tool_choice: "auto",
    parallel_tool_calls: true,
    reasoning: { summary: "auto" },
    store: false,
    include: ["reasoning.encrypted_content"],
    prompt_cache_key: "k",
    client_metadata: { turn: "1" },
    stream: true,
  };
}

describe("fromResponses", () => {
  it("turns a Codex-shaped body into the canonical request", () => {
    const call = fromResponses(codexLikeSecondTurn(), { reasoningKey: KEY });
    expect(call.clientModel).toBe("gpt-agent");
    expect(call.canonical).toEqual({
      messages: [
        { role: "system", content: [{ type: "text", text: "You are a careful agent." }] },
        {
          role: "system",
          content: [
            { type: "text", text: "<rules>a</rules>" },
            { type: "text", text: "<rules>b</rules>" },
          ],
        },
        { role: "user", content: [{ type: "text", text: "Make out.txt" }] },
        {
          role: "assistant",
          content: "",
          reasoning: "I should run a command.",
          tool_calls: [
            { id: "call_1", type: "function", function: { name: "exec_command", arguments: '{"cmd":"echo hi > out.txt"}' } },
            { id: "call_2", type: "function", function: { name: "multi_agent__spawn_agent", arguments: "{}" } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "exit 0" },
        { role: "tool", tool_call_id: "call_2", content: [{ type: "text", text: "spawned" }] },
      ],
      tools: [
        {
          type: "function",
          function: { name: "exec_command", description: "Run a command", strict: false, parameters: { type: "object", properties: { cmd: { type: "string" } } } },
        },
        { type: "function", function: { name: "multi_agent__spawn_agent", description: "Spawn", strict: false, parameters: { type: "object", properties: {} } } },
        { type: "function", function: { name: "multi_agent__wait_agent", parameters: { type: "object", properties: {} } } },
      ],
      tool_choice: "auto",
      sampling: {},
      stream: true,
      client_logprobs: null,
    });
    expect([...call.namespaced.entries()]).toEqual([
      ["multi_agent__spawn_agent", { namespace: "multi_agent", name: "spawn_agent" }],
      ["multi_agent__wait_agent", { namespace: "multi_agent", name: "wait_agent" }],
    ]);
    expect(namespacedToolName("a", "b")).toBe("a__b");
  });

  it("ignores reasoning it cannot open (another key, tampered, or none) and never trusts the summary", () => {
    for (const encrypted_content of [sealReasoning("other-session", "forged"), "AAAA", null, undefined]) {
      const body = codexLikeSecondTurn();
      body.input[3] = { type: "reasoning", id: "rs_1", summary: [{ type: "summary_text", text: "claimed" }], encrypted_content } as never;
      const m = fromResponses(body, { reasoningKey: KEY }).canonical.messages[3];
      expect(m).toMatchObject({ role: "assistant", content: "" });
      expect(m).not.toHaveProperty("reasoning");
    }
    // Without a key nothing can be opened either.
    expect(fromResponses(codexLikeSecondTurn()).canonical.messages[3]).not.toHaveProperty("reasoning");
  });

  it("folds reasoning + message + function calls of one turn into one assistant message, and splits turns", () => {
    const call = fromResponses(
      {
        instructions: "Be brief.",
        input: [
          { role: "user", content: "q1" },
          { type: "reasoning", summary: [], encrypted_content: sealReasoning(KEY, "think 1") },
          { type: "message", role: "assistant", content: [{ type: "output_text", text: "Let me look.", annotations: [] }] },
          { type: "function_call", call_id: "c1", name: "read", arguments: '{"path":"a"}' },
          { type: "function_call_output", call_id: "c1", output: "A" },
          { type: "reasoning", summary: [], encrypted_content: sealReasoning(KEY, "think 2") },
          { type: "message", role: "assistant", content: [{ type: "output_text", text: "It says A." }] },
          // A second answer with no user turn between: a new assistant message.
          { type: "message", role: "assistant", content: "Anything else?" },
          { role: "user", content: "no" },
        ],
        reasoning: { effort: "high" },
        max_output_tokens: 100,
        temperature: 0.5,
        top_p: 0.9,
      },
      { reasoningKey: KEY },
    );
    expect(call.canonical.messages).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: "q1" },
      {
        role: "assistant",
        content: "Let me look.",
        reasoning: "think 1",
        tool_calls: [{ id: "c1", type: "function", function: { name: "read", arguments: '{"path":"a"}' } }],
      },
      { role: "tool", tool_call_id: "c1", content: "A" },
      { role: "assistant", content: "It says A.Anything else?", reasoning: "think 2" },
      { role: "user", content: "no" },
    ] satisfies ChatMessage[]);
    expect(call.canonical.sampling).toEqual({ max_tokens: 100, temperature: 0.5, top_p: 0.9 });
    expect(call.canonical.enable_thinking).toBe(true);
    expect(call.canonical.stream).toBe(false);
  });

  it("keeps a message item after calls (text a streamed answer wrote after them) in their turn, until a tool output", () => {
    const text = (t: string) => ({ type: "message", role: "assistant", content: [{ type: "output_text", text: t, annotations: [] }] });
    const call = (id: string) => ({ type: "function_call", call_id: id, name: "shell", arguments: "{}" });
    const got = fromResponses({
      input: [{ role: "user", content: "q" }, text("Looking.\n"), call("c1"), text("\nbetween\n"), call("c2"), text("\nAfter."), { type: "function_call_output", call_id: "c1", output: "A" }, { type: "function_call_output", call_id: "c2", output: "B" }],
    }).canonical.messages;
    expect(got.map((m) => m.role)).toEqual(["user", "assistant", "tool", "tool"]);
    expect(got[1]).toMatchObject({ content: "Looking.\n\nbetween\n\nAfter.", tool_calls: [{ id: "c1" }, { id: "c2" }] });
  });

  it("accepts opencode's and pi's requests (agent suite): type-less system and user items, id-less calls, store", () => {
    // Shapes the real CLIs sent through the gateway in test/e2e-agents (our own text): the system
    // prompt as a `role: "system"` item, items without `type` or `id`, `store: false` and
    // `prompt_cache_key` (ignored on purpose: the gateway keeps no response state, and caching
    // is the engine's prefix cache).
    const call = fromResponses(
      {
        model: "rollgate-policy",
        input: [
          { role: "system", content: "You are a coding agent." },
          { role: "user", content: [{ type: "input_text", text: "Write the file." }] },
          { type: "reasoning", summary: [{ type: "summary_text", text: "shown, not trusted" }], encrypted_content: sealReasoning(KEY, "I will use bash.") },
          { type: "function_call", call_id: "c1", name: "bash", arguments: '{"command":"ls"}' },
          { type: "function_call_output", call_id: "c1", output: "(no output)" },
        ],
        tools: [{ type: "function", name: "bash", description: "Run", parameters: { type: "object", properties: { command: { type: "string" } } }, strict: false }],
        tool_choice: "auto",
        max_output_tokens: 32000,
        store: false,
        prompt_cache_key: "ses_1",
        stream: true,
      },
      { reasoningKey: KEY },
    );
    expect(call.canonical.messages).toEqual([
      { role: "system", content: "You are a coding agent." },
      { role: "user", content: [{ type: "text", text: "Write the file." }] },
      { role: "assistant", content: "", reasoning: "I will use bash.", tool_calls: [{ id: "c1", type: "function", function: { name: "bash", arguments: '{"command":"ls"}' } }] },
      { role: "tool", tool_call_id: "c1", content: "(no output)" },
    ] satisfies ChatMessage[]);
    expect(call.canonical.sampling).toEqual({ max_tokens: 32000 });
    expect(call.canonical.tool_choice).toBe("auto");
    expect(call.canonical.stream).toBe(true);
    expect(call.canonical).not.toHaveProperty("store");
  });

  it("maps reasoning.effort, tool_choice forms and string input", () => {
    const base = { input: "hi", tools: [{ type: "function", name: "f" }, { type: "namespace", name: "n", tools: [{ type: "function", name: "g" }] }] };
    expect(fromResponses({ ...base, reasoning: { effort: "none" } }).canonical.enable_thinking).toBe(false);
    expect(fromResponses({ ...base, reasoning: { effort: "minimal" } }).canonical.enable_thinking).toBe(false);
    expect(fromResponses({ ...base, reasoning: { effort: "low" } }).canonical.enable_thinking).toBe(true);
    expect(fromResponses({ ...base, reasoning: { summary: "auto" } }).canonical).not.toHaveProperty("enable_thinking");
    expect(fromResponses(base).canonical.messages).toEqual([{ role: "user", content: "hi" }]);
    const choice = (tool_choice: unknown) => fromResponses({ ...base, tool_choice }).canonical.tool_choice;
    expect(choice("required")).toBe("required");
    expect(choice({ type: "function", name: "f" })).toEqual({ type: "function", function: { name: "f" } });
    expect(choice({ type: "function", name: "g", namespace: "n" })).toEqual({ type: "function", function: { name: "n__g" } });
    expect(choice({ type: "allowed_tools", mode: "required", tools: [] })).toBe("required");
    expect(choice({ type: "web_search" })).toBeUndefined();
    // Only hosted tools: nothing offered, no tool_choice; forcing a call then is a 400.
    const hosted = (tool_choice: unknown) => fromResponses({ input: "hi", tools: [{ type: "web_search" }, { type: "file_search", vector_store_ids: [] }], tool_choice });
    expect(hosted("auto").canonical).not.toHaveProperty("tools");
    expect(hosted("auto").canonical).not.toHaveProperty("tool_choice");
    expect(() => hosted("required")).toThrow(/forces a tool call, but no function tool is offered/);
    expect(() => hosted({ type: "web_search" })).toThrow(/no function tool is offered/);
  });

  it("names the bad field, and refuses previous_response_id with a clear message", () => {
    const issues = (body: unknown) => {
      try {
        fromResponses(body);
      } catch (err) {
        expect(err).toBeInstanceOf(ZodError);
        return (err as ZodError).issues.map((i) => [i.path.join("."), i.message] as const);
      }
      throw new Error("accepted a bad body");
    };
    const prev = issues({ input: "hi", previous_response_id: "resp_1" });
    expect(prev[0]![0]).toBe("previous_response_id");
    expect(prev[0]![1]).toMatch(/not supported.*resend the whole conversation in input/);
    expect(issues({ input: "hi", temperature: "warm" })[0]![0]).toBe("temperature");
    expect(issues({})[0]![0]).toBe("input");
    expect(issues({ input: [{ type: "computer_call_output", call_id: "x" }] })[0]).toEqual(["input.0.type", expect.stringMatching(/unsupported input item type/)]);
    expect(issues({ input: [{ type: "item_reference", id: "msg_1" }] })[0]![1]).toMatch(/item_reference is not supported/);
    expect(issues({ input: [{ type: "function_call", call_id: "c", arguments: "{}" }] })[0]![0]).toBe("input.0.name");
    expect(issues({ input: "x", tools: [{ type: "function" }] })[0]![0]).toBe("tools.0.name");
    expect(issues({ input: "x", tools: [{ type: "namespace", name: "n", tools: [{ type: "function", name: 3 }] }] })[0]![0]).toBe("tools.0.tools.0.name");
    expect(issues({ input: [{ role: "user", content: [{ type: "input_file", file_id: "f" }] }] })[0]![0]).toBe("input.0.content.0.type");
    expect(issues({ input: [] })[0]![0]).toBe("input");
  });

  // Real agent CLIs' requests, recorded through rollgate (__fixtures__/agent-requests/README.md).
  const fixtures = agentRequests("openai_responses");
  it("accepts every Responses request a real agent sent, keeping every item and tool", () => {
    expect(fixtures.map((f) => `${f.cli}.${f.kind}`)).toEqual(
      expect.arrayContaining(["codex", "opencode", "pi"].flatMap((cli) => [`${cli}.main`, `${cli}.tool-result`])),
    );
    for (const { body, reasoning_key } of fixtures) {
      const call = fromResponses(body, { reasoningKey: reasoning_key });
      const input = body.input as { type?: string; role?: string }[];
      const msgs = call.canonical.messages;
      // Every non-assistant item is one message; assistant items (function calls here) fold into turns.
      const plain = input.filter((i) => i.type !== "function_call" && i.type !== "reasoning" && i.role !== "assistant");
      expect(msgs.filter((m) => m.role !== "assistant")).toHaveLength(plain.length + (body.instructions ? 1 : 0));
      const calls = input.filter((i) => i.type === "function_call") as { call_id: string; arguments: string }[];
      const got = msgs.flatMap((m) => (m.role === "assistant" ? (m.tool_calls ?? []) : []));
      expect(got.map((c) => [c.id, c.function.arguments])).toEqual(calls.map((c) => [c.call_id, c.arguments]));
      const outputs = input.filter((i) => i.type === "function_call_output") as { call_id: string }[];
      expect(msgs.flatMap((m) => (m.role === "tool" ? [m.tool_call_id] : []))).toEqual(outputs.map((o) => o.call_id));
      // The reasoning the gateway sealed comes back trusted, one turn each.
      expect(msgs.filter((m) => m.role === "assistant" && m.reasoning)).toHaveLength(input.filter((i) => i.type === "reasoning").length);
      const tools = (body.tools ?? []) as { type: string; name?: string; tools?: { type: string; name: string }[] }[];
      const expected = tools.flatMap((t) => (t.type === "function" ? [t.name] : t.type === "namespace" ? t.tools!.map((x) => `${t.name}__${x.name}`) : []));
      expect(call.canonical.tools?.map((t) => t.function.name) ?? []).toEqual(expected);
      expect(call.canonical.tools?.some((t) => t.function.name.includes("web_search")) ?? false).toBe(false);
    }
  });
});

const ctx = (namespaced: ResponsesContext["namespaced"] = new Map()): ResponsesContext => ({
  id: "resp_abc",
  createdAt: 1700000000,
  model: "gpt-agent",
  reasoningKey: KEY,
  namespaced,
  echo: { parallel_tool_calls: true, tool_choice: "auto", temperature: null, top_p: null, max_output_tokens: null, reasoning: { effort: null, summary: "auto" } },
  // Qwen3's marker, as the gateway passes it from the engine's model profile.
  reasoningEnd: "</think>",
});

const lp = (token: string) => ({ token, logprob: -0.5, bytes: null, top_logprobs: [] });

function engineResult(message: AssistantOutput, tokens: string[], finish = "stop"): EngineResult {
  return {
    prompt_ids: [1, 2, 3],
    output_ids: tokens.map((_, i) => 100 + i),
    output_logprobs: tokens.map(() => -0.5),
    logprobs: tokens.map(lp),
    message,
    finish_reason: finish,
    stop_reason: null,
    usage: { prompt_tokens: 3, completion_tokens: tokens.length, cached_tokens: 2 },
  };
}

const thinkAndCall = engineResult(
  {
    content: "\n\n",
    reasoning: "Run it.",
    tool_calls: [
      { id: "chatcmpl-tool-1", type: "function", function: { name: "exec_command", arguments: '{"cmd": "ls"}' } },
      { id: "chatcmpl-tool-2", type: "function", function: { name: "multi_agent__spawn_agent", arguments: "{}" } },
    ],
  },
  ["<think>", "\n", "Run", " it", ".\n", "</think>", "\n\n", "<tool_call>", "…", "</tool_call>", "<|im_end|>"],
  "tool_calls",
);
const namespaced = new Map([["multi_agent__spawn_agent", { namespace: "multi_agent", name: "spawn_agent" }]]);

describe("toResponsesResponse", () => {
  it("builds the response object: sealed reasoning, no whitespace message, namespaced calls mapped back", () => {
    const r = toResponsesResponse(thinkAndCall, ctx(namespaced));
    expect(r).toEqual({
      id: "resp_abc",
      object: "response",
      created_at: 1700000000,
      status: "completed",
      error: null,
      incomplete_details: null,
      model: "gpt-agent",
      output: [
        { id: "rs_abc", type: "reasoning", summary: [{ type: "summary_text", text: "Run it." }], encrypted_content: sealReasoning(KEY, "Run it.") },
        { id: "fc_abc_0", type: "function_call", status: "completed", call_id: "chatcmpl-tool-1", name: "exec_command", arguments: '{"cmd": "ls"}' },
        { id: "fc_abc_1", type: "function_call", status: "completed", call_id: "chatcmpl-tool-2", name: "spawn_agent", namespace: "multi_agent", arguments: "{}" },
      ],
      parallel_tool_calls: true,
      tool_choice: "auto",
      temperature: null,
      top_p: null,
      max_output_tokens: null,
      previous_response_id: null,
      reasoning: { effort: null, summary: "auto" },
      store: false,
      text: { format: { type: "text" } },
      truncation: "disabled",
      metadata: {},
      usage: {
        input_tokens: 3,
        input_tokens_details: { cached_tokens: 2 },
        output_tokens: 11,
        output_tokens_details: { reasoning_tokens: 6 },
        total_tokens: 14,
      },
    });
    expect(openReasoning(KEY, (r.output[0] as { encrypted_content: string }).encrypted_content)).toBe("Run it.");
    // A model whose profile has no reasoning end marker: the count is not known, so 0.
    expect(toResponsesResponse(thinkAndCall, { ...ctx(namespaced), reasoningEnd: null }).usage?.output_tokens_details.reasoning_tokens).toBe(0);
  });

  it("gives a text answer as a message item, and a length stop as incomplete", () => {
    const r = toResponsesResponse(engineResult({ content: "Hello", reasoning: null, tool_calls: [] }, ["Hello"], "length"), ctx());
    expect(r.status).toBe("incomplete");
    expect(r.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(r.output).toEqual([
      { id: "msg_abc", type: "message", status: "incomplete", role: "assistant", content: [{ type: "output_text", text: "Hello", annotations: [], logprobs: [] }] },
    ]);
    expect(r.usage?.output_tokens_details.reasoning_tokens).toBe(0);
  });
});

describe("reasoning tokens of a replayed answer (its logprobs carry no token text)", () => {
  const replayed = (usage: Partial<EngineResult["usage"]> = {}): EngineResult => {
    const r = engineResult({ content: "\n\nHi", reasoning: "Greet.", tool_calls: [] }, ["", "", "", "", "", ""]);
    return { ...r, usage: { ...r.usage, ...usage } };
  };

  it("reports the count its source recorded, streamed or not", () => {
    const r = replayed({ reasoning_tokens: 3 });
    expect(toResponsesResponse(r, ctx()).usage?.output_tokens_details.reasoning_tokens).toBe(3);
    const events = encode(streamOf(r, [delta({ reasoning: "Greet.", content: "\n\nHi" }, ["", "", "", "", "", ""])]), ctx());
    expect(events.at(-1)!.response).toMatchObject({ usage: { output_tokens: 6, output_tokens_details: { reasoning_tokens: 3 } } });
  });

  it("reports none rather than every token when no count was recorded (a record from before counts were kept)", () => {
    expect(toResponsesResponse(replayed(), ctx()).usage?.output_tokens_details.reasoning_tokens).toBe(0);
  });
});

/** Splits an engine result into the stream events an adapter would yield. */
function streamOf(result: EngineResult, pieces: EngineStreamEvent[]): EngineStreamEvent[] {
  return [
    { type: "start", prompt_ids: result.prompt_ids },
    ...pieces,
    { type: "finish", finish_reason: result.finish_reason, stop_reason: null },
    { type: "usage", usage: result.usage },
  ];
}

function encode(events: EngineStreamEvent[], c: ResponsesContext): ResponsesStreamEvent[] {
  const enc = new ResponsesStreamEncoder(c);
  return [...enc.start(), ...events.flatMap((e) => enc.push(e)), ...enc.end()];
}

const delta = (fields: Partial<Extract<EngineStreamEvent, { type: "delta" }>>, tokens: string[]): EngineStreamEvent => ({
  type: "delta",
  token_ids: tokens.map((_, i) => 100 + i),
  logprobs: tokens.map(lp),
  ...fields,
});

describe("ResponsesStreamEncoder", () => {
  it("streams a text answer as the exact Responses event sequence", () => {
    const result = engineResult({ content: "Hi there", reasoning: null, tool_calls: [] }, ["Hi", " there", "<|im_end|>"]);
    const events = encode(streamOf(result, [delta({ content: "Hi" }, ["Hi"]), delta({ content: " there" }, [" there"]), delta({}, ["<|im_end|>"])]), ctx());
    expect(events.map((e) => e.type)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    expect(events[2]).toEqual({
      type: "response.output_item.added",
      sequence_number: 2,
      output_index: 0,
      item: { id: "msg_abc", type: "message", status: "in_progress", role: "assistant", content: [] },
    });
    expect(events[4]).toEqual({
      type: "response.output_text.delta",
      sequence_number: 4,
      item_id: "msg_abc",
      output_index: 0,
      content_index: 0,
      delta: "Hi",
      logprobs: [],
    });
    expect(events[6]).toMatchObject({ text: "Hi there" });
    expect(events[0]).toMatchObject({ response: { status: "in_progress", output: [], usage: null } });
    expect(events.at(-1)).toEqual({ type: "response.completed", sequence_number: 9, response: toResponsesResponse(result, ctx()) });
    expect(responsesSseFrame(events[4]!)).toBe(`event: response.output_text.delta\ndata: ${JSON.stringify(events[4])}\n\n`);
  });

  it("streams reasoning then function calls; the final response equals the non-streamed one", () => {
    const c = ctx(namespaced);
    const events = encode(
      streamOf(thinkAndCall, [
        delta({ reasoning: "Run" }, ["<think>", "\n", "Run"]),
        delta({ reasoning: " it." }, [" it", ".\n", "</think>"]),
        delta({ content: "\n\n" }, ["\n\n"]),
        delta({ tool_calls: [{ index: 0, id: "chatcmpl-tool-1", type: "function", function: { name: "exec_command", arguments: "" } }] }, ["<tool_call>"]),
        delta({ tool_calls: [{ index: 0, function: { arguments: '{"cmd": ' } }] }, ["…"]),
        delta({ tool_calls: [{ index: 0, function: { arguments: '"ls"}' } }] }, ["…"]),
        delta({ tool_calls: [{ index: 1, id: "chatcmpl-tool-2", type: "function", function: { name: "multi_agent__spawn_agent", arguments: "{}" } }] }, ["</tool_call>"]),
        delta({}, ["<|im_end|>"]),
      ]),
      c,
    );
    expect(events.map((e) => e.type)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.reasoning_summary_part.added",
      "response.reasoning_summary_text.delta",
      "response.reasoning_summary_text.delta",
      "response.reasoning_summary_text.done",
      "response.reasoning_summary_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(events[3]).toEqual({
      type: "response.reasoning_summary_part.added",
      sequence_number: 3,
      item_id: "rs_abc",
      output_index: 0,
      summary_index: 0,
      part: { type: "summary_text", text: "" },
    });
    expect(events[4]).toMatchObject({ item_id: "rs_abc", summary_index: 0, delta: "Run" });
    expect(events[9]).toMatchObject({
      output_index: 1,
      item: { id: "fc_abc_0", type: "function_call", status: "in_progress", call_id: "chatcmpl-tool-1", name: "exec_command", arguments: "" },
    });
    expect(events[12]).toMatchObject({ item_id: "fc_abc_0", output_index: 1, name: "exec_command", arguments: '{"cmd": "ls"}' });
    expect(events[14]).toMatchObject({ output_index: 2, item: { name: "spawn_agent", namespace: "multi_agent" } });
    expect(events.at(-1)!.response).toEqual(toResponsesResponse(thinkAndCall, c));
  });

  it("does not show the template's newlines after reasoning, streamed or not", () => {
    const result = engineResult({ content: "\n\nHi", reasoning: "Greet.", tool_calls: [] }, ["<think>", "Greet.", "</think>", "\n\n", "Hi", "<|im_end|>"]);
    const events = encode(
      streamOf(result, [
        delta({ reasoning: "Greet." }, ["<think>", "Greet.", "</think>"]),
        delta({ content: "\n\n" }, ["\n\n"]),
        delta({ content: "Hi" }, ["Hi"]),
        delta({}, ["<|im_end|>"]),
      ]),
      ctx(),
    );
    const final = toResponsesResponse(result, ctx());
    expect(final.output[1]).toMatchObject({ type: "message", content: [{ text: "Hi" }] });
    expect(events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta)).toEqual(["Hi"]);
    expect(events.at(-1)!.response).toEqual(final);
    // Replayed, it is the same assistant turn (the template lstrips the content after reasoning).
    const replay = fromResponses({ input: [{ role: "user", content: "hi" }, ...final.output] }, { reasoningKey: KEY });
    expect(replay.canonical.messages[1]).toEqual({ role: "assistant", content: "Hi", reasoning: "Greet." });
  });

  it("keeps the newlines of text after a call that follows reasoning (only the template's after </think> are not shown); replayed, the turn's text is whole", () => {
    const call = { id: "c1", type: "function" as const, function: { name: "shell", arguments: '{"command": "ls"}' } };
    const result = engineResult({ content: "\n\nBefore.\n\nAfter.", reasoning: "Plan.", tool_calls: [call] }, ["<think>", "Plan.", "</think>", "\n\n", "Before.\n", "<tool_call>", "\nAfter.", "<|im_end|>"]);
    const events = encode(
      streamOf(result, [
        delta({ reasoning: "Plan." }, ["<think>", "Plan.", "</think>"]),
        delta({ content: "\n\nBefore.\n" }, ["\n\n", "Before.\n"]),
        delta({ tool_calls: [{ index: 0, id: "c1", type: "function", function: { name: "shell", arguments: '{"command": "ls"}' } }] }, ["<tool_call>"]),
        delta({ content: "\nAfter." }, ["\nAfter."]),
        delta({}, ["<|im_end|>"]),
      ]),
      ctx(),
    );
    expect(events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta)).toEqual(["Before.\n", "\nAfter."]);
    const output = (events.at(-1)!.response as { output: unknown[] }).output;
    const replay = fromResponses({ input: [{ role: "user", content: "hi" }, ...output] } as never, { reasoningKey: KEY });
    expect(replay.canonical.messages[1]).toMatchObject({ role: "assistant", content: "Before.\n\nAfter.", reasoning: "Plan." });
  });

  it("gives an empty answer as a message with empty text, streamed or not, so the agent sends the turn back", () => {
    const result = engineResult({ content: "", reasoning: null, tool_calls: [] }, []);
    const final = toResponsesResponse(result, ctx());
    expect(final.output).toEqual([expect.objectContaining({ type: "message", role: "assistant", content: [expect.objectContaining({ type: "output_text", text: "" })] })]);
    const events = encode(streamOf(result, []), ctx());
    expect(events.at(-1)!.response).toEqual(final);
    const replay = fromResponses({ input: [{ role: "user", content: "hi" }, ...final.output, { role: "user", content: "go on" }] }, { reasoningKey: KEY });
    expect(replay.canonical.messages).toEqual([
      { role: "user", content: "hi" },
      { role: "assistant", content: "" },
      { role: "user", content: "go on" },
    ]);
  });

  it("ends an answer cut at max_output_tokens with response.incomplete", () => {
    const result = engineResult({ content: "Hel", reasoning: null, tool_calls: [] }, ["Hel"], "length");
    const events = encode(streamOf(result, [delta({ content: "Hel" }, ["Hel"])]), ctx());
    expect(events.at(-1)).toMatchObject({ type: "response.incomplete", response: { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } } });
    expect(events.at(-2)).toMatchObject({ type: "response.output_item.done", item: { status: "incomplete" } });
  });

  it("reports an engine failure mid-stream as response.failed", () => {
    const enc = new ResponsesStreamEncoder(ctx());
    enc.start();
    enc.push({ type: "start", prompt_ids: [1] });
    const [failed, ...rest] = enc.fail({ code: "engine_unreachable", message: "engine went away" });
    expect(rest).toEqual([]);
    expect(failed).toMatchObject({
      type: "response.failed",
      sequence_number: 2,
      response: { status: "failed", error: { code: "engine_unreachable", message: "engine went away" } },
    });
  });
});

describe("client logprobs (include: message.output_text.logprobs)", () => {
  /** A token with a distinct logprob and three alternatives, so each entry and the top_logprobs cut can be told apart. */
  const tok = (token: string, k: number) => {
    const bytes = Array.from(Buffer.from(token, "utf8"));
    return {
      token,
      logprob: -k / 8,
      bytes,
      top_logprobs: [0, 1, 2].map((j) => ({ token: `${token}#${j}`, logprob: -(k + j) / 8, bytes: null })),
    };
  };
  const lpOf = (tokens: string[]) => tokens.map((t, k) => tok(t, k));
  /** Reasoning, the template's newlines, text with a character split over two tokens, a call, the stop token. */
  const tokens = ["<think>", "Plan.", "</think>", "\n\n", "Hi", " \xe2", "\x9c\x93", ".", "\n", "<tool_call>", "{}", "</tool_call>", "<|im_end|>"];
  const logprobs = lpOf(tokens);
  // The split character: its UTF-8 bytes come in two tokens, neither of which is text alone.
  logprobs[5]!.bytes = [0x20, 0xe2];
  logprobs[6]!.bytes = [0x9c, 0x93];
  const result: EngineResult = {
    ...engineResult(
      { content: "\n\nHi \u2713.\n", reasoning: "Plan.", tool_calls: [{ id: "call_1", type: "function", function: { name: "exec", arguments: "{}" } }] },
      tokens,
      "tool_calls",
    ),
    logprobs,
  };
  const wanted = { top_logprobs: 2 };
  const cut = (l: (typeof logprobs)[number]) => ({ ...l, top_logprobs: l.top_logprobs.slice(0, 2) });
  // The text shown is "Hi ✓.\n": its tokens are "Hi", the two halves of ✓, ".", "\n"; not the reasoning,
  // its end marker, the newlines the template adds after it, the call's tokens or the stop token.
  const textLogprobs = [4, 5, 6, 7, 8].map((i) => cut(logprobs[i]!));

  it("asks the engine for them only when include names message.output_text.logprobs", () => {
    const base = { input: "hi" };
    expect(fromResponses({ ...base, include: ["message.output_text.logprobs"], top_logprobs: 3 }).canonical.client_logprobs).toEqual({ top_logprobs: 3 });
    expect(fromResponses({ ...base, include: ["reasoning.encrypted_content", "message.output_text.logprobs"] }).canonical.client_logprobs).toEqual({ top_logprobs: 0 });
    expect(fromResponses({ ...base, top_logprobs: 3 }).canonical.client_logprobs).toBeNull();
    expect(fromResponses({ ...base, include: ["reasoning.encrypted_content"] }).canonical.client_logprobs).toBeNull();
    expect(() => fromResponses({ ...base, include: ["message.output_text.logprobs"], top_logprobs: 21 })).toThrow(ZodError);
  });

  it("gives the text's tokens, one per token, with top_logprobs cut to what was asked", () => {
    const r = toResponsesResponse(result, { ...ctx(), clientLogprobs: wanted });
    expect(r.output[1]).toMatchObject({ type: "message", content: [{ type: "output_text", text: "Hi \u2713.\n" }] });
    const part = (r.output[1] as { content: { logprobs: unknown[] }[] }).content[0]!;
    expect(part.logprobs).toEqual(textLogprobs);
    // Without the include nothing changes.
    expect(toResponsesResponse(result, ctx()).output[1]).toMatchObject({ content: [{ logprobs: [] }] });
  });

  it("finds the text's tokens when the engine spells a split character's pieces as U+FFFD (vLLM's token strings)", () => {
    const spelled = logprobs.map((l) => ({ ...l }));
    spelled[5] = { ...spelled[5]!, token: " \uFFFD", bytes: Array.from(Buffer.from(" \uFFFD")) };
    spelled[6] = { ...spelled[6]!, token: "\uFFFD\uFFFD", bytes: Array.from(Buffer.from("\uFFFD\uFFFD")) };
    const r = toResponsesResponse({ ...result, logprobs: spelled }, { ...ctx(), clientLogprobs: wanted });
    expect((r.output[1] as { content: { logprobs: unknown[] }[] }).content[0]!.logprobs).toEqual([4, 5, 6, 7, 8].map((i) => cut(spelled[i]!)));
  });

  it("streams them on the text deltas that show their text; the final response equals the non-streamed one", () => {
    const c = { ...ctx(), clientLogprobs: wanted };
    const d = (fields: Parameters<typeof delta>[0], from: number, to: number): EngineStreamEvent => ({
      type: "delta",
      token_ids: tokens.slice(from, to).map((_, i) => 100 + from + i),
      logprobs: logprobs.slice(from, to),
      ...fields,
    });
    const pieces = [
      d({ reasoning: "Plan." }, 0, 2),
      d({}, 2, 3), // </think>: the parser shows nothing
      d({ content: "\n\n" }, 3, 4),
      d({ content: "Hi" }, 4, 5),
      d({ content: " " }, 5, 6), // half a character: only its space shows
      d({ content: "\u2713" }, 6, 7),
      d({ content: "." }, 7, 8),
      d({ content: "\n" }, 8, 9),
      d({ tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "exec", arguments: "{}" } }] }, 9, 12),
      d({}, 12, 13),
    ];
    const events = encode(streamOf(result, pieces), c);
    const deltas = events.filter((e) => e.type === "response.output_text.delta");
    expect(deltas.flatMap((e) => e.logprobs as unknown[])).toEqual(textLogprobs);
    // One token a delta here: "Hi", " " (half of ✓), "✓" (its other half), ".", "\n".
    expect(deltas.map((e) => [e.delta, (e.logprobs as unknown[]).length])).toEqual([["Hi", 1], [" ", 1], ["\u2713", 1], [".", 1], ["\n", 1]]);
    expect(events.find((e) => e.type === "response.output_text.done")).toMatchObject({ logprobs: textLogprobs });
    expect(events.at(-1)!.response).toEqual(toResponsesResponse(result, c));
    // Without the include nothing changes.
    const plain = encode(streamOf(result, pieces), ctx());
    expect(plain.filter((e) => e.type === "response.output_text.delta").every((e) => (e.logprobs as unknown[]).length === 0)).toBe(true);
    expect(plain.at(-1)!.response).toEqual(toResponsesResponse(result, ctx()));
  });

  it("gives a token that shows no text with the text it ends up in, and none for the stop token", () => {
    // A two-token character at the start of the text: the first half shows nothing on its own.
    const toks = ["\xe2", "\x9c\x93", "<|im_end|>"];
    const lps = lpOf(toks);
    lps[0]!.bytes = [0xe2];
    lps[1]!.bytes = [0x9c, 0x93];
    const r: EngineResult = { ...engineResult({ content: "\u2713", reasoning: null, tool_calls: [] }, toks), logprobs: lps };
    const c = { ...ctx(), clientLogprobs: { top_logprobs: 0 } };
    const none = (l: (typeof lps)[number]) => ({ ...l, top_logprobs: [] });
    const events = encode(
      streamOf(r, [
        { type: "delta", token_ids: [1], logprobs: [lps[0]!] },
        { type: "delta", content: "\u2713", token_ids: [2], logprobs: [lps[1]!] },
        { type: "delta", token_ids: [3], logprobs: [lps[2]!] },
      ]),
      c,
    );
    expect(events.filter((e) => e.type === "response.output_text.delta")).toMatchObject([{ delta: "\u2713", logprobs: [none(lps[0]!), none(lps[1]!)] }]);
    expect(events.at(-1)!.response).toEqual(toResponsesResponse(r, c));
    expect(toResponsesResponse(r, c).output[0]).toMatchObject({ content: [{ logprobs: [none(lps[0]!), none(lps[1]!)] }] });
  });

  it("gives none when the tokens' text is unknown (a branch's replayed answer records no token text)", () => {
    const r: EngineResult = { ...engineResult({ content: "Hi", reasoning: null, tool_calls: [] }, ["", ""]) };
    expect(toResponsesResponse(r, { ...ctx(), clientLogprobs: { top_logprobs: 0 } }).output[0]).toMatchObject({ content: [{ text: "Hi", logprobs: [] }] });
  });
});

describe("property: client logprobs of random answers", () => {
  const utf8 = new TextEncoder();
  const lossy = new TextDecoder("utf-8", { fatal: false });
  /** A token of these bytes, spelled as vLLM spells it (a piece of a character reads U+FFFD). */
  const token = (bytes: Uint8Array, k: number) => {
    const t = lossy.decode(bytes);
    return { token: t, logprob: -k / 64, bytes: Array.from(utf8.encode(t)), top_logprobs: [] };
  };
  /** Cuts a string's UTF-8 bytes into pieces at the given (sorted, deduplicated) byte offsets. */
  const cutBytes = (s: string, cuts: number[]) => {
    const b = utf8.encode(s);
    const at = [...new Set(cuts.map((c) => c % (b.length + 1)))].filter((c) => c > 0 && c < b.length).sort((x, y) => x - y);
    return [0, ...at].map((from, i) => b.slice(from, at[i] ?? b.length));
  };
  const str = fc.string({ unit: fc.constantFrom("a", "k", ">", "<", "/", "t", " ", "\n", "\u00e9", "\u2713", "\u{1F99C}", "\u9F98"), minLength: 1, maxLength: 12 });

  it("give exactly the text's tokens, streamed as an engine detokenises them, and the same not streamed", () => {
    fc.assert(
      fc.property(
        fc.option(str, { nil: null }),
        str.filter((t) => t.trim() !== "" && !t.startsWith("\n")),
        fc.array(fc.nat(), { maxLength: 8 }),
        (reasoning, text, cuts) => {
          // `shown`: a piece of the text as the client sees it (the newlines after reasoning are not).
          type Piece = { kind: "reasoning" | "text" | "none"; bytes: Uint8Array; shown?: true };
          const pieces: Piece[] = [];
          const special = (t: string) => pieces.push({ kind: "none", bytes: utf8.encode(t) });
          if (reasoning !== null) {
            special("<think>");
            for (const b of cutBytes(reasoning, cuts)) pieces.push({ kind: "reasoning", bytes: b });
            special("</think>");
            pieces.push({ kind: "text", bytes: utf8.encode("\n\n") });
          }
          for (const b of cutBytes(text, cuts.map((c) => c * 7))) pieces.push({ kind: "text", bytes: b, shown: true });
          special("<|im_end|>");
          const lps = pieces.map((p, k) => token(p.bytes, k));
          const content = reasoning !== null ? `\n\n${text}` : text;
          const result: EngineResult = {
            ...engineResult({ content, reasoning, tool_calls: [] }, lps.map((l) => l.token)),
            logprobs: lps,
          };
          const textPieces = lps.filter((_, k) => pieces[k]!.shown);
          // Streamed as an incremental detokeniser does: a piece of a character shows nothing until it completes.
          const events: EngineStreamEvent[] = [];
          const dec = { reasoning: new TextDecoder(), text: new TextDecoder() };
          pieces.forEach((p, k) => {
            const shown = p.kind === "none" ? "" : dec[p.kind].decode(p.bytes, { stream: true });
            events.push({ type: "delta", ...(shown ? { [p.kind === "reasoning" ? "reasoning" : "content"]: shown } : {}), token_ids: [k], logprobs: [lps[k]!] });
          });
          const c = { ...ctx(), clientLogprobs: { top_logprobs: 0 } };
          const final = toResponsesResponse(result, c);
          const msg = final.output.find((i) => i.type === "message") as { content: { text: string; logprobs: unknown[] }[] };
          expect(msg.content[0]!.text).toBe(text);
          expect(msg.content[0]!.logprobs).toEqual(textPieces);
          const streamed = encode(streamOf(result, events), c);
          expect(streamed.filter((e) => e.type === "response.output_text.delta").flatMap((e) => e.logprobs as unknown[])).toEqual(textPieces);
          expect(streamed.at(-1)!.response).toEqual(final);
        },
      ),
      { numRuns: 300 },
    );
  });
});

// ---------------------------------------------------------------------------------------------
// Property: random valid conversations survive without losing a message, a call or an argument,
// and the engine's answers survive response → replay → canonical.

const text = fc.string({ minLength: 1, maxLength: 20 });
const ident = fc.stringMatching(/^[a-z][a-z0-9_]{0,11}$/);
const args = fc.dictionary(ident, fc.oneof(fc.string(), fc.integer(), fc.boolean()), { maxKeys: 4 }).map((o) => JSON.stringify(o));
const turn = fc.record({
  user: text,
  reasoning: fc.option(text, { nil: null }),
  content: fc.option(text.filter((s) => s.trim() !== ""), { nil: null }),
  calls: fc.array(fc.record({ name: ident, arguments: args, output: fc.string() }), { maxLength: 3 }),
});

describe("property: random Responses conversations", () => {
  it("keep every message, function call and argument, and round-trip the engine's answers", () => {
    fc.assert(
      fc.property(fc.array(turn, { minLength: 1, maxLength: 4 }), fc.boolean(), (turns, namespacedTools) => {
        const ns = namespacedTools ? "ns" : null;
        const input: unknown[] = [];
        const expected: ChatMessage[] = [];
        turns.forEach((t, i) => {
          input.push({ role: "user", content: t.user });
          expected.push({ role: "user", content: t.user });
          // The engine's answer, given to the client as a response and replayed as the client would.
          const toolCalls = t.calls.map((c, k) => ({
            id: `call_${i}_${k}`,
            type: "function" as const,
            function: { name: ns ? namespacedToolName(ns, c.name) : c.name, arguments: c.arguments },
          }));
          const c = ctx(new Map(ns ? t.calls.map((call) => [namespacedToolName(ns, call.name), { namespace: ns, name: call.name }] as const) : []));
          const result = engineResult({ content: t.content, reasoning: t.reasoning, tool_calls: toolCalls }, ["x"]);
          input.push(...toResponsesOutput(result, { ...c, id: `resp_${i}` }));
          // Every answer is a turn, an empty one too (it comes back as a message with empty text).
          expected.push({
            role: "assistant",
            content: t.content ?? "",
            ...(t.reasoning !== null ? { reasoning: t.reasoning } : {}),
            ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
          });
          t.calls.forEach((call, k) => {
            input.push({ type: "function_call_output", call_id: `call_${i}_${k}`, output: call.output });
            expected.push({ role: "tool", tool_call_id: `call_${i}_${k}`, content: call.output });
          });
        });
        const got = fromResponses({ input }, { reasoningKey: KEY }).canonical.messages;
        expect(got).toEqual(expected);
      }),
      { numRuns: 200 },
    );
  });
});
