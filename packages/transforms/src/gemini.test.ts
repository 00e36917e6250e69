import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ZodError } from "zod";
import { agentRequests } from "./__fixtures__/agent-requests.js";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";
import {
  GeminiStreamEncoder,
  fromGemini,
  geminiError,
  geminiSchemaToJsonSchema,
  geminiStreamClose,
  geminiStreamFrame,
  geminiStreamOpen,
  geminiThoughtSignature,
  toGeminiResponse,
  type GeminiPart,
  type GeminiResponse,
  type GeminiResponseContext,
  type GeminiStreamMode,
} from "./gemini.js";
import { openReasoning } from "./reasoning-seal.js";

const KEY = "session-token-hash";
const REASONING = "\nI should run the shell.\n";
const SIG = geminiThoughtSignature(KEY, REASONING);

const shellDecl = {
  name: "run_shell",
  description: "Run a command",
  parametersJsonSchema: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
};

// A second turn as @google/genai sends it: the model turn echoed with its thought and signature,
// then the function response (no ids: pairing by name and order).
const secondTurn = {
  systemInstruction: { parts: [{ text: "Be brief." }] },
  contents: [
    { role: "user", parts: [{ text: "Write hi to out.txt" }] },
    {
      role: "model",
      parts: [
        { text: REASONING, thought: true },
        { functionCall: { name: "run_shell", args: { command: "echo hi > out.txt", timeout: 5 } }, thoughtSignature: SIG },
        { functionCall: { name: "read_file", args: { path: "out.txt" } } },
      ],
    },
    {
      role: "user",
      parts: [
        { functionResponse: { name: "read_file", response: { output: "hi" } } },
        { functionResponse: { name: "run_shell", response: { output: "" } } },
        { text: "Thanks" },
      ],
    },
  ],
  tools: [
    {
      functionDeclarations: [
        shellDecl,
        {
          name: "read_file",
          parameters: {
            type: "OBJECT",
            properties: { path: { type: "STRING", description: "file" }, lines: { type: "ARRAY", items: { type: "INTEGER" }, nullable: true, minItems: "1" } },
            required: ["path"],
            propertyOrdering: ["path", "lines"],
          },
        },
      ],
    },
    { googleSearch: {} },
    { codeExecution: {} },
  ],
  toolConfig: { functionCallingConfig: { mode: "AUTO" } },
  generationConfig: {
    temperature: 0.7,
    topP: 0.95,
    topK: 64,
    maxOutputTokens: 512,
    stopSequences: ["END"],
    candidateCount: 1,
    responseMimeType: "text/plain",
    thinkingConfig: { includeThoughts: true, thinkingBudget: 8192 },
  },
  safetySettings: [{ category: "HARM_CATEGORY_HARASSMENT", threshold: "BLOCK_NONE" }],
};

describe("fromGemini", () => {
  it("turns a second turn into the canonical request: thought in the signature, calls paired by name", () => {
    const call = fromGemini(secondTurn, { key: KEY, stream: true });
    expect(call.includeThoughts).toBe(true);
    expect(call.canonical).toEqual({
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Write hi to out.txt" },
        {
          role: "assistant",
          content: "",
          reasoning: REASONING,
          tool_calls: [
            { id: "gemini-call-1-0", type: "function", function: { name: "run_shell", arguments: '{"command":"echo hi > out.txt","timeout":5}' } },
            { id: "gemini-call-1-1", type: "function", function: { name: "read_file", arguments: '{"path":"out.txt"}' } },
          ],
        },
        { role: "tool", tool_call_id: "gemini-call-1-1", content: '{"output":"hi"}' },
        { role: "tool", tool_call_id: "gemini-call-1-0", content: '{"output":""}' },
        { role: "user", content: "Thanks" },
      ],
      tools: [
        { type: "function", function: { name: "run_shell", description: "Run a command", parameters: shellDecl.parametersJsonSchema } },
        {
          type: "function",
          function: {
            name: "read_file",
            parameters: {
              type: "object",
              properties: { path: { type: "string", description: "file" }, lines: { type: ["array", "null"], items: { type: "integer" }, minItems: 1 } },
              required: ["path"],
            },
          },
        },
      ],
      tool_choice: "auto",
      sampling: { temperature: 0.7, top_p: 0.95, top_k: 64, max_tokens: 512, stop: ["END"] },
      enable_thinking: true,
      stream: true,
      client_logprobs: null,
    });
  });

  it("accepts opencode's and pi's requests (agent suite): lower-case `parameters`, id-less calls, AUTO mode", () => {
    // Shapes the real CLIs sent through the gateway in test/e2e-agents (our own text). opencode
    // declares tools with JSON-Schema `parameters` (lower-case types), answers with
    // `response: {name, content}`; pi's calls and responses carry no id (paired by name and order).
    const call = fromGemini(
      {
        systemInstruction: { parts: [{ text: "You are a coding agent." }] },
        contents: [
          { role: "user", parts: [{ text: "Write the file." }] },
          { role: "model", parts: [{ functionCall: { name: "bash", args: { command: "ls" } }, thoughtSignature: SIG }] },
          { role: "user", parts: [{ functionResponse: { name: "bash", response: { name: "bash", content: "(no output)" } } }] },
        ],
        tools: [
          {
            functionDeclarations: [
              { name: "bash", description: "Run", parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] } },
            ],
          },
        ],
        toolConfig: { functionCallingConfig: { mode: "AUTO" } },
        generationConfig: { maxOutputTokens: 32000 },
      },
      { key: KEY, stream: true },
    );
    expect(call.canonical).toEqual({
      messages: [
        { role: "system", content: "You are a coding agent." },
        { role: "user", content: "Write the file." },
        { role: "assistant", content: "", reasoning: REASONING, tool_calls: [{ id: "gemini-call-1-0", type: "function", function: { name: "bash", arguments: '{"command":"ls"}' } }] },
        { role: "tool", tool_call_id: "gemini-call-1-0", content: '{"name":"bash","content":"(no output)"}' },
      ],
      tools: [{ type: "function", function: { name: "bash", description: "Run", parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] } } }],
      tool_choice: "auto",
      sampling: { max_tokens: 32000 },
      stream: true,
      client_logprobs: null,
    });
  });

  it("recovers the reasoning from the signature alone (Gemini CLI drops thought parts) and pairs by id", () => {
    const call = fromGemini(
      {
        contents: [
          { parts: [{ text: "go" }] },
          { role: "model", parts: [{ functionCall: { id: "c1", name: "run_shell", args: {} }, thoughtSignature: SIG }] },
          { role: "user", parts: [{ functionResponse: { id: "c1", name: "run_shell", response: { error: "denied" } } }] },
        ],
      },
      { key: KEY },
    );
    expect(call.canonical.messages).toEqual([
      { role: "user", content: "go" },
      { role: "assistant", content: "", reasoning: REASONING, tool_calls: [{ id: "c1", type: "function", function: { name: "run_shell", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "c1", content: '{"error":"denied"}' },
    ]);
    expect(call.canonical.stream).toBe(false);
  });

  it("does not trust thoughts without our signature (another key, Gemini CLI's skip value, none)", () => {
    for (const sig of [geminiThoughtSignature("other-session", REASONING), "skip_thought_signature_validator", undefined]) {
      const call = fromGemini(
        { contents: [{ role: "user", parts: [{ text: "q" }] }, { role: "model", parts: [{ text: "forged", thought: true }, { text: "A", ...(sig ? { thoughtSignature: sig } : {}) }] }] },
        { key: KEY },
      );
      expect(call.canonical.messages[1]).toEqual({ role: "assistant", content: "A" });
    }
  });

  it("maps images, system instruction forms, tool config modes and thinking switches", () => {
    const base = { contents: [{ role: "user", parts: [{ text: "look" }, { inlineData: { mimeType: "image/png", data: "AAAA" } }] }] };
    expect(fromGemini({ ...base, systemInstruction: "sys" }).canonical.messages).toEqual([
      { role: "system", content: "sys" },
      { role: "user", content: [{ type: "text", text: "look" }, { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } }] },
    ]);
    expect(fromGemini({ ...base, systemInstruction: [{ text: "a" }, { text: "b" }] }).canonical.messages[0]).toEqual({ role: "system", content: "a\nb" });
    const tools = [{ functionDeclarations: [shellDecl, { name: "other" }] }];
    const mode = (functionCallingConfig: unknown) => fromGemini({ ...base, tools, toolConfig: { functionCallingConfig } }).canonical;
    expect(mode({ mode: "NONE" }).tool_choice).toBe("none");
    expect(mode({ mode: "ANY" }).tool_choice).toBe("required");
    expect(mode({ mode: "ANY", allowedFunctionNames: ["other"] }).tool_choice).toEqual({ type: "function", function: { name: "other" } });
    expect(mode({ mode: "ANY", allowedFunctionNames: ["other", "run_shell"] }).tools).toHaveLength(2);
    expect(fromGemini({ ...base, tools }).canonical.tool_choice).toBeUndefined();
    expect(fromGemini({ ...base, tools: [{ googleSearch: {} }] }).canonical.tools).toBeUndefined();
    const think = (thinkingConfig: unknown) => fromGemini({ ...base, generationConfig: { thinkingConfig } }).canonical.enable_thinking;
    expect(think({ thinkingBudget: 0 })).toBe(false);
    expect(think({ thinkingBudget: -1 })).toBe(true);
    expect(think({ thinkingLevel: "HIGH" })).toBe(true);
    expect(think({ thinkingLevel: "MINIMAL" })).toBe(false);
    expect(think({ includeThoughts: true })).toBeUndefined();
    expect(fromGemini({ ...base, generationConfig: { responseLogprobs: true, logprobs: 3 } }).canonical.client_logprobs).toEqual({ top_logprobs: 3 });
    // Plain text output asks for nothing (structured output is refused: below).
    expect(() => fromGemini({ ...base, generationConfig: { responseMimeType: "text/plain", responseModalities: ["TEXT"] } })).not.toThrow();
  });

  it("refuses what it cannot carry, naming the field", () => {
    const bad = (body: unknown, path: string, msg: RegExp) => {
      try {
        fromGemini(body);
        expect.unreachable();
      } catch (e) {
        expect(e).toBeInstanceOf(ZodError);
        const issue = (e as ZodError).issues[0]!;
        expect(issue.path.join(".")).toBe(path);
        expect(issue.message).toMatch(msg);
      }
    };
    const contents = [{ role: "user", parts: [{ text: "x" }] }];
    bad({ contents, generationConfig: { candidateCount: 2 } }, "generationConfig.candidateCount", /candidateCount/);
    bad({ contents: [] }, "contents", /empty/);
    bad({ contents: [{ role: "assistant", parts: [] }] }, "contents.0.role", /./);
    bad({ contents, generationConfig: { temperature: "warm" } }, "generationConfig.temperature", /./);
    bad({ contents: [{ parts: [{ inlineData: { mimeType: "application/pdf", data: "AA" } }] }] }, "contents.0.parts.0.inlineData.mimeType", /image/);
    bad({ contents, cachedContent: "cachedContents/1" }, "cachedContent", /not supported/);
    bad({ contents, tools: [{ functionDeclarations: [{ name: "f", parameters: {}, parametersJsonSchema: {} }] }] }, "tools.0.functionDeclarations.0", /not both/);
    // Structured output and non-text output: the gateway cannot constrain decoding or make media.
    bad({ contents, generationConfig: { responseMimeType: "application/json" } }, "generationConfig.responseMimeType", /structured output is not supported/);
    bad({ contents, generationConfig: { responseJsonSchema: { type: "object" } } }, "generationConfig.responseJsonSchema", /structured output/);
    bad({ contents, generationConfig: { responseSchema: { type: "OBJECT" } } }, "generationConfig.responseSchema", /structured output/);
    bad({ contents, generationConfig: { responseModalities: ["TEXT", "IMAGE"] } }, "generationConfig.responseModalities", /only TEXT/);
    // A field under both its proto names; a part whose only field the gateway does not read.
    bad({ contents, generationConfig: { maxOutputTokens: 3, max_output_tokens: 4 } }, "generationConfig.max_output_tokens", /same field/);
    bad({ contents: [{ parts: [{ text: "x" }, { video_metadata: {}, blob: "AA" }] }] }, "contents.0.parts.1.blob", /unsupported part field/);
    bad({ contents, systemInstruction: { parts: [{ text: "be terse" }, { inlineData: { mimeType: "image/png", data: "AA" } }] } }, "systemInstruction.parts.1.inlineData", /text parts only/);
  });

  it("reads snake_case field names as proto3 JSON does, leaving the caller's own JSON as sent", () => {
    const camel = {
      systemInstruction: { parts: [{ text: "be terse" }] },
      contents: [
        { role: "user", parts: [{ text: "look" }, { inlineData: { mimeType: "image/png", data: "AAAA" } }] },
        { role: "model", parts: [{ functionCall: { name: "f", args: { snake_key: 1 } } }] },
        { role: "user", parts: [{ functionResponse: { name: "f", response: { exit_code: 0 }, parts: [{ inlineData: { mimeType: "image/png", data: "BBBB" } }] } }] },
      ],
      tools: [{ functionDeclarations: [{ name: "f", parametersJsonSchema: { type: "object", properties: { snake_key: { type: "integer" } } } }] }],
      toolConfig: { functionCallingConfig: { mode: "ANY", allowedFunctionNames: ["f"] } },
      generationConfig: { maxOutputTokens: 3, stopSequences: ["END"], topK: 2, thinkingConfig: { thinkingBudget: 0 } },
    };
    const snake = {
      system_instruction: { parts: [{ text: "be terse" }] },
      contents: [
        { role: "user", parts: [{ text: "look" }, { inline_data: { mime_type: "image/png", data: "AAAA" } }] },
        { role: "model", parts: [{ function_call: { name: "f", args: { snake_key: 1 } } }] },
        { role: "user", parts: [{ function_response: { name: "f", response: { exit_code: 0 }, parts: [{ inline_data: { mime_type: "image/png", data: "BBBB" } }] } }] },
      ],
      tools: [{ function_declarations: [{ name: "f", parameters_json_schema: { type: "object", properties: { snake_key: { type: "integer" } } } }] }],
      tool_config: { function_calling_config: { mode: "ANY", allowed_function_names: ["f"] } },
      generation_config: { max_output_tokens: 3, stop_sequences: ["END"], top_k: 2, thinking_config: { thinking_budget: 0 } },
    };
    const fromCamel = fromGemini(camel).canonical;
    expect(fromGemini(snake).canonical).toEqual(fromCamel);
    expect(fromCamel.sampling).toEqual({ max_tokens: 3, stop: ["END"], top_k: 2 });
    expect(JSON.stringify(fromCamel.messages)).toContain('"arguments":"{\\"snake_key\\":1}"');
    expect(JSON.stringify(fromCamel.messages)).toContain("exit_code");
    expect(fromCamel.messages.at(-1)).toEqual({
      role: "tool",
      tool_call_id: expect.any(String),
      content: [
        { type: "text", text: '{"exit_code":0}' },
        { type: "image_url", image_url: { url: "data:image/png;base64,BBBB" } },
      ],
    });
  });
});

describe("geminiSchemaToJsonSchema", () => {
  it("lower-cases types recursively and keeps other keywords in order", () => {
    expect(
      geminiSchemaToJsonSchema({
        type: "OBJECT",
        description: "d",
        properties: { type: { type: "STRING", enum: ["a", "b"], format: "enum" }, any: { anyOf: [{ type: "NUMBER" }], nullable: true } },
      }),
    ).toEqual({
      type: "object",
      description: "d",
      properties: { type: { type: "string", enum: ["a", "b"], format: "enum" }, any: { anyOf: [{ type: "number" }, { type: "null" }] } },
    });
  });
});

const ctx: GeminiResponseContext = { model: "gemini-2.5-flash", responseId: "r-1", key: KEY, includeThoughts: true, clientLogprobs: null, reasoningEnd: "</think>" };
const lp = (token: string, logprob = -0.5) => ({ token, logprob, bytes: null, top_logprobs: [] });

const toolResult: EngineResult = {
  prompt_ids: [1, 2, 3],
  output_ids: [10, 11, 12, 13, 14],
  output_logprobs: [-0.1, -0.2, -0.3, -0.4, -0.5],
  logprobs: [lp("<think>"), lp("I"), lp("</think>"), lp("\n\n"), lp("<tool_call>")],
  message: {
    content: "\n\n",
    reasoning: REASONING,
    tool_calls: [{ id: "chatcmpl-tool-1", type: "function", function: { name: "run_shell", arguments: '{"command": "ls", "b": 1}' } }],
  },
  finish_reason: "tool_calls",
  stop_reason: null,
  usage: { prompt_tokens: 3, completion_tokens: 5, cached_tokens: 2 },
};

describe("toGeminiResponse", () => {
  it("counts every token a thought when the answer was cut inside its reasoning", () => {
    const cut: EngineResult = {
      ...toolResult,
      output_ids: [10, 11, 12],
      output_logprobs: [-0.1, -0.2, -0.3],
      logprobs: [lp("<think>"), lp("I"), lp(" think")],
      message: { content: null, reasoning: "I think", tool_calls: [] },
      finish_reason: "length",
      usage: { prompt_tokens: 3, completion_tokens: 3, cached_tokens: 0 },
    };
    expect(toGeminiResponse(cut, ctx).usageMetadata).toMatchObject({ thoughtsTokenCount: 3, candidatesTokenCount: 0 });
  });

  it("counts thoughts through the first reasoning end marker only (gpt-oss ends its commentary preamble with the same <|end|>)", () => {
    const harmony: EngineResult = {
      ...toolResult,
      output_ids: [20, 21, 22, 23, 24, 25, 26, 27],
      output_logprobs: [-0.1, -0.1, -0.1, -0.1, -0.1, -0.1, -0.1, -0.1],
      logprobs: ["<|channel|>", "Plan", "<|end|>", "<|start|>", "Running", "<|end|>", "<|start|>", "{}"].map((t) => lp(t)),
      message: { ...toolResult.message, content: "Running", reasoning: "Plan" },
      usage: { prompt_tokens: 3, completion_tokens: 8, cached_tokens: 0 },
    };
    expect(toGeminiResponse(harmony, { ...ctx, reasoningEnd: "<|end|>" }).usageMetadata).toMatchObject({ thoughtsTokenCount: 3, candidatesTokenCount: 5 });
  });

  it("gives a replayed answer (no token text) the thoughts count its source recorded, and none when none was recorded", () => {
    const replayed: EngineResult = { ...toolResult, logprobs: toolResult.logprobs.map((l) => ({ ...l, token: "" })) };
    expect(toGeminiResponse(replayed, ctx).usageMetadata).not.toHaveProperty("thoughtsTokenCount");
    const counted = { ...replayed, usage: { ...replayed.usage, reasoning_tokens: 3 } };
    expect(toGeminiResponse(counted, ctx).usageMetadata).toMatchObject({ thoughtsTokenCount: 3, candidatesTokenCount: counted.usage.completion_tokens - 3 });
  });

  it("answers thought + function call with the signature on the call, usage split into thoughts", () => {
    expect(toGeminiResponse(toolResult, ctx)).toEqual({
      candidates: [
        {
          content: {
            role: "model",
            parts: [
              { text: REASONING, thought: true },
              { functionCall: { id: "chatcmpl-tool-1", name: "run_shell", args: { command: "ls", b: 1 } }, thoughtSignature: SIG },
            ],
          },
          finishReason: "STOP",
          index: 0,
        },
      ],
      usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 2, totalTokenCount: 8, cachedContentTokenCount: 2, thoughtsTokenCount: 3 },
      modelVersion: "gemini-2.5-flash",
      responseId: "r-1",
    });
  });

  it("hides thoughts unless asked, still signing; MAX_TOKENS; client logprobs", () => {
    const res = toGeminiResponse(
      { ...toolResult, message: { content: "Hello", reasoning: REASONING, tool_calls: [] }, finish_reason: "length" },
      { ...ctx, includeThoughts: false, clientLogprobs: { top_logprobs: 0 } },
    );
    const c = res.candidates[0]!;
    expect(c.content.parts).toEqual([{ text: "Hello", thoughtSignature: SIG }]);
    expect(c.finishReason).toBe("MAX_TOKENS");
    expect(c.logprobsResult!.chosenCandidates[0]).toEqual({ token: "<think>", tokenId: 10, logProbability: -0.5 });
    expect(c.avgLogprobs).toBe(-0.5);
    const empty = toGeminiResponse({ ...toolResult, message: { content: null, reasoning: null, tool_calls: [] } }, ctx);
    expect(empty.candidates[0]!.content.parts).toEqual([{ text: "" }]);
  });

  it("round-trips: the echoed answer becomes the canonical assistant turn the engine produced", () => {
    const res = toGeminiResponse(toolResult, { ...ctx, includeThoughts: false });
    const call = fromGemini({ contents: [{ parts: [{ text: "q" }] }, res.candidates[0]!.content] }, { key: KEY });
    expect(call.canonical.messages[1]).toEqual({
      role: "assistant",
      content: "",
      reasoning: REASONING,
      tool_calls: [{ id: "chatcmpl-tool-1", type: "function", function: { name: "run_shell", arguments: '{"command":"ls","b":1}' } }],
    });
  });
});

// vLLM's stream for `<think>\nI should run the shell.\n</think>\n\n<tool_call>…</tool_call>`.
const toolEvents: EngineStreamEvent[] = [
  { type: "start", prompt_ids: [1, 2, 3] },
  { type: "delta", token_ids: [10], logprobs: [lp("<think>")] },
  { type: "delta", reasoning: "\nI should", token_ids: [11], logprobs: [lp("\nI should")] },
  { type: "delta", reasoning: " run the shell.\n", token_ids: [12], logprobs: [lp(" run the shell.\n")] },
  { type: "delta", token_ids: [13], logprobs: [lp("</think>")] },
  { type: "delta", content: "\n\n", token_ids: [14], logprobs: [lp("\n\n")] },
  { type: "delta", tool_calls: [{ index: 0, id: "chatcmpl-tool-1", type: "function", function: { name: "run_shell", arguments: "" } }], token_ids: [15], logprobs: [lp("a")] },
  { type: "delta", tool_calls: [{ index: 0, function: { arguments: '{"command": ' } }], token_ids: [16], logprobs: [lp("b")] },
  { type: "delta", tool_calls: [{ index: 0, function: { arguments: '"ls"}' } }], token_ids: [17], logprobs: [lp("c")] },
  { type: "delta", tool_calls: [{ index: 1, id: "chatcmpl-tool-2", type: "function", function: { name: "read_file", arguments: '{"path": "x"}' } }], token_ids: [18], logprobs: [lp("d")] },
  { type: "finish", finish_reason: "tool_calls", stop_reason: null },
  { type: "usage", usage: { prompt_tokens: 3, completion_tokens: 9, cached_tokens: 0 } },
];

function encode(events: EngineStreamEvent[], mode: GeminiStreamMode, c = ctx): string {
  const enc = new GeminiStreamEncoder(c);
  let out = geminiStreamOpen(mode);
  let n = 0;
  for (const e of events) for (const chunk of enc.push(e)) out += geminiStreamFrame(chunk, mode, n++ === 0);
  for (const chunk of enc.end()) out += geminiStreamFrame(chunk, mode, n++ === 0);
  return out + geminiStreamClose(mode);
}

const chunk = (parts: GeminiPart[], extra: Record<string, unknown> = {}, top: Record<string, unknown> = {}) => ({
  candidates: [{ content: { role: "model", parts }, index: 0, ...extra }],
  modelVersion: "gemini-2.5-flash",
  responseId: "r-1",
  ...top,
});

describe("GeminiStreamEncoder", () => {
  const expected = [
    chunk([{ text: "\nI should", thought: true }]),
    chunk([{ text: " run the shell.\n", thought: true }]),
    chunk([{ functionCall: { id: "chatcmpl-tool-1", name: "run_shell", args: { command: "ls" } }, thoughtSignature: SIG }]),
    chunk([{ functionCall: { id: "chatcmpl-tool-2", name: "read_file", args: { path: "x" } } }], { finishReason: "STOP" }, {
      usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 5, totalTokenCount: 12, cachedContentTokenCount: 0, thoughtsTokenCount: 4 },
    }),
  ];

  it("writes the exact SSE frames: thoughts as they come, whole function calls, usage last", () => {
    expect(encode(toolEvents, "sse")).toBe(expected.map((c) => `data: ${JSON.stringify(c)}\r\n\r\n`).join(""));
  });

  it("takes a delta of any length (a whole long answer as one delta)", () => {
    const n = 300_000; // past what a spread argument list can carry
    const ids = Array.from({ length: n }, (_, i) => i % 1000);
    const events: EngineStreamEvent[] = [{ type: "start", prompt_ids: [1] }, { type: "delta", content: "long", token_ids: ids, logprobs: ids.map(() => lp("x")) }, { type: "finish", finish_reason: "length", stop_reason: null }];
    expect(encode(events, "sse")).toContain('"text":"long"');
  });

  it("writes the exact JSON array form", () => {
    const text = encode(toolEvents, "array");
    expect(text).toBe(`[${expected.map((c) => JSON.stringify(c)).join(",\r\n")}]`);
    expect(JSON.parse(text)).toEqual(expected);
  });

  it("streams text with the signature on its first part and keeps leading newlines of an answer", () => {
    const events: EngineStreamEvent[] = [
      { type: "start", prompt_ids: [1] },
      { type: "delta", reasoning: REASONING, token_ids: [5], logprobs: [lp("r")] },
      { type: "delta", content: "\n\n", token_ids: [6], logprobs: [lp("\n\n")] },
      { type: "delta", content: "Hi", token_ids: [7], logprobs: [lp("Hi")] },
      { type: "delta", content: " there", token_ids: [8], logprobs: [lp(" there")] },
      { type: "finish", finish_reason: "stop", stop_reason: null },
    ];
    const frames = encode(events, "sse", { ...ctx, includeThoughts: false })
      .split("\r\n\r\n")
      .filter(Boolean)
      .map((f) => JSON.parse(f.slice("data: ".length)) as GeminiResponse);
    expect(frames.map((f) => f.candidates[0]!.content.parts)).toEqual([[{ text: "\n\nHi", thoughtSignature: SIG }], [{ text: " there" }], [{ text: "" }]]);
    expect(frames[2]!.candidates[0]!.finishReason).toBe("STOP");
    expect(frames[2]!.usageMetadata).toEqual({ promptTokenCount: 1, candidatesTokenCount: 4, totalTokenCount: 5, cachedContentTokenCount: 0 });
  });

  it("folds to the non-streaming parts", () => {
    const frames = JSON.parse(encode(toolEvents, "array")) as GeminiResponse[];
    const parts = frames.flatMap((f) => f.candidates[0]!.content.parts);
    const thought = parts.filter((p) => p.thought).map((p) => p.text).join("");
    const result: EngineResult = {
      ...toolResult,
      message: {
        ...toolResult.message,
        tool_calls: [
          { id: "chatcmpl-tool-1", type: "function", function: { name: "run_shell", arguments: '{"command": "ls"}' } },
          { id: "chatcmpl-tool-2", type: "function", function: { name: "read_file", arguments: '{"path": "x"}' } },
        ],
      },
    };
    expect([{ text: thought, thought: true }, ...parts.filter((p) => !p.thought)]).toEqual(toGeminiResponse(result, ctx).candidates[0]!.content.parts);
  });

  it("renders errors in Google's shape", () => {
    expect(geminiError(401, "invalid session token", "API_KEY_INVALID")).toEqual({
      error: {
        code: 401,
        message: "invalid session token",
        status: "UNAUTHENTICATED",
        details: [{ "@type": "type.googleapis.com/google.rpc.ErrorInfo", reason: "API_KEY_INVALID", domain: "rollgate" }],
      },
    });
    expect(geminiError(502, "engine down").error.status).toBe("UNAVAILABLE");
  });
});

// Real agent CLIs' requests, recorded through rollgate (__fixtures__/agent-requests/README.md).
const recorded = agentRequests("gemini");

describe("recorded agent requests", () => {
  it("hold a main turn and a tool-result turn of every CLI that speaks Gemini", () => {
    expect(recorded.map((r) => `${r.cli}.${r.kind}`)).toEqual(
      expect.arrayContaining(["gemini-cli", "opencode", "pi"].flatMap((cli) => [`${cli}.main`, `${cli}.tool-result`])),
    );
  });

  it.each(recorded.map((r) => [r.file, r] as const))("accepts %s and keeps every content, call, response and declaration", (_file, { body: raw, reasoning_key }) => {
    type Part = { text?: string; thoughtSignature?: string; functionCall?: { id?: string; name: string; args?: unknown }; functionResponse?: { id?: string; name: string } };
    const body = raw as { contents: { parts: Part[] }[]; tools?: { functionDeclarations?: { name: string }[] }[] };
    const parts = body.contents.flatMap((c) => c.parts);
    const call = fromGemini(body, { key: reasoning_key, stream: true });
    const text = JSON.stringify(call.canonical.messages);
    for (const p of parts) if (p.text) expect(text).toContain(JSON.stringify(p.text).slice(1, -1));
    const declared = (body.tools ?? []).flatMap((t) => t.functionDeclarations ?? []).map((d) => d.name);
    expect(call.canonical.tools?.map((t) => t.function.name) ?? []).toEqual(declared);
    // Every call with its name and arguments; every response paired with its call.
    const calls = call.canonical.messages.flatMap((m) => (m.role === "assistant" ? (m.tool_calls ?? []) : []));
    const sent = parts.flatMap((p) => (p.functionCall ? [p.functionCall] : []));
    expect(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual(sent.map((c) => [c.name, c.args ?? {}]));
    const responses = parts.flatMap((p) => (p.functionResponse ? [p.functionResponse] : []));
    const answered = call.canonical.messages.flatMap((m) => (m.role === "tool" ? [calls.find((c) => c.id === m.tool_call_id)?.function.name] : []));
    expect(answered).toEqual(responses.map((r) => r.name));
    // The reasoning the gateway sealed into thoughtSignature comes back, one model turn each.
    const sealed = body.contents.filter((c) => c.parts.some((p) => p.thoughtSignature && openReasoning(reasoning_key, p.thoughtSignature) !== null));
    expect(call.canonical.messages.filter((m) => m.role === "assistant" && m.reasoning)).toHaveLength(sealed.length);
  });
});

describe("property: random valid requests survive", () => {
  const name = fc.stringMatching(/^[a-z_][a-z0-9_]{0,12}$/);
  const json = fc.jsonValue({ maxDepth: 2 });
  const args = fc.dictionary(fc.string({ minLength: 1, maxLength: 6 }).filter((k) => !/^\d+$/.test(k) && k !== "__proto__"), json, { maxKeys: 4 });
  const userTurn = fc.array(fc.string({ maxLength: 20 }), { minLength: 1, maxLength: 3 }).map((texts) => ({ role: "user", parts: texts.map((text) => ({ text })) }));
  const modelTurn = fc.record({
    text: fc.option(fc.string({ minLength: 1, maxLength: 20 }), { nil: undefined }),
    calls: fc.array(fc.record({ name, args, id: fc.option(fc.uuid(), { nil: undefined }) }), { maxLength: 3 }),
  });
  const conversation = fc.array(fc.tuple(userTurn, modelTurn), { minLength: 1, maxLength: 4 });

  it("keeps every message, function call and argument", () => {
    fc.assert(
      fc.property(conversation, (turns) => {
        const contents: unknown[] = [];
        for (const [u, m] of turns) {
          contents.push(u);
          const parts: unknown[] = [];
          if (m.text !== undefined) parts.push({ text: m.text });
          for (const c of m.calls) parts.push({ functionCall: { name: c.name, args: c.args, ...(c.id ? { id: c.id } : {}) } });
          if (parts.length === 0) parts.push({ text: "" });
          contents.push({ role: "model", parts });
          if (m.calls.length > 0) contents.push({ role: "user", parts: m.calls.map((c) => ({ functionResponse: { name: c.name, response: { r: c.args } } })) });
        }
        const { canonical } = fromGemini({ contents });
        const msgs = canonical.messages;
        let i = 0;
        for (const [u, m] of turns) {
          const user = msgs[i++]!;
          expect(user.role).toBe("user");
          if (u.parts.length === 1) expect(user.content).toBe(u.parts[0]!.text);
          else expect(user.content).toEqual(u.parts.map((p) => ({ type: "text", text: p.text })));
          const model = msgs[i++]!;
          expect(model.role).toBe("assistant");
          if (model.role !== "assistant") return;
          expect(model.content).toBe(m.text ?? "");
          const calls = model.tool_calls ?? [];
          expect(calls.map((c) => c.function.name)).toEqual(m.calls.map((c) => c.name));
          calls.forEach((c, k) => expect(JSON.parse(c.function.arguments)).toEqual(JSON.parse(JSON.stringify(m.calls[k]!.args))));
          // Each response pairs with a call of the same name and carries its payload.
          for (const c of m.calls) {
            const tool = msgs[i++]!;
            expect(tool.role).toBe("tool");
            if (tool.role !== "tool") return;
            const paired = calls.find((x) => x.id === tool.tool_call_id)!;
            expect(paired.function.name).toBe(c.name);
            expect(JSON.parse(tool.content as string)).toEqual(JSON.parse(JSON.stringify({ r: c.args })));
          }
          // Responses never share an id.
          const ids = msgs.filter((x) => x.role === "tool").map((x) => (x.role === "tool" ? x.tool_call_id : ""));
          expect(new Set(ids).size).toBe(ids.length);
        }
        expect(i).toBe(msgs.length);
      }),
      { numRuns: 200 },
    );
  });
});
