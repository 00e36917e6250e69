import type { ChatMessage, ToolDefinition } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { IM_END, IM_START, makeRecord, NL } from "./__fixtures__/make-record.js";
import { prefixMerging } from "./index.js";

const THINK = 151667;
const END_THINK = 151668;
const SYS = [IM_START, 8948, NL, 100, 101, IM_END, NL];
const user = (...body: number[]) => [IM_START, 872, NL, ...body, IM_END, NL];
const GEN = [IM_START, 77091, NL];
const P1 = [...SYS, ...user(200), ...GEN];
const MSGS: ChatMessage[] = [
  { role: "system", content: "be brief" },
  { role: "user", content: "task" },
];
const TOOL = (name: string): ToolDefinition => ({ type: "function", function: { name, parameters: { type: "object" } } });

describe("break reasons", () => {
  it("sibling: same prompt as an earlier record", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: P1, output_ids: [1, IM_END], messages: MSGS });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: P1, output_ids: [2, IM_END], messages: MSGS });
    const [brk] = prefixMerging([a, b]).stats.breaks;
    expect(brk).toMatchObject({ record_id: "b", closest_trace: 0, position: P1.length, reason: "sibling" });
    expect(brk!.detail).toContain("record a");
  });

  it("tools_changed: the tool list differs from the closest chain's last record", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: P1, output_ids: [1, IM_END], messages: MSGS, tools: [TOOL("read")] });
    // Qwen3 renders tools into the system turn: the prompt diverges inside it
    const p2 = [IM_START, 8948, NL, 100, 102, IM_END, NL, ...user(200), ...GEN];
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: p2, output_ids: [2, IM_END], messages: MSGS, tools: [TOOL("read"), TOOL("write")] });
    const t = prefixMerging([a, b]);
    expect(t.traces).toHaveLength(2);
    expect(t.stats.breaks).toEqual([expect.objectContaining({ record_id: "b", closest_trace: 0, position: 4, reason: "tools_changed" })]);
  });

  it("system_changed: the system message differs (e.g. a per-request billing line)", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: P1, output_ids: [1, IM_END], messages: MSGS });
    const p2 = [IM_START, 8948, NL, 100, 103, IM_END, NL, ...user(200), ...GEN, 1, IM_END, NL, ...user(5), ...GEN];
    const msgs2: ChatMessage[] = [{ role: "system", content: "be brief cch=2" }, ...MSGS.slice(1)];
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: p2, output_ids: [2, IM_END], messages: msgs2 });
    expect(prefixMerging([a, b]).stats.breaks).toEqual([
      expect.objectContaining({ record_id: "b", closest_trace: 0, position: 4, reason: "system_changed" }),
    ]);
  });

  it("truncated_output: the last output stopped on length and the next prompt re-renders its tail", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: P1, output_ids: [300, 301], finish_reason: "length", messages: MSGS });
    // the cut-off token 301 (half a word) comes back re-tokenised as 399
    const p2 = [...P1, 300, 399, IM_END, NL, ...user(5), ...GEN];
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: p2, output_ids: [2, IM_END], messages: MSGS });
    expect(prefixMerging([a, b]).stats.breaks).toEqual([
      expect.objectContaining({ record_id: "b", closest_trace: 0, position: P1.length + 1, reason: "truncated_output" }),
    ]);
  });

  it("history_rewritten: Qwen3 drops the earlier reasoning, the prompt diverges inside a generated output", () => {
    const a = makeRecord({
      id: "a", seq: 0, prompt_ids: P1, output_ids: [THINK, 11, 12, END_THINK, 271, 300, IM_END], messages: MSGS,
      message: { content: "ok", reasoning: "hmm" },
    });
    const p2 = [...P1, 300, IM_END, NL, ...user(5), ...GEN];
    const b = makeRecord({
      id: "b", seq: 1, prompt_ids: p2, output_ids: [2, IM_END],
      messages: [...MSGS, { role: "assistant", content: "ok", reasoning: "hmm" }, { role: "user", content: "next" }],
    });
    const t = prefixMerging([a, b]);
    expect(t.traces).toHaveLength(2);
    const [brk] = t.stats.breaks;
    expect(brk).toMatchObject({ record_id: "b", closest_trace: 0, position: P1.length, reason: "history_rewritten" });
    expect(brk!.detail).toContain("record a");

    // nothing was silently merged: the second trace starts from b's own prompt, output fully trainable
    expect(t.traces[1]).toMatchObject({ prompt_ids: p2, response_ids: [2, IM_END], loss_mask: [1, 1] });
  });

  /** What the gateway passes for an engine on the qwen3 profile (the wording is the profile's). */
  const QWEN3_TEMPLATE = {
    profile: "qwen3",
    toolResultWrappers: [["<tool_response>", "</tool_response>"]] as const,
    reasoningDropped: "the template leaves out the reasoning of turns before the last user query",
    generationPromptDropped: "with thinking off the template renders earlier turns without the empty think block",
  };

  describe("history_rewritten names a reasoning drop when a user query follows the turn", () => {
    const a = makeRecord({
      id: "a", seq: 0, prompt_ids: P1, output_ids: [THINK, 11, END_THINK, 271, 300, IM_END], messages: MSGS,
      message: { content: "\n\nok", reasoning: "\nhmm\n" },
    });
    const b = (next: string) =>
      makeRecord({
        id: "b", seq: 1, prompt_ids: [...P1, 271, 300, IM_END, NL, ...user(5), ...GEN], output_ids: [2, IM_END],
        messages: [...MSGS, { role: "assistant", content: "\n\nok", reasoning: "\nhmm\n" }, { role: "user", content: next }],
      });

    it("in general words when the template is unknown", () => {
      const [brk] = prefixMerging([a, b("next")]).stats.breaks;
      expect(brk).toMatchObject({ record_id: "b", position: P1.length, reason: "history_rewritten" });
      expect(brk!.detail).toMatch(/left out that turn's reasoning, now that a later user query follows it$/);
    });

    it("in the profile's words when the gateway knows the template", () => {
      const [brk] = prefixMerging([a, b("next")], { template: QWEN3_TEMPLATE }).stats.breaks;
      expect(brk!.detail).toMatch(/left out that turn's reasoning, now that a later user query follows it \(qwen3 profile: the template leaves out/);
    });

    it("a tool result the template wraps is not a user query", () => {
      const [brk] = prefixMerging([a, b("<tool_response>\nok\n</tool_response>")], { template: QWEN3_TEMPLATE }).stats.breaks;
      expect(brk!.detail).not.toMatch(/reasoning/);
      // Without the profile's wrappers it would read as a query.
      expect(prefixMerging([a, b("<tool_response>\nok\n</tool_response>")]).stats.breaks[0]!.detail).toMatch(/reasoning/);
    });
  });

  it("history_rewritten names the generation prompt the template does not re-render (Qwen3, thinking off)", () => {
    const GEN_OFF = [...GEN, THINK, 271, END_THINK, 271];
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: [...SYS, ...user(200), ...GEN_OFF], output_ids: [300, IM_END], messages: MSGS, message: { content: "ok" } });
    const b = makeRecord({
      id: "b", seq: 1, prompt_ids: [...SYS, ...user(200), ...GEN, 300, IM_END, NL, ...user(5), ...GEN_OFF], output_ids: [2, IM_END],
      messages: [...MSGS, { role: "assistant", content: "ok" }, { role: "user", content: "next" }],
    });
    const [brk] = prefixMerging([a, b]).stats.breaks;
    expect(brk).toMatchObject({ record_id: "b", position: P1.length, reason: "history_rewritten" });
    expect(brk!.detail).toMatch(/4 tokens before record a's output, in the generation prompt it was sampled after: the chat template renders that turn without it$/);
    expect(prefixMerging([a, b], { template: QWEN3_TEMPLATE }).stats.breaks[0]!.detail).toMatch(/without it \(qwen3 profile: with thinking off/);
  });

  it("history_rewritten inside a generated output, in the profile's words when it knows how its template re-renders", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: P1, output_ids: [300, 301, 302, IM_END], messages: MSGS, message: { content: "ok" } });
    const b = makeRecord({
      id: "b", seq: 1, prompt_ids: [...P1, 300, 999, 302, IM_END, NL, ...user(5), ...GEN], output_ids: [2, IM_END],
      messages: [...MSGS, { role: "assistant", content: "ok" }, { role: "tool", content: "x", tool_call_id: "c" }],
    });
    const [brk] = prefixMerging([a, b]).stats.breaks;
    expect(brk).toMatchObject({ reason: "history_rewritten", position: P1.length + 1 });
    expect(brk!.detail).toMatch(/diverges at token 1 of record a's generated output \(the history was re-rendered differently\)$/);
    expect(prefixMerging([a, b], { template: { profile: "gpt-oss", rerendered: "harmony re-renders past turns" } }).stats.breaks[0]!.detail).toMatch(
      /re-rendered differently\) \(gpt-oss profile: harmony re-renders past turns\)$/,
    );
  });

  it("history_rewritten: the messages show an earlier assistant turn changed (compaction)", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: P1, output_ids: [1, IM_END], messages: MSGS, message: { content: "step 1" } });
    const p2 = [...SYS, ...user(201), ...GEN, 9, IM_END, NL, ...user(5), ...GEN];
    const b = makeRecord({
      id: "b", seq: 1, prompt_ids: p2, output_ids: [2, IM_END],
      messages: [MSGS[0]!, { role: "user", content: "task (summarised)" }, { role: "assistant", content: "summary" }, { role: "user", content: "go on" }],
    });
    const [brk] = prefixMerging([a, b]).stats.breaks;
    expect(brk).toMatchObject({ record_id: "b", closest_trace: 0, position: SYS.length + 3, reason: "history_rewritten" });
    expect(brk!.detail).toContain("content changed");
  });

  it("unknown: a new conversation with the same system prompt and tools", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: P1, output_ids: [1, IM_END], messages: MSGS });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: [...SYS, ...user(777), ...GEN], output_ids: [2, IM_END], messages: [MSGS[0]!, { role: "user", content: "other" }] });
    expect(prefixMerging([a, b]).stats.breaks).toEqual([
      expect.objectContaining({ record_id: "b", closest_trace: 0, position: SYS.length + 3, reason: "unknown" }),
    ]);
  });

  it("unknown with no closest trace when nothing is shared", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: [5, 6], output_ids: [1] });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: [7, 8], output_ids: [2] });
    expect(prefixMerging([a, b]).stats.breaks).toEqual([
      expect.objectContaining({ record_id: "b", closest_trace: null, position: null, reason: "unknown" }),
    ]);
  });

  it("names the chain with the longest common prefix as the closest", () => {
    const a = makeRecord({ id: "a", seq: 0, prompt_ids: [1, 2, 3], output_ids: [4] });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: [9, 9], output_ids: [4] });
    const c = makeRecord({ id: "c", seq: 2, prompt_ids: [9, 9, 8, 1], output_ids: [4] }); // shares [9,9] with b, [] with a... b's tip is [9,9,4]
    const t = prefixMerging([a, b, c]);
    expect(t.stats.breaks.at(-1)).toMatchObject({ record_id: "c", closest_trace: 1, position: 2 });
  });
});
