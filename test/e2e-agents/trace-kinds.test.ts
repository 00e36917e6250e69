/**
 * Trace kinds from a real CLI (docs/trace-kinds.md): Claude Code, unmodified, uses its own
 * sub-agent tool (`Agent`) because the `#sim:` policy says so. The main conversation's script calls
 * `Agent` with a prompt that holds the sub-agent's own script (a sub-agent's first user message is
 * the prompt, so engine-sim plays that script there): the sub-agent writes sub.txt with Bash and
 * answers, the main conversation answers. The session's traces are `main` and `sub_agent`, and the
 * sub-agent's parent is the main trace's record that made the `Agent` call, with its tool call id.
 */
import { randomUUID } from "node:crypto";
import type { CompletionRecord, TaskRecord, Trajectory } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireAgentClis, startAgentStack, type AgentStack } from "../agents/stack.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const prefix = uniquePrefix("agent-kinds");
let stack: AgentStack;
const api = apiClient(() => stack.fleet.url);

beforeAll(async () => {
  requireAgentClis();
  stack = await startAgentStack({ prefix });
}, 5 * 60_000);

afterAll(async () => {
  await stack?.stop();
  await dropPrefix(prefix);
}, 60_000);

async function terminal(id: string): Promise<TaskRecord> {
  const r = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t?.result != null, 10 * 60_000, 500);
  if (!r?.result) throw new Error(`task ${id} is still ${r?.status}`);
  return r;
}

const diag = (t: TaskRecord) => JSON.stringify({ status: t.result?.status, error: t.result?.error, agent: t.result?.agent }, null, 1);

describe("claude-code", () => {
  it("uses its Agent tool when the policy calls it: the traces are main and sub_agent, the sub-agent linked to the call that started it", async () => {
    const word = `sub-ok-${randomUUID().slice(0, 6)}`;
    const subScript = [{ tool_calls: [{ name: "Bash", arguments: { command: `echo ${word} > sub.txt` } }] }, { text: `sub.txt holds ${word}.` }];
    const prompt = `Write ${word} into sub.txt with Bash.\n#sim: ${JSON.stringify(subScript)}`;
    const mainScript = [
      { tool_calls: [{ name: "Agent", arguments: { description: "Write sub.txt", prompt, subagent_type: "general-purpose" } }] },
      { text: "The sub-agent wrote sub.txt." },
    ];
    const id = `t-kinds-claude-${randomUUID().slice(0, 8)}`;
    const res = await api("/v1/tasks", {
      body: {
        id,
        instruction: `Have a sub-agent write sub.txt.\n#sim: ${JSON.stringify(mainScript)}`,
        // The preset allows Claude Code's file and shell tools; its sub-agent tool is allowed here.
        agent: { harness: "claude-code", args: ["--allowedTools", "Agent,Bash"] },
        evaluator: { kind: "file", path: "sub.txt", equals: `${word}\n` },
        sampling: { max_tokens: 4096 },
        limits: { timeout_s: 300, max_llm_calls: 30 },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    const t = await terminal(id);
    const records = ((await api(`/v1/sessions/${t.session_id}/completions`)).body as { completions: CompletionRecord[] }).completions;
    const traj = t.result!.trajectory as Trajectory;
    const summary = JSON.stringify({ calls: records.map((r) => r.message.tool_calls.map((c) => c.function.name).join(",") || r.message.content?.slice(0, 40)), kinds: traj?.traces.map((x) => [x.kind, x.parent]), breaks: traj?.stats.breaks }, null, 1);
    // The sub-agent's Bash call wrote the file the evaluator reads.
    expect(t.result, `${diag(t)}\n${summary}`).toMatchObject({ status: "completed", reward: 1 });

    const agentCall = records.flatMap((r) => r.message.tool_calls.map((c) => ({ r, c }))).find(({ c }) => c.function.name === "Agent");
    expect(agentCall, summary).toBeDefined();
    expect(traj.traces.map((x) => x.kind), summary).toEqual(["main", "sub_agent"]);
    const main = traj.traces[0]!;
    const sub = traj.traces[1]!;
    expect(main.completion_ids).toContain(agentCall!.r.id);
    expect(sub.parent).toEqual({ trace: 0, record_id: agentCall!.r.id, tool_call_id: agentCall!.c.id });
    // The sub-agent's own conversation: its Bash call, then its answer, which the main conversation got back as the tool's result.
    const subRecords = sub.completion_ids.map((rid) => records.find((r) => r.id === rid)!);
    expect(subRecords.map((r) => r.message.tool_calls.map((c) => c.function.name))).toEqual([["Bash"], []]);
    expect(subRecords.at(-1)!.message.content).toBe(`sub.txt holds ${word}.`);
    const lastMain = records.find((r) => r.id === main.completion_ids.at(-1))!;
    expect(lastMain.message.content).toBe("The sub-agent wrote sub.txt.");
    expect(JSON.stringify(lastMain.request.messages.filter((m) => m.role === "tool"))).toContain(`sub.txt holds ${word}.`);
    expect(traj.stats.breaks.map((b) => b.reason)).toEqual(["sub_agent"]);
  });
});
