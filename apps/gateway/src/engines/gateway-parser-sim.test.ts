/**
 * The gateway's qwen3 parser (the qwen3 profile's, for the token-in path) agrees with engine-sim's
 * chat route on the answers engine-sim writes (the parser's own golden tests, on Qwen3's published
 * format and vLLM's parser tests, are in @rollgate/models).
 */
import { buildEngineSim, getTokenizer } from "@rollgate/engine-sim";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HermesOutputParser, PRESETS, parseWhole, qwen3Parser, type ParsedDelta } from "@rollgate/models";
import { buildVllmCompletionBody } from "./vllm/token-in.js";

/** A `#sim:` step (docs/sim-policy.md#steps) with plain JSON arguments. */
interface SimStep {
  text?: string;
  think?: string;
  tool_calls?: { name: string; arguments: Record<string, unknown> }[];
}

let sim: FastifyInstance;

beforeAll(async () => {
  sim = buildEngineSim({ dpSize: 1 });
  await sim.ready();
});
afterAll(async () => {
  await sim.close();
});

const TOOLS = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];

/**
 * engine-sim's chat answer for a script, read as a stream (as the gateway reads the engine's chat
 * route), and the text it generated (decoded from its token ids).
 */
async function simAnswer(step: SimStep | string, tools: boolean) {
  const script = typeof step === "string" ? step : JSON.stringify([step]);
  const res = await sim.inject({
    method: "POST",
    url: "/v1/chat/completions",
    payload: `{"messages": [{"role": "user", "content": "go\\n#sim: ${script.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"}], "stream": true, "return_token_ids": true${tools ? `, "tools": ${JSON.stringify(TOOLS)}` : ""}}`,
    headers: { "content-type": "application/json" },
  });
  expect(res.statusCode, res.body).toBe(200);
  let content: string | null = null;
  let reasoning: string | null = null;
  let finish = "";
  const ids: number[] = [];
  const calls: { function: { name: string; arguments: string } }[] = [];
  for (const line of res.body.split("\n")) {
    if (!line.startsWith("data: {")) continue;
    const choice = (JSON.parse(line.slice(6)) as { choices: Record<string, unknown>[] }).choices[0];
    if (!choice) continue;
    const delta = choice.delta as { content?: string; reasoning?: string; tool_calls?: { index: number; function: { name?: string; arguments?: string } }[] };
    if (delta.content) content = (content ?? "") + delta.content;
    if (delta.reasoning) reasoning = (reasoning ?? "") + delta.reasoning;
    for (const t of delta.tool_calls ?? []) {
      const c = (calls[t.index] ??= { function: { name: "", arguments: "" } });
      c.function.name += t.function.name ?? "";
      c.function.arguments += t.function.arguments ?? "";
    }
    ids.push(...((choice.token_ids as number[] | undefined) ?? []));
    if (typeof choice.finish_reason === "string") finish = choice.finish_reason;
  }
  const message = { content, reasoning, tool_calls: calls.length ? calls : undefined };
  return { message, finish, text: getTokenizer().decode(ids, true) };
}

const CASES: [string, SimStep | string][] = [
  ["text only", { text: "Hello there." }],
  ["reasoning and text", { think: "Let me think.", text: "The answer is 4." }],
  ["reasoning and a tool call", { think: "Use f.", tool_calls: [{ name: "f", arguments: { path: "a.txt" } }] }],
  ["text and two tool calls", { text: "Calling twice.", tool_calls: [{ name: "f", arguments: { n: 1 } }, { name: "f", arguments: { n: 2 } }] }],
  ["Python-json arguments: floats, key order, non-ASCII, escapes", '[{"tool_calls": [{"name": "f", "arguments": {"2": 1.0, "1": "über \\"q\\"\\n", "big": 123456789012345678901, "e": 1e-7}}]}]'],
  ["reasoning with newlines inside", { think: "line one\n\nline two", text: "ok" }],
];

const parseQwen3Output = (text: string, tools: boolean) => parseWhole(qwen3Parser.create(tools), text);
const Qwen3OutputParser = HermesOutputParser;

describe("Qwen3 output parsers (vLLM qwen3 reasoning + hermes tools)", () => {
  it.each(CASES)("parse like engine-sim's chat route: %s", async (_name, step) => {
    for (const tools of [true, false]) {
      const sim = await simAnswer(step, tools);
      const ours = parseQwen3Output(sim.text, tools);
      expect(ours.content).toBe(sim.message.content);
      expect(ours.reasoning).toBe(sim.message.reasoning);
      expect(ours.tool_calls.map((t) => t.function)).toEqual((sim.message.tool_calls ?? []).map((t) => t.function));
      expect(ours.tool_calls.every((t) => /^chatcmpl-tool-[0-9a-f]{32}$/.test(t.id))).toBe(true);
    }
  });

  it.each(CASES)("stream token by token to the same message: %s", async (_name, step) => {
    const { text, message } = await simAnswer(step, true);
    const tok = getTokenizer();
    const ids = tok.encode(text);
    const parser = new Qwen3OutputParser(true);
    const deltas: ParsedDelta[] = [];
    // Feed the text as the engine streams it: one detokenised token at a time.
    let prev = "";
    for (let i = 1; i <= ids.length; i++) {
      const now = tok.decode(ids.slice(0, i), true);
      const d = parser.push(now.slice(prev.length));
      if (d) deltas.push(d);
      prev = now;
    }
    const tail = parser.end();
    if (tail) deltas.push(tail);
    const content = deltas.map((d) => d.content ?? "").join("");
    const reasoning = deltas.some((d) => d.reasoning !== undefined) ? deltas.map((d) => d.reasoning ?? "").join("") : null;
    expect(content === "" ? null : content).toBe(message.content);
    expect(reasoning).toBe(message.reasoning);
    const calls = deltas.flatMap((d) => d.tool_calls ?? []);
    expect(calls.map((c) => c.function)).toEqual((message.tool_calls ?? []).map((t) => t.function));
    expect(calls.map((c) => c.index)).toEqual(calls.map((_, i) => i));
    // Reasoning streams as it arrives: never held back beyond a possible "</think>" prefix.
    if (message.reasoning) expect(deltas.filter((d) => d.reasoning !== undefined).length).toBeGreaterThan(1);
  });

  it("holds back only what could open a tag, and emits each tool call when it closes", () => {
    const p = new Qwen3OutputParser(true, () => "id");
    expect(p.push("<thi")).toBeNull();
    expect(p.push("nk>\nhm")).toEqual({ reasoning: "\nhm" });
    expect(p.push("\n</th")).toEqual({ reasoning: "\n" });
    expect(p.push("ink>\n\nSee <")).toEqual({ content: "\n\nSee " });
    expect(p.push("tool_call>\n{\"name\": \"f\", ")).toBeNull();
    // Text after a call is content, as the engine's streaming parser gives it.
    expect(p.push('"arguments": {"a": 1.50}}\n</tool_call>\ntrailing')).toEqual({
      content: "\ntrailing",
      tool_calls: [{ index: 0, id: "id", type: "function", function: { name: "f", arguments: '{"a": 1.5}' } }],
    });
    expect(p.end()).toBeNull();
    expect(p.toolCalls).toBe(1);
  });

  it("an unclosed call (an answer cut on length): a call once its name came, as the engine's streamed route gives it", () => {
    expect(parseQwen3Output('<tool_call>\n{"name": "f", "arguments": {}}', true).tool_calls).toHaveLength(1);
    expect(parseQwen3Output('Hi\n<tool_call>\n{"name": "f", "argu', true)).toEqual({ content: "Hi\n", reasoning: null, tool_calls: [{ id: expect.any(String), type: "function", function: { name: "f", arguments: "" } }] });
    expect(parseQwen3Output('Hi\n<tool_call>\n{"na', true)).toEqual({ content: "Hi\n", reasoning: null, tool_calls: [] });
    // Without tools (or tool_choice "none") tool-call text stays content, as in vLLM.
    expect(parseQwen3Output('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', false).content).toBe('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>');
    // Cut inside the reasoning: what came is reasoning (vLLM's streaming behaviour, for both modes).
    expect(parseQwen3Output("<think>\nhalf a thou", true)).toEqual({ content: null, reasoning: "\nhalf a thou", tool_calls: [] });
  });
});

describe("buildVllmCompletionBody", () => {
  const target = { engine: { kind: "vllm" as const, url: "http://e", dp_size: 1 }, dpRank: 0, profile: PRESETS.qwen3 } as never;
  const base = {
    target,
    model: "Qwen/Qwen3-8B",
    requestId: "r",
    signal: new AbortController().signal,
    dispatcher: undefined as never,
    tokenIds: [1, 2, 3],
    maxModelLen: 100,
  };
  it("sends the ids, token extensions and the session's sampling; max_tokens defaults to the context left", () => {
    const request = {
      messages: [{ role: "user" as const, content: "x" }],
      sampling: { temperature: 0.7, stop: ["END"], seed: 3 },
      stream: true,
      client_logprobs: { top_logprobs: 2 },
    };
    expect(buildVllmCompletionBody({ ...base, request })).toEqual({
      model: "Qwen/Qwen3-8B",
      prompt: [1, 2, 3],
      stream: true,
      stream_options: { include_usage: true },
      logprobs: 2,
      return_token_ids: true,
      max_tokens: 97,
      temperature: 0.7,
      stop: ["END"],
      seed: 3,
    });
    const plain = buildVllmCompletionBody({ ...base, request: { ...request, stream: false, client_logprobs: null, sampling: { max_tokens: 5 } } });
    expect(plain).toEqual({ model: "Qwen/Qwen3-8B", prompt: [1, 2, 3], stream: false, logprobs: 0, return_token_ids: true, max_tokens: 5 });
  });
});
