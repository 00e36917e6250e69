/**
 * A Claude Code-shaped session through the real Anthropic route (official SDK, gateway on a real
 * port, engine-sim, real Redis): the main agent calls its Agent tool, the sub-agent's conversation
 * opens with a reminder block and the task, the main agent goes on with the tool result, and a
 * title request without tools is made beside them. The trajectory says which trace is which, and
 * prefix_tree holds all three conversations in one tree.
 */
import Anthropic from "@anthropic-ai/sdk";
import type { PrefixTree, Trajectory } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

let h: Harness;

beforeAll(async () => {
  h = await startHarness("kinds", { dpSize: 1 });
});

afterAll(() => h?.close());

const TASK = "Find where foo.py divides by zero and report the line number.";
const script = [{ tool_calls: [{ name: "Agent", arguments: { description: "Find the bug", prompt: TASK, subagent_type: "general-purpose" } }] }, { text: "Fixed." }];
const tool = (name: string): Anthropic.Tool => ({ name, description: name, input_schema: { type: "object", properties: { prompt: { type: "string" } } } });
const mainTurn = {
  model: "claude-test",
  max_tokens: 256,
  system: "You are the main agent.",
  tools: [tool("Agent"), tool("Bash")],
  messages: [{ role: "user" as const, content: `Fix the bug in foo.py.\n#sim: ${JSON.stringify(script)}` }],
};

describe("trace kinds through the Anthropic route", () => {
  it("a sub-agent, the main agent and a title request are told apart, and prefix_tree holds them in one tree", async () => {
    const s = await h.openSession();
    const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });

    const m1 = await client.messages.create(mainTurn);
    const call = m1.content.find((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
    expect(call?.input).toMatchObject({ prompt: TASK });

    // The sub-agent: its own system prompt and tools; the task after a reminder block.
    await client.messages.create({
      model: "claude-test",
      max_tokens: 64,
      system: "You are a sub-agent. Answer briefly.",
      tools: [tool("Bash")],
      messages: [{ role: "user", content: [{ type: "text", text: "<system-reminder>Use Bash only.</system-reminder>" }, { type: "text", text: TASK }] }],
    });
    await client.messages.create({
      ...mainTurn,
      messages: [
        ...mainTurn.messages,
        { role: "assistant", content: m1.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: call!.id, content: "line 3" }] },
      ],
    });
    await client.messages.create({ model: "claude-test", max_tokens: 16, system: "You are a title generator.", messages: [{ role: "user", content: "Fix the bug in foo.py." }] });

    const res = await fetch(`${h.url}/v1/sessions/${s.id}/trajectory?builder=prefix_tree`);
    expect(res.status).toBe(200);
    const t = (await res.json()) as Trajectory & { tree: PrefixTree };
    const records = await h.records(s.id);
    const [main, sub, , title] = records.sort((a, b) => a.seq - b.seq);
    expect(t.traces.map((x) => [x.completion_ids.length, x.kind])).toEqual([
      [2, "main"],
      [1, "sub_agent"],
      [1, "side_request"],
    ]);
    expect(t.traces[1]!.parent).toEqual({ trace: 0, record_id: main!.id, tool_call_id: main!.message.tool_calls[0]!.id });
    expect(Object.fromEntries(t.stats.breaks.map((b) => [b.record_id, b.reason]))).toEqual({ [sub!.id]: "sub_agent", [title!.id]: "side_request" });

    // One tree: the three conversations share the template's opening tokens, each is a sample.
    expect(t.tree.samples.map((x) => x.trace)).toEqual([0, 1, 2]);
    expect(t.tree.nodes.filter((n) => n.parent === null)).toHaveLength(1);
    expect(t.tree.tree_tokens).toBeLessThan(t.tree.flat_tokens);
    const trainable = t.tree.nodes.reduce((a, n) => a + n.loss_mask.filter((m) => m === 1).length, 0);
    expect(trainable).toBe(records.reduce((a, r) => a + r.output_ids.length, 0));
  });
});
