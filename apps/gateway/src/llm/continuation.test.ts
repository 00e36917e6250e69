/**
 * The continuation planner against a fake engine that renders with engine-sim's real Qwen3
 * template and tokenizer (no HTTP): when it continues token-in, how the new turns' ids are cut,
 * and every case in which it leaves the call to the engine's chat route. Nothing in the planner
 * knows ChatML: the end-of-turn token is derived from the fake engine's renders.
 */
import { PRESETS } from "@rollgate/models";
import type { CanonicalChatRequest, ChatMessage, CompletionRecord } from "@rollgate/protocol";
import { getTokenizer, parsePyJson, renderChat } from "@rollgate/engine-sim";
import { applyNormalizations, findExtendedRecord, matchEchoedHistory, recordHead } from "@rollgate/transforms";
import { describe, expect, it } from "vitest";
import type { TokenInRoute } from "../engines/token-in.js";
import type { EngineTokenizer, TokenizeCall } from "../engines/tokenizer.js";
import { continuesRecord, planContinuation, type ContinuationMode } from "./continuation.js";
import { HistoryNormalizer } from "./history-normalizer.js";
import { tokenAfterDifference } from "./turn-markers.js";

const tok = getTokenizer();
const TOOLS = [{ type: "function" as const, function: { name: "shell", parameters: { type: "object" } } }];
const IM_END = tok.encode("<|im_end|>")[0]!;
const ENDOFTEXT = tok.encode("<|endoftext|>")[0]!;

function renderIds(messages: ChatMessage[], thinking: boolean | undefined, agp = true): number[] {
  return tok.encode(
    renderChat({
      messages: messages.map((m) => (m.role === "assistant" && m.reasoning ? { ...m, reasoning_content: m.reasoning } : m)),
      tools: TOOLS.map((t) => parsePyJson(JSON.stringify(t))),
      addGenerationPrompt: agp,
      chatTemplateKwargs: thinking !== undefined ? { enable_thinking: thinking } : null,
    }),
  );
}

/**
 * A fake engine on the real Qwen3 template. `endsByRole` makes it end an assistant turn with a
 * different token before a tool result (as a template without an end token of its own does).
 */
function fakeTokenizer(opts: { endsByRole?: boolean } = {}): EngineTokenizer {
  return {
    async renderChat(call, messages) {
      const ids = renderIds(messages, call.request.enable_thinking);
      if (opts.endsByRole && messages.at(-1)?.role === "tool") return { ids: ids.map((id) => (id === IM_END ? ENDOFTEXT : id)), maxModelLen: 40960 };
      return { ids, maxModelLen: 40960 };
    },
    tokenizeText: async (_call, text) => tok.encode(text),
    detokenize: async (_call, ids) => tok.decode(ids, false),
    maxModelLen: async () => 40960,
  };
}

const route = (parsedBy: "engine" | "gateway" = "engine"): TokenInRoute => ({
  name: parsedBy === "engine" ? "chat_prompt_token_ids" : "completions",
  parsedBy,
  generate: () => Promise.reject(new Error("not used")),
  generateStream: () => {
    throw new Error("not used");
  },
});

let engineNo = 0;
const callFor = (request: CanonicalChatRequest, url = `http://fake-${engineNo++}`): TokenizeCall =>
  ({ target: { engine: { kind: "vllm", url, dp_size: 1 }, dpRank: 0, profile: PRESETS.qwen3 }, model: "m", request, signal: new AbortController().signal, dispatcher: undefined }) as never;

const render = (messages: ChatMessage[], thinking: boolean, agp: boolean) => renderIds(messages, thinking, agp);

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

/** Restores, normalises (learning the forms as the gateway does) and plans, like ChatCaller.prepare. */
async function plan(
  mode: ContinuationMode,
  record: CompletionRecord,
  next: ChatMessage[],
  extra: Partial<CanonicalChatRequest> = {},
  opts: { tokenizer?: EngineTokenizer; route?: TokenInRoute | null; engineUrl?: string } = {},
) {
  const tokenizer = opts.tokenizer ?? fakeTokenizer();
  const history = matchEchoedHistory(next, [recordHead(record)]);
  let request: CanonicalChatRequest = { messages: history.messages, tools: TOOLS, sampling: {}, stream: false, client_logprobs: null, enable_thinking: record.request.enable_thinking!, ...extra };
  const found = findExtendedRecord(request, history);
  const call = callFor(request, opts.engineUrl);
  const restored = history.producers.flatMap((p, i) => (p ? [i] : []));
  const normalizer = new HistoryNormalizer();
  if (found) await normalizer.learn(tokenizer, call, request.messages, found.index, record);
  request = { ...request, messages: applyNormalizations(request.messages, restored, normalizer.learned(call)) };
  // As ChatCaller gives it: the record's head, the full record still being read.
  const extended = found && { record: found.record, index: found.index, full: Promise.resolve(record) };
  return planContinuation({ mode, route: opts.route === undefined ? route() : opts.route, noRoute: "no route here", tokenizer, call: { ...call, request }, request, extended });
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
    // The "\n\n" content beside the call was learned to re-render as "" (what reproduces the ids).
    const normalised = matchEchoedHistory(next, [recordHead(on)]).messages.map((m, i) => (i === 2 ? { ...m, content: "" } : m)) as ChatMessage[];
    expect(forced.plan?.promptIds).toEqual(render(normalised, true, true));
    expect(forced.plan?.divergesAt).toBeNull();
    // A new user query: the template would drop the reasoning; the sentinel is then a user turn.
    const q = await plan("auto", on, [...next.slice(0, 4), { role: "user", content: "more" }]);
    expect(q.plan).not.toBeNull();
    expect(tok.decode(q.plan!.promptIds)).toContain("<think>\nhm\n</think>\n\n<tool_call>");
    expect(tok.decode(q.plan!.promptIds).endsWith("<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")).toBe(true);
  });

  it("one engine's plans are the same whichever of its calls came before (a reproduced history, then one that is not)", async () => {
    const on = firstCall(START, true, '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>', {
      content: "\n\n",
      reasoning: "\nhm\n",
      tool_calls: [CALL],
    });
    const next: ChatMessage[] = [...START, { role: "assistant", content: "\n\n", tool_calls: [CALL] }, { role: "tool", content: "x", tool_call_id: CALL.id }];
    const query: ChatMessage[] = [...next, { role: "user", content: "more" }];
    const engineUrl = `http://fake-shared-${engineNo++}`;
    const alone = await plan("auto", on, query);
    expect(alone.plan).not.toBeNull();
    expect(await plan("auto", on, next, {}, { engineUrl })).toEqual({ plan: null, why: "the engine's rendering reproduces the recorded tokens" });
    expect(await plan("auto", on, query, {}, { engineUrl })).toEqual(alone);
    expect(await plan("auto", on, query, {}, { engineUrl })).toEqual(alone);
    expect(await plan("auto", on, next, {}, { engineUrl })).toEqual({ plan: null, why: "the engine's rendering reproduces the recorded tokens" });
    expect(await plan("auto", on, next, {}, { engineUrl })).toEqual({ plan: null, why: "the engine's rendering reproduces the recorded tokens" });
    // A plain answer then a new query reproduces; the same engine's next call, whose reasoning the
    // template drops, does not, and is continued token-in as on an engine that saw nothing before.
    const plain = firstCall(START, true, "All done.<|im_end|>", { content: "All done.", reasoning: null, tool_calls: [] });
    const asked: ChatMessage[] = [...START, { role: "assistant", content: "All done." }, { role: "user", content: "more" }];
    const askedAlone = await plan("auto", plain, asked);
    expect(askedAlone).toEqual({ plan: null, why: "the engine's rendering reproduces the recorded tokens" });
    for (let i = 0; i < 2; i++) {
      expect(await plan("auto", plain, asked, {}, { engineUrl })).toEqual(askedAlone);
      expect(await plan("auto", plain, asked, {}, { engineUrl })).toEqual(askedAlone);
      expect(await plan("auto", on, query, {}, { engineUrl })).toEqual(alone);
    }
    // A record that cannot be read (gone): nothing to continue.
    const call = callFor({ messages: query, tools: TOOLS, sampling: {}, stream: false, client_logprobs: null, enable_thinking: true }, engineUrl);
    const history = matchEchoedHistory(query, [recordHead(on)]);
    const found = findExtendedRecord({ ...call.request, messages: history.messages }, history)!;
    const missing = await planContinuation({ mode: "auto", route: route(), tokenizer: fakeTokenizer(), call, request: { ...call.request, messages: history.messages }, extended: { record: found.record, index: found.index, full: Promise.resolve(null) } });
    expect(missing).toEqual({ plan: null, why: "the call extends no recorded call" });
  });

  it("one engine's plans, over a mix of its calls (thinking on and off, tool results and queries, records that reproduce and that do not, each twice), are those of an engine that saw none before", async () => {
    const toolOut = '<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>';
    const records = {
      onTool: firstCall(START, true, `<think>\nhm\n</think>\n\n${toolOut}`, { content: "\n\n", reasoning: "\nhm\n", tool_calls: [CALL] }),
      offTool: firstCall(START, false, toolOut, { content: null, reasoning: null, tool_calls: [CALL] }),
      onPlain: firstCall(START, true, "<think>\nok\n</think>\n\nAll done.<|im_end|>", { content: "All done.", reasoning: "\nok\n", tool_calls: [] }),
      onBare: firstCall(START, true, "All done.<|im_end|>", { content: "All done.", reasoning: null, tool_calls: [] }),
      offPlain: firstCall(START, false, "All done.<|im_end|>", { content: "All done.", reasoning: null, tool_calls: [] }),
      cut: { ...firstCall(START, false, "All do", { content: "All do", reasoning: null, tool_calls: [] }), finish_reason: "length" },
    };
    const answerOf = (r: CompletionRecord): ChatMessage =>
      r.message.tool_calls.length ? { role: "assistant", content: r.message.content, tool_calls: [CALL] } : { role: "assistant", content: r.message.content };
    const nexts = (r: CompletionRecord): ChatMessage[][] => {
      const base = [...START, answerOf(r)];
      return r.message.tool_calls.length
        ? [
            [...base, { role: "tool", content: "x", tool_call_id: CALL.id }],
            [...base, { role: "tool", content: "x", tool_call_id: CALL.id }, { role: "user", content: "more" }],
          ]
        : [[...base, { role: "user", content: "more" }], [...base, { role: "user", content: "<tool_response>\nx\n</tool_response>" }]];
    };
    const cases = Object.values(records).flatMap((r) => nexts(r).map((next) => ({ r, next })));
    for (const mode of ["auto", "token_in"] as const) {
      const alone = [];
      for (const { r, next } of cases) alone.push(await plan(mode, r, next));
      expect(alone.some((o) => o.plan)).toBe(true);
      expect(alone.some((o) => !o.plan)).toBe(mode === "auto");
      const engineUrl = `http://fake-mixed-${engineNo++}`;
      // A fixed shuffle, each call twice in a row, then the whole list again backwards.
      let x = 11;
      const order = cases.map((_, i) => i).sort(() => ((x = (x * 48271) % 2147483647) % 3) - 1);
      for (const i of [...order, ...order.slice().reverse()]) {
        for (let k = 0; k < 2; k++) expect(await plan(mode, cases[i]!.r, cases[i]!.next, {}, { engineUrl })).toEqual(alone[i]);
      }
    }
  });

  it("renders when it cannot or need not continue", async () => {
    expect((await plan("render", off, afterTool)).plan).toBeNull();
    expect(await plan("auto", off, START)).toMatchObject({ plan: null, why: "the call extends no recorded call" });
    expect((await plan("auto", off, afterTool, { tool_choice: "required" })).plan).not.toBeNull();
    expect(await plan("auto", off, afterTool, {}, { tokenizer: fakeTokenizer({ endsByRole: true }) })).toMatchObject({
      why: expect.stringMatching(/different token before a user message than before a tool result/),
    });
    expect(await plan("auto", off, afterTool, {}, { route: null })).toMatchObject({ plan: null, why: "no route here" });
    // Guided decoding needs a chat route: a route the gateway parses cannot give it.
    expect(await plan("auto", off, afterTool, { tool_choice: "required" }, { route: route("gateway") })).toMatchObject({ why: expect.stringMatching(/guided decoding/) });
    expect(await plan("auto", { ...off, finish_reason: "abort" }, afterTool)).toMatchObject({ why: expect.stringMatching(/abort/) });
    // The agent changed the recorded answer: not a continuation of it.
    const edited: ChatMessage[] = [...START, { role: "assistant", content: "something else", tool_calls: [CALL] }, afterTool[3]!];
    expect(await plan("token_in", off, edited)).toMatchObject({ plan: null, why: "the call extends no recorded call" });
  });
});

describe("continuesRecord: the engine's own chat-route prompt, checked against the record it extends", () => {
  const on = firstCall(START, true, '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>', {
    content: "\n\n",
    reasoning: "\nhm\n",
    tool_calls: [CALL],
  });
  // The history as the gateway sends it: the turn restored with its reasoning, in the form that re-renders its ids.
  const history: ChatMessage[] = [...START, { role: "assistant", content: "", reasoning: "\nhm\n", tool_calls: [CALL] }, { role: "tool", content: "x", tool_call_id: CALL.id }];

  it("continues when the prompt is the record's ids, then more; not when the template dropped its reasoning or nothing follows", () => {
    expect(continuesRecord(render(history, true, true), on, IM_END)).toBe(true);
    // A new user query: Qwen3 drops the reasoning of the turns before it, so the prompt leaves the record.
    expect(continuesRecord(render([...history, { role: "user", content: "more" }], true, true), on, IM_END)).toBe(false);
    expect(continuesRecord([...on.prompt_ids, ...on.output_ids], on, IM_END)).toBe(false);
  });

  it("a record cut before its end of turn (max_tokens) is continued by a prompt that closes the turn with that token, and by no other", () => {
    const cut = { ...on, output_ids: on.output_ids.slice(0, -1) };
    const after = tok.encode("\n<|im_start|>user\n");
    expect(continuesRecord([...cut.prompt_ids, ...cut.output_ids, IM_END, ...after], cut, IM_END)).toBe(true);
    expect(continuesRecord([...cut.prompt_ids, ...cut.output_ids, ENDOFTEXT, ...after], cut, IM_END)).toBe(false);
    expect(continuesRecord([...cut.prompt_ids, ...cut.output_ids, ...after], cut, IM_END)).toBe(false);
  });
});

describe("turn markers", () => {
  it("the first token after the one run where two renders differ", () => {
    expect(tokenAfterDifference([1, 2, 3, 9, 8, 7], [1, 2, 4, 4, 9, 8, 7])).toBe(9);
    expect(tokenAfterDifference([1, 2], [1, 2])).toBeNull();
    expect(tokenAfterDifference([1, 2, 3], [1, 2, 4])).toBeNull();
  });
});
