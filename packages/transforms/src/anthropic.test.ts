import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ZodError } from "zod";
import { agentRequests } from "./__fixtures__/agent-requests.js";
import { StreamAccumulator } from "./accumulate.js";
import {
  AnthropicRequest,
  AnthropicStreamEncoder,
  anthropicError,
  anthropicStopReason,
  anthropicErrorType,
  fromAnthropic,
  fromValidAnthropic,
  toAnthropicResponse,
} from "./anthropic.js";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";
import { sealReasoning, signReasoning } from "./reasoning-seal.js";

const KEY = "session-token-hash";
const ctx = { id: "msg_01", model: "claude-test", reasoningKey: KEY };

// An agent's second turn, shaped like what Claude Code sends: system blocks with cache_control,
// a mid-conversation system message, the first answer echoed back (thinking + tool_use, no
// text), and the tool result.
const secondTurn = {
  model: "claude-test",
  max_tokens: 1024,
  system: [
    { type: "text", text: "header line" },
    { type: "text", text: "You are a coding agent.", cache_control: { type: "ephemeral" } },
  ],
  messages: [
    {
      role: "user",
      content: [
        { type: "text", text: "<reminder>ctx</reminder>" },
        { type: "text", text: "Write hello.txt", cache_control: { type: "ephemeral" } },
      ],
    },
    { role: "system", content: "Agent types: general." },
    {
      role: "assistant",
      content: [
        { type: "thinking", thinking: "\nI will use the shell.\n", signature: signReasoning(KEY, "\nI will use the shell.\n") },
        { type: "tool_use", id: "toolu_1", name: "Bash", input: { command: "echo hi > hello.txt", timeout: 5 } },
      ],
    },
    {
      role: "user",
      content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "(no output)" }], cache_control: { type: "ephemeral" } }],
    },
  ],
  tools: [
    { name: "Bash", description: "Run a command", input_schema: { type: "object", properties: { command: { type: "string" } } }, cache_control: { type: "ephemeral" } },
    { type: "web_search_20250305", name: "web_search", max_uses: 3 },
  ],
  tool_choice: { type: "auto", disable_parallel_tool_use: false },
  thinking: { type: "adaptive", display: "omitted" },
  output_config: { effort: "high" },
  context_management: { edits: [{ type: "clear_thinking_20251015", keep: "all" }] },
  metadata: { user_id: '{"device_id":"d"}' },
  stop_sequences: ["END"],
  temperature: 0.7,
  top_p: 0.9,
  top_k: 20,
  stream: true,
  some_future_field: { x: 1 },
};

function issuePaths(body: unknown): string[] {
  try {
    fromAnthropic(body, { reasoningKey: KEY });
  } catch (err) {
    expect(err).toBeInstanceOf(ZodError);
    return (err as ZodError).issues.map((i) => i.path.join("."));
  }
  throw new Error("accepted a bad body");
}

describe("fromAnthropic", () => {
  it("turns a Claude Code style body into the canonical request", () => {
    const call = fromAnthropic(secondTurn, { reasoningKey: KEY });
    expect(call.clientModel).toBe("claude-test");
    expect(call.droppedThinking).toBe(0);
    expect(call.canonical).toEqual({
      messages: [
        { role: "system", content: "header line\nYou are a coding agent." },
        { role: "user", content: "<reminder>ctx</reminder>\nWrite hello.txt" },
        { role: "system", content: "Agent types: general." },
        {
          role: "assistant",
          content: "",
          reasoning: "\nI will use the shell.\n",
          tool_calls: [
            { id: "toolu_1", type: "function", function: { name: "Bash", arguments: '{"command":"echo hi > hello.txt","timeout":5}' } },
          ],
        },
        { role: "tool", tool_call_id: "toolu_1", content: "(no output)" },
      ],
      tools: [
        {
          type: "function",
          function: { name: "Bash", description: "Run a command", parameters: { type: "object", properties: { command: { type: "string" } } } },
        },
      ],
      tool_choice: "auto",
      sampling: { temperature: 0.7, top_p: 0.9, top_k: 20, max_tokens: 1024, stop: ["END"] },
      enable_thinking: true,
      reasoning_effort: "high",
      stream: true,
      client_logprobs: null,
    });
  });

  it("accepts the fields Claude Code, opencode and pi send (agent suite), ignoring the cache and streaming hints", () => {
    // Shapes the real CLIs sent through the gateway in test/e2e-agents (our own text).
    // cache_control (on tools, text, tool_use and tool_result blocks), eager_input_streaming and
    // `is_error: false` change nothing the engine sees: ignored on purpose.
    const body = {
      model: "claude-opus-test",
      max_tokens: 64000,
      stream: true,
      system: [{ type: "text", text: "You are a coding agent.", cache_control: { type: "ephemeral" } }],
      messages: [
        { role: "user", content: [{ type: "text", text: "Write the file.", cache_control: { type: "ephemeral" } }] },
        {
          role: "assistant",
          content: [{ type: "tool_use", id: "toolu_1", name: "Bash", input: { command: "ls" }, cache_control: { type: "ephemeral" } }],
        },
        {
          role: "user",
          content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "(Bash completed with no output)", is_error: false, cache_control: { type: "ephemeral" } }],
        },
      ],
      tools: [
        {
          name: "Bash",
          description: "Run a command",
          input_schema: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
          cache_control: { type: "ephemeral" },
          eager_input_streaming: true,
        },
      ],
      tool_choice: { type: "auto" },
      thinking: { type: "adaptive" },
      output_config: { effort: "high" },
      context_management: { edits: [{ type: "clear_thinking_20251015", keep: "all" }] },
      metadata: { user_id: '{"device_id":"d","session_id":"s"}' },
    };
    const call = fromAnthropic(body, { reasoningKey: KEY });
    expect(call.canonical).toEqual({
      messages: [
        { role: "system", content: "You are a coding agent." },
        { role: "user", content: "Write the file." },
        { role: "assistant", content: "", tool_calls: [{ id: "toolu_1", type: "function", function: { name: "Bash", arguments: '{"command":"ls"}' } }] },
        { role: "tool", tool_call_id: "toolu_1", content: "(Bash completed with no output)" },
      ],
      tools: [
        {
          type: "function",
          function: { name: "Bash", description: "Run a command", parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] } },
        },
      ],
      tool_choice: "auto",
      sampling: { max_tokens: 64000 },
      enable_thinking: true,
      reasoning_effort: "high",
      stream: true,
      client_logprobs: null,
    });
    // opencode and pi send no thinking field: the template's default holds.
    const { thinking: _t, output_config: _o, ...plain } = body;
    expect(fromAnthropic(plain, { reasoningKey: KEY }).canonical).not.toHaveProperty("enable_thinking");
  });

  it("maps images, text documents, mixed tool results and is_error", () => {
    const call = fromAnthropic({
      messages: [
        {
          role: "user",
          content: [
            { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBOR" } },
            { type: "document", source: { type: "text", media_type: "text/plain", data: "doc body" }, title: "Notes" },
            { type: "text", text: "look" },
          ],
        },
        { role: "assistant", content: [{ type: "text", text: "calling" }, { type: "tool_use", id: "t1", name: "a", input: {} }, { type: "tool_use", id: "t2", name: "b", input: { x: [1, 2] } }] },
        {
          role: "user",
          content: [
            { type: "tool_result", tool_use_id: "t1", content: "one" },
            { type: "tool_result", tool_use_id: "t2", is_error: true },
            { type: "text", text: "and then?" },
          ],
        },
        { role: "user", content: [{ type: "document", source: { type: "content", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] } }] },
      ],
    });
    expect(call.canonical.messages).toEqual([
      {
        role: "user",
        content: [
          { type: "image_url", image_url: { url: "data:image/png;base64,iVBOR" } },
          { type: "text", text: "Notes\n\ndoc body" },
          { type: "text", text: "look" },
        ],
      },
      {
        role: "assistant",
        content: "calling",
        tool_calls: [
          { id: "t1", type: "function", function: { name: "a", arguments: "{}" } },
          { id: "t2", type: "function", function: { name: "b", arguments: '{"x":[1,2]}' } },
        ],
      },
      { role: "tool", tool_call_id: "t1", content: "one" },
      { role: "tool", tool_call_id: "t2", content: "Error" },
      { role: "user", content: "and then?" },
      { role: "user", content: "a\nb" },
    ]);
    expect(call.canonical.stream).toBe(false);
    expect(call.canonical.enable_thinking).toBeUndefined();
  });

  it("joins text blocks a call separates as written (a streamed answer's text around its calls), adjacent ones with a newline", () => {
    const turn = (content: unknown[]) =>
      fromAnthropic({ max_tokens: 8, messages: [{ role: "user", content: "q" }, { role: "assistant", content }, { role: "user", content: "go on" }] }).canonical.messages[1];
    const use = (id: string) => ({ type: "tool_use", id, name: "shell", input: {} });
    expect(turn([{ type: "text", text: "Looking.\n" }, use("t1"), { type: "text", text: "\nbetween\n" }, use("t2"), { type: "text", text: "\nAfter." }])).toMatchObject({
      content: "Looking.\n\nbetween\n\nAfter.",
    });
    expect(turn([{ type: "text", text: "a" }, { type: "text", text: "b" }, use("t1")])).toMatchObject({ content: "a\nb" });
  });

  it("trusts only thinking this session signed or sealed, and drops the rest", () => {
    const msg = (content: unknown[]) => ({ messages: [{ role: "user", content: "q" }, { role: "assistant", content }, { role: "user", content: "q2" }] });
    const ours = fromAnthropic(msg([{ type: "redacted_thinking", data: sealReasoning(KEY, "hidden") }, { type: "text", text: "a" }]), { reasoningKey: KEY });
    expect(ours.canonical.messages[1]).toEqual({ role: "assistant", content: "a", reasoning: "hidden" });
    expect(ours.droppedThinking).toBe(0);

    const forged = [
      { type: "thinking", thinking: "edited", signature: signReasoning(KEY, "original") },
      { type: "thinking", thinking: "other session", signature: signReasoning("other-key", "other session") },
      { type: "thinking", thinking: "no signature" },
      { type: "redacted_thinking", data: "EqQBCkYIARgCKkBanthropic" },
      { type: "text", text: "a" },
    ];
    const theirs = fromAnthropic(msg(forged), { reasoningKey: KEY });
    expect(theirs.canonical.messages[1]).toEqual({ role: "assistant", content: "a" });
    expect(theirs.droppedThinking).toBe(4);
    // Without the session's key nothing is trusted.
    expect(fromAnthropic(msg([{ type: "thinking", thinking: "t", signature: signReasoning(KEY, "t") }])).droppedThinking).toBe(1);
  });

  it("maps tool_choice, thinking and effort", () => {
    const base = { messages: [{ role: "user", content: "q" }], tools: [{ name: "f", input_schema: { type: "object" } }] };
    const choice = (tool_choice: unknown) => fromAnthropic({ ...base, tool_choice }).canonical.tool_choice;
    expect(choice({ type: "auto" })).toBe("auto");
    expect(choice({ type: "any" })).toBe("required");
    expect(choice({ type: "none" })).toBe("none");
    expect(choice({ type: "tool", name: "f" })).toEqual({ type: "function", function: { name: "f" } });
    const thinking = (extra: Record<string, unknown>) => fromAnthropic({ ...base, ...extra }).canonical.enable_thinking;
    expect(thinking({ thinking: { type: "enabled", budget_tokens: 2048 } })).toBe(true);
    expect(thinking({ thinking: { type: "adaptive" } })).toBe(true);
    expect(thinking({ thinking: { type: "disabled" }, output_config: { effort: "high" } })).toBe(false);
    expect(thinking({ output_config: { effort: "low" } })).toBe(true);
    expect(thinking({})).toBeUndefined();
    // A typed server tool alone offers nothing, so no tool_choice either; forcing a call then is a 400.
    const server = (tool_choice: unknown) => fromAnthropic({ messages: base.messages, tools: [{ type: "web_search_20250305", name: "web_search" }], tool_choice });
    expect(server({ type: "auto" }).canonical.tools).toBeUndefined();
    expect(server({ type: "auto" }).canonical.tool_choice).toBeUndefined();
    expect(() => server({ type: "any" })).toThrow(/forces a tool call, but no function tool is offered/);
    expect(() => fromAnthropic({ messages: base.messages, tool_choice: { type: "tool", name: "f" } })).toThrow(/no function tool is offered/);
  });

  it("names the bad field", () => {
    expect(issuePaths({ messages: [] })).toEqual(["messages"]);
    expect(issuePaths({ messages: [{ role: "user", content: "x" }], max_tokens: "lots" })).toEqual(["max_tokens"]);
    expect(issuePaths({ messages: [{ role: "tool", content: "x" }] })).toEqual(["messages.0.role"]);
    expect(issuePaths({ messages: [{ role: "user", content: "x" }], tool_choice: { type: "tool" } })).toEqual(["tool_choice.name"]);
    expect(issuePaths({ messages: [{ role: "user", content: "x" }], temperature: 3 })).toEqual(["temperature"]);
    const pdf = { type: "document", source: { type: "base64", media_type: "application/pdf", data: "JVBER" } };
    expect(issuePaths({ messages: [{ role: "user", content: [pdf] }] })).toEqual(["messages.0.content.0.source"]);
    expect(issuePaths({ messages: [{ role: "assistant", content: [{ type: "tool_result", tool_use_id: "x" }] }] })).toEqual(["messages.0.content"]);
  });
});

const usage = { prompt_tokens: 100, completion_tokens: 12, cached_tokens: 64 };

function result(message: EngineResult["message"], finish_reason = "stop", stop_reason: string | null = null): EngineResult {
  return { prompt_ids: [1], output_ids: [2], output_logprobs: [-0.1], logprobs: [], message, finish_reason, stop_reason, usage };
}

describe("toAnthropicResponse", () => {
  it("answers text with end_turn and Anthropic's usage split", () => {
    expect(toAnthropicResponse(result({ content: "Hello.", reasoning: null, tool_calls: [] }), ctx)).toEqual({
      id: "msg_01",
      type: "message",
      role: "assistant",
      model: "claude-test",
      content: [{ type: "text", text: "Hello." }],
      stop_reason: "end_turn",
      stop_sequence: null,
      usage: { input_tokens: 36, output_tokens: 12, cache_read_input_tokens: 64, cache_creation_input_tokens: 0 },
    });
  });

  it("orders thinking (signed), text and tool_use, and drops whitespace beside tool calls", () => {
    const m = {
      content: "\n\n",
      reasoning: "\nplan\n",
      tool_calls: [
        { id: "call_a", type: "function" as const, function: { name: "Bash", arguments: '{"command": "ls", "n": 1.5}' } },
        { id: "", type: "function" as const, function: { name: "Read", arguments: "not json" } },
      ],
    };
    const res = toAnthropicResponse(result(m, "tool_calls"), ctx);
    expect(res.content).toEqual([
      { type: "thinking", thinking: "\nplan\n", signature: signReasoning(KEY, "\nplan\n") },
      { type: "tool_use", id: "call_a", name: "Bash", input: { command: "ls", n: 1.5 } },
      { type: "tool_use", id: "toolu_01_1", name: "Read", input: {} },
    ]);
    expect(res.stop_reason).toBe("tool_use");
  });

  it("maps length and stop strings", () => {
    const m = { content: "abc", reasoning: null, tool_calls: [] };
    expect(toAnthropicResponse(result(m, "length"), ctx)).toMatchObject({ stop_reason: "max_tokens", stop_sequence: null });
    expect(toAnthropicResponse(result(m, "stop", "END"), ctx)).toMatchObject({ stop_reason: "stop_sequence", stop_sequence: "END" });
  });

  it("renders errors in Anthropic's shape", () => {
    expect(anthropicError(anthropicErrorType(401), "bad key")).toEqual({ type: "error", error: { type: "authentication_error", message: "bad key" } });
    expect([400, 403, 404, 413, 429, 500, 502, 529].map(anthropicErrorType)).toEqual([
      "invalid_request_error",
      "permission_error",
      "not_found_error",
      "request_too_large",
      "rate_limit_error",
      "api_error",
      "api_error",
      "overloaded_error",
    ]);
  });
});

function delta(d: Omit<Extract<EngineStreamEvent, { type: "delta" }>, "type" | "token_ids" | "logprobs">, n = 1): EngineStreamEvent {
  return { type: "delta", ...d, token_ids: Array.from({ length: n }, (_, i) => i), logprobs: [] };
}

function encode(events: EngineStreamEvent[]): string {
  const enc = new AnthropicStreamEncoder(ctx);
  return events.map((e) => enc.push(e)).join("") + enc.end();
}

/** Parses SSE frames back into [event, data] pairs, checking that each frame's event matches data.type. */
function frames(sse: string): [string, Record<string, unknown>][] {
  return sse
    .split("\n\n")
    .filter((f) => f !== "")
    .map((f) => {
      const m = /^event: (\S+)\ndata: (.*)$/s.exec(f);
      if (!m) throw new Error(`bad frame ${f}`);
      const data = JSON.parse(m[2]!) as Record<string, unknown>;
      expect(data.type).toBe(m[1]);
      return [m[1]!, data];
    });
}

/** The content blocks an SDK builds from the frames (partial_json concatenated, then parsed). */
function blocksOf(sse: string): unknown[] {
  const blocks: Record<string, unknown>[] = [];
  const json: string[] = [];
  for (const [ev, d] of frames(sse)) {
    if (ev === "content_block_start") {
      blocks[d.index as number] = { ...(d.content_block as object) };
      json[d.index as number] = "";
    } else if (ev === "content_block_delta") {
      const b = blocks[d.index as number]!;
      const x = d.delta as Record<string, string>;
      if (x.type === "text_delta") b.text = (b.text as string) + x.text;
      if (x.type === "thinking_delta") b.thinking = (b.thinking as string) + x.thinking;
      if (x.type === "signature_delta") b.signature = x.signature;
      if (x.type === "input_json_delta") json[d.index as number] = (json[d.index as number] ?? "") + (x.partial_json ?? "");
    } else if (ev === "content_block_stop") {
      const b = blocks[d.index as number]!;
      if (b.type === "tool_use") b.input = JSON.parse(json[d.index as number] || "{}");
    }
  }
  return blocks;
}

const textEvents: EngineStreamEvent[] = [
  { type: "start", prompt_ids: [1, 2, 3, 4] },
  delta({ content: "Hel" }),
  delta({ content: "lo." }),
  { type: "finish", finish_reason: "stop", stop_reason: null },
  { type: "usage", usage: { prompt_tokens: 4, completion_tokens: 2, cached_tokens: 0 } },
];

const toolEvents: EngineStreamEvent[] = [
  { type: "start", prompt_ids: [1, 2, 3] },
  delta({ reasoning: "\nplan" }),
  delta({ reasoning: "\n" }),
  delta({}, 2), // </think> and the newlines: tokens without visible text
  delta({ content: "\n\n" }),
  delta({ tool_calls: [{ index: 0, id: "call_a", type: "function", function: { name: "Bash" } }] }),
  delta({ tool_calls: [{ index: 0, function: { arguments: '{"command": ' } }] }),
  delta({ tool_calls: [{ index: 0, function: { arguments: '"ls"}' } }] }),
  delta({ content: "\n" }),
  delta({ tool_calls: [{ index: 1, id: "call_b", type: "function", function: { name: "Read", arguments: '{"path": "a"}' } }] }),
  { type: "finish", finish_reason: "tool_calls", stop_reason: null },
  { type: "usage", usage: { prompt_tokens: 3, completion_tokens: 12, cached_tokens: 2 } },
];

describe("AnthropicStreamEncoder", () => {
  it("streams text as the exact Anthropic event sequence", () => {
    expect(encode(textEvents)).toBe(
      [
        'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4,"output_tokens":0,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}}',
        'event: ping\ndata: {"type":"ping"}',
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}',
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo."}}',
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}',
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":4,"output_tokens":2,"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}',
        'event: message_stop\ndata: {"type":"message_stop"}',
        "",
      ].join("\n\n"),
    );
  });

  it("streams thinking (signature before stop) and tool calls as input_json_delta", () => {
    const seq = frames(encode(toolEvents)).map(([ev, d]) => {
      const x = d.delta as { type?: string; stop_reason?: string } | undefined;
      const cb = d.content_block as { type?: string } | undefined;
      return [ev, d.index, cb?.type ?? x?.type ?? x?.stop_reason].filter((v) => v !== undefined).join(":");
    });
    expect(seq).toEqual([
      "message_start",
      "ping",
      "content_block_start:0:thinking",
      "content_block_delta:0:thinking_delta",
      "content_block_delta:0:thinking_delta",
      "content_block_delta:0:signature_delta",
      "content_block_stop:0",
      "content_block_start:1:tool_use",
      "content_block_delta:1:input_json_delta",
      "content_block_delta:1:input_json_delta",
      "content_block_stop:1",
      "content_block_start:2:tool_use",
      "content_block_delta:2:input_json_delta",
      "content_block_stop:2",
      "message_delta:tool_use",
      "message_stop",
    ]);
    const all = frames(encode(toolEvents));
    expect(all[2]![1]).toEqual({ type: "content_block_start", index: 0, content_block: { type: "thinking", thinking: "", signature: "" } });
    expect(all[7]![1]).toEqual({ type: "content_block_start", index: 1, content_block: { type: "tool_use", id: "call_a", name: "Bash", input: {} } });
    expect(all.at(-2)![1]).toEqual({
      type: "message_delta",
      delta: { stop_reason: "tool_use", stop_sequence: null },
      usage: { input_tokens: 1, output_tokens: 12, cache_read_input_tokens: 2, cache_creation_input_tokens: 0 },
    });
  });

  it("gives the same content blocks as the non-streaming response of the accumulated result", () => {
    for (const events of [textEvents, toolEvents]) {
      const acc = new StreamAccumulator();
      events.forEach((e) => acc.push(e));
      const whole = toAnthropicResponse(acc.result(), ctx);
      expect(blocksOf(encode(events))).toEqual(whole.content);
    }
  });

  it("streams arguments that are no JSON object (a string, an array) as an empty input, as the non-streaming response gives them", () => {
    for (const pieces of [[' "{\\"command\\": ', '\\"ls\\"}"'], ["[1, ", "2]"], ["  ", '{"a": ', "1}"]]) {
      const events: EngineStreamEvent[] = [
        { type: "start", prompt_ids: [1] },
        delta({ tool_calls: [{ index: 0, id: "call_s", type: "function", function: { name: "shell" } }] }),
        ...pieces.map((arguments_) => delta({ tool_calls: [{ index: 0, function: { arguments: arguments_ } }] })),
        { type: "finish", finish_reason: "tool_calls", stop_reason: null },
      ];
      const acc = new StreamAccumulator();
      events.forEach((e) => acc.push(e));
      const whole = toAnthropicResponse(acc.result(), ctx);
      expect(blocksOf(encode(events))).toEqual(whole.content);
    }
  });

  it("holds whitespace-only text until it knows there is no tool call", () => {
    const events: EngineStreamEvent[] = [{ type: "start", prompt_ids: [1] }, delta({ content: "\n\n" }), { type: "finish", finish_reason: "stop", stop_reason: null }];
    expect(blocksOf(encode(events))).toEqual([{ type: "text", text: "\n\n" }]);
    const later: EngineStreamEvent[] = [{ type: "start", prompt_ids: [1] }, delta({ content: "\n\n" }), delta({ content: "Hi" })];
    expect(blocksOf(encode(later))).toEqual([{ type: "text", text: "\n\nHi" }]);
  });

  it("ends a failed stream with an error event", () => {
    const enc = new AnthropicStreamEncoder(ctx);
    const head = enc.push({ type: "start", prompt_ids: [1] }) + enc.push(delta({ content: "partial" }));
    expect(frames(head).map(([e]) => e)).toEqual(["message_start", "ping", "content_block_start", "content_block_delta"]);
    expect(enc.error(502, "engine went away")).toBe(
      'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"engine went away"}}\n\n',
    );
    expect(enc.end()).toBe("");
  });
});

// Real agent CLIs' requests, recorded through rollgate (__fixtures__/agent-requests/README.md).
const recorded = agentRequests("anthropic_messages");

describe("recorded agent requests", () => {
  it("hold a main turn and a tool-result turn of every CLI that speaks Anthropic Messages", () => {
    expect(recorded.map((r) => `${r.cli}.${r.kind}`)).toEqual(
      expect.arrayContaining(["claude-code", "opencode", "pi"].flatMap((cli) => [`${cli}.main`, `${cli}.tool-result`])),
    );
  });

  // The gateway's route parses the body once (its schema) and converts that: the same call.
  it.each(recorded.map((r) => [r.file, r] as const))("%s: the body the route validated converts to the same call", (_file, { body, reasoning_key }) => {
    expect(fromValidAnthropic(AnthropicRequest.parse(body), { reasoningKey: reasoning_key })).toEqual(fromAnthropic(body, { reasoningKey: reasoning_key }));
  });

  it.each(recorded.map((r) => [r.file, r] as const))("accepts %s and keeps every message, call, result and tool", (_file, { url, body: raw, reasoning_key }) => {
    type Block = { type: string; text?: string; thinking?: string; id?: string; name?: string; input?: unknown; tool_use_id?: string; content?: unknown };
    const body = raw as { messages: { role: string; content: string | Block[] }[]; tools?: { name: string }[]; system?: unknown };
    const blocks = body.messages.flatMap((m) => (typeof m.content === "string" ? [] : m.content));
    expect(url).toMatch(/^\/v1\/messages/);
    const call = fromAnthropic(body, { reasoningKey: reasoning_key });
    const c = call.canonical;
    // The thinking the gateway signed comes back trusted.
    expect(call.droppedThinking).toBe(0);
    // One message per message (the system prompt first); a user turn's tool results each become a tool message, ahead of its text.
    const roles = body.messages.flatMap((m) => {
      if (typeof m.content === "string") return [m.role];
      const results = m.content.filter((b) => b.type === "tool_result").map(() => "tool");
      return [...results, ...(results.length < m.content.length ? [m.role] : [])];
    });
    expect(c.messages.map((m) => m.role)).toEqual([...(body.system ? ["system"] : []), ...roles]);
    expect(c.tools?.map((t) => t.function.name) ?? []).toEqual((body.tools ?? []).map((t) => t.name));
    expect(c.stream).toBe(true);
    // Every call with its id, name and arguments; every result paired with its call.
    const calls = c.messages.flatMap((m) => (m.role === "assistant" ? (m.tool_calls ?? []) : []));
    expect(calls.map((t) => [t.id, t.function.name, JSON.parse(t.function.arguments)])).toEqual(blocks.filter((b) => b.type === "tool_use").map((b) => [b.id, b.name, b.input]));
    expect(c.messages.flatMap((m) => (m.role === "tool" ? [m.tool_call_id] : []))).toEqual(blocks.filter((b) => b.type === "tool_result").map((b) => b.tool_use_id));
    // Every text, thinking and result text.
    const rendered = JSON.stringify(c.messages);
    const texts = body.messages.flatMap((m) => (typeof m.content === "string" ? [m.content] : m.content.map((b) => b.text ?? b.thinking ?? (typeof b.content === "string" ? b.content : ""))));
    for (const t of texts) expect(rendered).toContain(JSON.stringify(t).slice(1, -1));
  });
});

// ---------------------------------------------------------------------------------------------
// Property: random valid requests keep every message, tool call, argument and tool.

const jsonValue = fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown);
const args = fc.dictionary(fc.string({ minLength: 1, maxLength: 8 }), jsonValue, { maxKeys: 4 });
const text = fc.string({ maxLength: 20 });
const toolUse = fc.record({ type: fc.constant("tool_use"), id: fc.uuid(), name: fc.stringMatching(/^[a-z_]{1,10}$/), input: args });
const thinking = text.map((t) => ({ type: "thinking", thinking: t, signature: signReasoning(KEY, t) }));

const assistantTurn = fc
  .record({ think: fc.option(thinking, { nil: undefined }), text: fc.option(text, { nil: undefined }), calls: fc.array(toolUse, { maxLength: 3 }) })
  .map(({ think, text: t, calls }) => ({
    role: "assistant",
    content: [...(think ? [think] : []), ...(t !== undefined ? [{ type: "text", text: t }] : []), ...calls],
  }));
const userTurn = fc.oneof(
  text.map((t) => ({ role: "user", content: t })),
  fc.array(text, { minLength: 1, maxLength: 3 }).map((ts) => ({ role: "user", content: ts.map((t) => ({ type: "text", text: t })) })),
);

const request = fc
  .record({
    system: fc.option(fc.oneof(text, fc.array(text.map((t) => ({ type: "text", text: t })), { maxLength: 2 })), { nil: undefined }),
    turns: fc.array(fc.tuple(userTurn, assistantTurn), { minLength: 1, maxLength: 4 }),
    tools: fc.array(fc.record({ name: fc.stringMatching(/^[a-z]{1,8}$/), input_schema: fc.constant({ type: "object" }) }), { maxLength: 3 }),
    stream: fc.boolean(),
  })
  .map(({ system, turns, tools, stream }) => {
    const messages: { role: string; content: unknown }[] = [];
    for (const [u, a] of turns) {
      // Tool results for the previous assistant turn's calls come first in the next user turn.
      const prev = messages.at(-1);
      const calls = prev ? (prev.content as { type: string; id?: string }[]).filter((b) => b.type === "tool_use") : [];
      const results = calls.map((c) => ({ type: "tool_result", tool_use_id: c.id, content: `result ${c.id}` }));
      const userContent = typeof u.content === "string" ? [{ type: "text", text: u.content }] : u.content;
      messages.push({ role: "user", content: results.length > 0 ? [...results, ...userContent] : u.content });
      messages.push(a);
    }
    return { max_tokens: 64, messages, stream, ...(system !== undefined ? { system } : {}), ...(tools.length > 0 ? { tools } : {}) };
  });

describe("fromAnthropic property", () => {
  it("keeps every message, tool call, argument and tool", () => {
    fc.assert(
      fc.property(request, (req) => {
        const { canonical: c, droppedThinking } = fromAnthropic(req, { reasoningKey: KEY });
        expect(droppedThinking).toBe(0);
        expect(c.stream).toBe(req.stream);
        expect(c.tools?.map((t) => t.function.name) ?? []).toEqual((req.tools ?? []).map((t) => t.name));

        const assistants = req.messages.filter((m) => m.role === "assistant") as { content: Record<string, unknown>[] }[];
        const canonAssistants = c.messages.filter((m) => m.role === "assistant");
        expect(canonAssistants).toHaveLength(assistants.length);
        assistants.forEach((a, i) => {
          const ca = canonAssistants[i]!;
          const uses = a.content.filter((b) => b.type === "tool_use");
          expect((ca.tool_calls ?? []).map((t) => [t.id, t.function.name, JSON.parse(t.function.arguments)])).toEqual(
            uses.map((u) => [u.id, u.name, u.input]),
          );
          const think = a.content.find((b) => b.type === "thinking");
          expect(ca.reasoning).toBe(think ? think.thinking : undefined);
          expect(ca.content).toBe(a.content.filter((b) => b.type === "text").map((b) => b.text).join("\n"));
        });

        const results = req.messages.flatMap((m) =>
          typeof m.content === "string" ? [] : (m.content as Record<string, unknown>[]).filter((b) => b.type === "tool_result"),
        );
        expect(c.messages.filter((m) => m.role === "tool").map((m) => [m.tool_call_id, m.content])).toEqual(
          results.map((r) => [r.tool_use_id, r.content]),
        );
        // Every user turn keeps its text, in order.
        const userTexts = req.messages
          .filter((m) => m.role === "user")
          .map((m) => (typeof m.content === "string" ? m.content : (m.content as Record<string, unknown>[]).filter((b) => b.type === "text").map((b) => b.text).join("\n")));
        expect(c.messages.filter((m) => m.role === "user").map((m) => m.content)).toEqual(userTexts);
      }),
      { numRuns: 300 },
    );
  });
});

describe("anthropicStopReason", () => {
  it("names the agent's stop sequence that ended the answer, inside a tool call too", () => {
    expect(anthropicStopReason("stop", "word9", true)).toEqual({ stop_reason: "stop_sequence", stop_sequence: "word9" });
    expect(anthropicStopReason("stop", "word9", false)).toEqual({ stop_reason: "stop_sequence", stop_sequence: "word9" });
    // An end token the engine matched is no stop sequence of the agent's.
    expect(anthropicStopReason("stop", 151645, true)).toEqual({ stop_reason: "tool_use", stop_sequence: null });
    expect(anthropicStopReason("tool_calls", null, true)).toEqual({ stop_reason: "tool_use", stop_sequence: null });
    expect(anthropicStopReason("length", "x", true)).toEqual({ stop_reason: "max_tokens", stop_sequence: null });
    expect(anthropicStopReason("stop", null, false)).toEqual({ stop_reason: "end_turn", stop_sequence: null });
  });
});
