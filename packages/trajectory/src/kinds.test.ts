import type { ChatMessage, ToolDefinition } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { makeRecord } from "./__fixtures__/make-record.js";
import { perRequest, prefixMerging, prefixTree } from "./index.js";

const tool = (name: string): ToolDefinition => ({ type: "function", function: { name, parameters: { type: "object" } } });
const MAIN_TOOLS = [tool("Agent"), tool("Bash")];
const SUB_TOOLS = [tool("Bash"), tool("Read")];
const TASK = "Search the repository for the bug in foo.py and report the line it is on";

describe("trace kinds: a sub-agent started by the Agent tool", () => {
  const mainSys: ChatMessage = { role: "system", content: "You are the main agent" };
  const ask: ChatMessage = { role: "user", content: "Fix the bug in foo.py" };
  const call = { id: "toolu_1", type: "function" as const, function: { name: "Agent", arguments: JSON.stringify({ description: "Find bug", prompt: TASK, subagent_type: "general-purpose" }) } };
  const r0 = makeRecord({ id: "r0", seq: 0, prompt_ids: [1, 1, 10], output_ids: [11], messages: [mainSys, ask], tools: MAIN_TOOLS, message: { tool_calls: [call] } });
  // Claude Code puts a reminder block before the task: the task is one of the message's text parts.
  const subFirst: ChatMessage[] = [
    { role: "system", content: "You are a sub-agent" },
    { role: "user", content: [{ type: "text", text: "<system-reminder>be brief</system-reminder>" }, { type: "text", text: TASK }] },
  ];
  const r1 = makeRecord({ id: "r1", seq: 1, prompt_ids: [2, 2, 20], output_ids: [21], messages: subFirst, tools: SUB_TOOLS, message: { content: "line 3" } });
  const r2 = makeRecord({ id: "r2", seq: 2, prompt_ids: [2, 2, 20, 21, 22], output_ids: [23], messages: [...subFirst, { role: "assistant", content: "line 3" }, { role: "user", content: "sure?" }], tools: SUB_TOOLS });
  const r3 = makeRecord({
    id: "r3",
    seq: 3,
    prompt_ids: [1, 1, 10, 11, 12],
    output_ids: [13],
    messages: [mainSys, ask, { role: "assistant", content: null, tool_calls: [call] }, { role: "tool", tool_call_id: "toolu_1", content: "line 3" }],
    tools: MAIN_TOOLS,
  });
  const records = [r0, r1, r2, r3];

  it("names the sub-agent's trace, the trace and tool call that started it, and its break", () => {
    const t = prefixMerging(records);
    expect(t.traces.map((x) => [x.completion_ids, x.kind, x.parent])).toEqual([
      [["r0", "r3"], "main", null],
      [["r1", "r2"], "sub_agent", { trace: 0, record_id: "r0", tool_call_id: "toolu_1" }],
    ]);
    expect(t.stats.breaks).toEqual([expect.objectContaining({ record_id: "r1", reason: "sub_agent" })]);
    expect(t.stats.breaks[0]!.detail).toContain("tool call toolu_1 (Agent)");
  });

  it("every builder gives the same kinds: per_request per record, prefix_tree on its flat view", () => {
    expect(perRequest(records).traces.map((x) => [x.completion_ids[0], x.kind, x.parent?.record_id ?? null])).toEqual([
      ["r0", "main", null],
      ["r1", "sub_agent", "r0"],
      ["r2", "sub_agent", "r0"],
      ["r3", "main", null],
    ]);
    expect(prefixTree(records).traces.map((x) => x.kind)).toEqual(["main", "sub_agent"]);
  });

  it("finds the task after a reminder block when the protocol joined the blocks into one string (Anthropic)", () => {
    const joined = makeRecord({ ...r1, messages: [subFirst[0]!, { role: "user", content: `<system-reminder>be brief\nand exact</system-reminder>\n${TASK}` }] });
    const t = prefixMerging([r0, joined, r3]);
    expect(t.traces.map((x) => [x.kind, x.parent?.tool_call_id ?? null])).toEqual([
      ["main", null],
      ["sub_agent", "toolu_1"],
    ]);
  });

  it("a short tool argument that happens to equal a user message is not a sub-agent", () => {
    const shortCall = { ...call, function: { name: "Bash", arguments: JSON.stringify({ command: "ls" }) } };
    const a = makeRecord({ ...r0, id: "a", seq: 0, prompt_ids: [1, 1, 10], output_ids: [11], messages: [mainSys, ask], tools: MAIN_TOOLS, message: { tool_calls: [shortCall] } });
    const b = makeRecord({ id: "b", seq: 1, prompt_ids: [2, 2, 20], output_ids: [21], messages: [{ role: "user", content: "ls" }], tools: SUB_TOOLS });
    expect(prefixMerging([a, b]).traces.map((x) => x.kind)).toEqual(["main", "main"]);
  });
});

describe("trace kinds: a title request, a compaction and the conversation resumed from it", () => {
  const mainSys: ChatMessage = { role: "system", content: "You are the main agent" };
  const ask: ChatMessage = { role: "user", content: "Fix the bug in foo.py" };
  const SUMMARY = "The user asked to fix the bug in foo.py; the bug is on line 3 and the fix is to check for None first.";
  const title = makeRecord({ id: "title", seq: 0, prompt_ids: [3, 3, 10], output_ids: [31], messages: [{ role: "system", content: "You are a title generator" }, ask], message: { content: "Fix foo" } });
  const m1 = makeRecord({ id: "m1", seq: 1, prompt_ids: [1, 1, 10], output_ids: [11], messages: [mainSys, ask], tools: MAIN_TOOLS, message: { content: "Looking." } });
  const m2Messages: ChatMessage[] = [mainSys, ask, { role: "assistant", content: "Looking." }, { role: "user", content: "go on" }];
  const m2 = makeRecord({ id: "m2", seq: 2, prompt_ids: [1, 1, 10, 11, 12], output_ids: [13], messages: m2Messages, tools: MAIN_TOOLS, message: { content: "Found it." } });
  const summaryAsk: ChatMessage = { role: "user", content: "Your task is to create a detailed summary of the conversation so far, paying close attention to the user's requests." };
  const summary = makeRecord({
    id: "sum",
    seq: 3,
    prompt_ids: [4, 4, 10, 11, 12, 13, 14],
    output_ids: [15],
    messages: [{ role: "system", content: "You summarise conversations" }, ...m2Messages.slice(1), { role: "assistant", content: "Found it." }, summaryAsk],
    message: { content: SUMMARY },
  });
  const resumed = makeRecord({
    id: "c1",
    seq: 4,
    prompt_ids: [1, 1, 16],
    output_ids: [17],
    messages: [mainSys, { role: "user", content: `This session is being continued from a previous conversation that ran out of context. The conversation is summarized below:\n${SUMMARY}` }],
    tools: MAIN_TOOLS,
  });

  it("the title and the summary request are side requests; the resumed conversation is a compaction of the main one", () => {
    const t = prefixMerging([title, m1, m2, summary, resumed]);
    expect(t.traces.map((x) => [x.completion_ids, x.kind, x.parent])).toEqual([
      [["title"], "side_request", null],
      [["m1", "m2"], "main", null],
      [["sum"], "side_request", { trace: 1, record_id: "m2", tool_call_id: null }],
      [["c1"], "compaction", { trace: 1, record_id: "sum", tool_call_id: null }],
    ]);
    const reasons = Object.fromEntries(t.stats.breaks.map((b) => [b.record_id, b.reason]));
    // m1 shares no token with the title request: an unexplained break of the agent's own conversation.
    expect(reasons).toEqual({ m1: "unknown", sum: "side_request", c1: "compaction" });
    expect(t.stats.breaks.find((b) => b.record_id === "c1")!.detail).toContain("resumes from record sum's summary");
  });

  it("a summary request that extended the conversation keeps it as the compaction's parent", () => {
    // Same system prompt and tools: the summary request is one more turn of the main conversation.
    const inline = makeRecord({ ...summary, id: "sum", prompt_ids: [1, 1, 10, 11, 12, 13, 14], messages: [...m2Messages, { role: "assistant", content: "Found it." }, summaryAsk], tools: MAIN_TOOLS, message: { content: SUMMARY } });
    const t = prefixMerging([m1, m2, inline, resumed]);
    expect(t.traces.map((x) => [x.completion_ids, x.kind, x.parent])).toEqual([
      [["m1", "m2", "sum"], "main", null],
      [["c1"], "compaction", { trace: 0, record_id: "sum", tool_call_id: null }],
    ]);
  });

  it("a continuation preamble alone (the summary call is not in the session) still marks a compaction, without a parent", () => {
    const pi = makeRecord({
      id: "p1",
      seq: 3,
      prompt_ids: [1, 1, 18],
      output_ids: [19],
      messages: [mainSys, { role: "user", content: "The conversation history before this point was compacted into the following summary:\n\n<summary>\nwork so far\n</summary>" }],
      tools: MAIN_TOOLS,
    });
    const t = prefixMerging([m1, m2, pi]);
    expect(t.traces.map((x) => [x.kind, x.parent])).toEqual([
      ["main", null],
      ["compaction", null],
    ]);
    expect(t.stats.breaks[0]).toMatchObject({ record_id: "p1", reason: "compaction" });
    expect(t.stats.breaks[0]!.detail).toContain("pi's continuation preamble");
  });

  it("a preamble over a reworded summary finds the summary request that came before it", () => {
    // Claude Code drops the <analysis> part of the answer before resuming: the answer is not quoted whole.
    const reworded = makeRecord({ ...resumed, messages: [resumed.request.messages[0]!, { role: "user", content: "This session is being continued from a previous conversation that ran out of context. Summary: fixed." }] });
    const t = prefixMerging([m1, m2, summary, reworded]);
    expect(t.traces.map((x) => [x.completion_ids, x.kind, x.parent])).toEqual([
      [["m1", "m2"], "main", null],
      [["sum"], "side_request", { trace: 0, record_id: "m2", tool_call_id: null }],
      [["c1"], "compaction", { trace: 0, record_id: "sum", tool_call_id: null }],
    ]);
  });

  it("a session whose requests never declare tools has no side requests: every trace is the agent's own", () => {
    const plain = [title, makeRecord({ id: "x", seq: 1, prompt_ids: [1, 1, 10], output_ids: [11], messages: [mainSys, ask] })];
    expect(prefixMerging(plain).traces.map((x) => x.kind)).toEqual(["main", "main"]);
  });
});
