/**
 * The continuation planner against a fake engine that renders with engine-sim's real Qwen3
 * template and tokenizer (no HTTP): when it continues token-in, how the new turns' ids are cut,
 * and every case in which it leaves the call to the engine's chat route.
 */
import type { CanonicalChatRequest, ChatMessage, CompletionRecord } from "@rollgate/protocol";
import { getTokenizer, parsePyJson, renderChat } from "@rollgate/engine-sim";
import { findExtendedRecord, matchEchoedHistory, recordHead } from "@rollgate/transforms";
import { describe, expect, it } from "vitest";
import type { TokenInEngine, TokenizeCall } from "../engines/token-in.js";
import { planContinuation, type ContinuationMode } from "./continuation.js";

const tok = getTokenizer();
const TOOLS = [{ type: "function" as const, function: { name: "shell", parameters: { type: "object" } } }];

function fakeEngine(opts: { probe?: string } = {}): TokenInEngine {
  return {
    plansHistory: true,
    async tokenizeChat(call, messages, addGenerationPrompt) {
      const text = renderChat({
        messages: messages.map((m) => (m.role === "assistant" && m.reasoning ? { ...m, reasoning_content: m.reasoning } : m)),
        tools: call.request.tools ? call.request.tools.map((t) => parsePyJson(JSON.stringify(t))) : null,
        addGenerationPrompt,
        chatTemplateKwargs: call.request.enable_thinking !== undefined ? { enable_thinking: call.request.enable_thinking } : null,
      });
      return { ids: tok.encode(text), maxModelLen: 40960 };
    },
    async tokenizeText(_call, text) {
      return tok.encode(opts.probe ?? text);
    },
    detokenize: async (_call, ids) => tok.decode(ids),
    maxModelLen: async () => 40960,
    parseAnswer: () => {
      throw new Error("not used");
    },
    generate: () => Promise.reject(new Error("not used")),
    generateStream: () => {
      throw new Error("not used");
    },
  };
}

let engineNo = 0;
const callFor = (request: CanonicalChatRequest): TokenizeCall =>
  ({ target: { engine: { kind: "vllm", url: `http://fake-${engineNo++}`, dp_size: 1 }, dpRank: 0 }, model: "m", request, signal: new AbortController().signal, dispatcher: undefined }) as never;

const render = (messages: ChatMessage[], thinking: boolean, agp: boolean) =>
  tok.encode(
    renderChat({
      messages: messages.map((m) => (m.role === "assistant" && m.reasoning ? { ...m, reasoning_content: m.reasoning } : m)),
      tools: TOOLS.map((t) => parsePyJson(JSON.stringify(t))),
      addGenerationPrompt: agp,
      chatTemplateKwargs: { enable_thinking: thinking },
    }),
  );

/** A recorded first call: the engine's prompt for `messages`, and the ids of what it emitted. */
function firstCall(messages: ChatMessage[], thinking: boolean, emitted: string, message: CompletionRecord["message"]): CompletionRecord {
  const out = tok.encode(emitted);
  return {
    id: "r0",
    session_id: "s",
    seq: 0,
    created_at: "2026-01-01T00:00:00.000Z",
    protocol: "openai_chat",
    engine: "http://e",
    dp_rank: 0,
    weight_version: null,
    request: { messages, sampling: {}, tools: TOOLS, enable_thinking: thinking },
    prompt_ids: render(messages, thinking, true),
    output_ids: out,
    output_logprobs: out.map(() => -0.1),
    finish_reason: "tool_calls",
    message,
    usage: { prompt_tokens: 0, completion_tokens: out.length, cached_tokens: 0 },
    latency_ms: 1,
  };
}

const START: ChatMessage[] = [
  { role: "system", content: "sys" },
  { role: "user", content: "go" },
];
const CALL = { id: "chatcmpl-tool-1", type: "function" as const, function: { name: "shell", arguments: '{"command": "ls"}' } };

async function plan(mode: ContinuationMode, record: CompletionRecord, next: ChatMessage[], extra: Partial<CanonicalChatRequest> = {}, engine = fakeEngine()) {
  const history = matchEchoedHistory(next, [recordHead(record)]);
  const request: CanonicalChatRequest = { messages: history.messages, tools: TOOLS, sampling: {}, stream: false, client_logprobs: null, enable_thinking: record.request.enable_thinking!, ...extra };
  const found = findExtendedRecord(request, history);
  return planContinuation({ mode, engine, call: callFor(request), request, extended: found && { record, index: found.index } });
}

describe("planContinuation", () => {
  const off = firstCall(START, false, '<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>', {
    content: null,
    reasoning: null,
    tool_calls: [CALL],
  });
  const afterTool: ChatMessage[] = [...START, { role: "assistant", content: null, tool_calls: [CALL] }, { role: "tool", content: "a.txt", tool_call_id: CALL.id }];

  it("thinking off: continues token-in from the record's ids plus the engine's own rendering of the new turns", async () => {
    const out = await plan("auto", off, afterTool);
    expect(out.plan).not.toBeNull();
    const p = out.plan!;
    const full = render(afterTool, false, true);
    const suffix = tok.encode("<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    expect(p.promptIds).toEqual([...off.prompt_ids, ...off.output_ids, ...tok.encode("\n"), ...suffix]);
    expect(full.slice(-suffix.length)).toEqual(suffix);
    // The engine's render would have dropped the empty think block: that is where it diverged.
    expect(p.divergesAt).toBe(off.prompt_ids.length - 4);
  });

  it("thinking on, reasoning echoed back: auto leaves it to the chat route, token_in still continues", async () => {
    const on = firstCall(START, true, '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>', {
      content: "\n\n",
      reasoning: "\nhm\n",
      tool_calls: [CALL],
    });
    const next: ChatMessage[] = [...START, { role: "assistant", content: "\n\n", tool_calls: [CALL] }, { role: "tool", content: "x", tool_call_id: CALL.id }];
    expect(await plan("auto", on, next)).toEqual({ plan: null, why: "the engine's rendering reproduces the recorded tokens" });
    const forced = await plan("token_in", on, next);
    expect(forced.plan?.promptIds).toEqual(render(matchEchoedHistory(next, [recordHead(on)]).messages, true, true));
    expect(forced.plan?.divergesAt).toBeNull();
    // A new user query: the template would drop the reasoning; the sentinel is then a user turn.
    const q = await plan("auto", on, [...next.slice(0, 4), { role: "user", content: "more" }]);
    expect(q.plan).not.toBeNull();
    expect(tok.decode(q.plan!.promptIds)).toContain("<think>\nhm\n</think>\n\n<tool_call>");
    expect(tok.decode(q.plan!.promptIds).endsWith("<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")).toBe(true);
  });

  it("renders when it cannot or need not continue", async () => {
    expect((await plan("render", off, afterTool)).plan).toBeNull();
    expect(await plan("auto", off, START)).toMatchObject({ plan: null, why: "the call extends no recorded call" });
    expect(await plan("auto", off, afterTool, { tool_choice: "required" })).toMatchObject({ why: expect.stringMatching(/guided decoding/) });
    expect(await plan("auto", off, afterTool, {}, fakeEngine({ probe: "no special tokens here" }))).toMatchObject({ why: expect.stringMatching(/Qwen3's chat format/) });
    expect(await plan("auto", { ...off, finish_reason: "abort" }, afterTool)).toMatchObject({ why: expect.stringMatching(/abort/) });
    // The agent changed the recorded answer: not a continuation of it.
    const edited: ChatMessage[] = [...START, { role: "assistant", content: "something else", tool_calls: [CALL] }, afterTool[3]!];
    expect(await plan("token_in", off, edited)).toMatchObject({ plan: null, why: "the call extends no recorded call" });
  });
});
