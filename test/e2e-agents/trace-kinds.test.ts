/**
 * Trace kinds from a real CLI (docs/trace-kinds.md): Claude Code, unmodified, uses its own
 * sub-agent tool (`Agent`) because the `#sim:` policy says so. The main conversation's script calls
 * `Agent` with a prompt that holds the sub-agent's own script (a sub-agent's first user message is
 * the prompt, so engine-sim plays that script there): the sub-agent writes sub.txt with Bash and
 * answers, the main conversation answers. The session's traces are `main` and `sub_agent`, and the
 * sub-agent's parent is the main trace's record that made the `Agent` call, with its tool call id.
 *
 * And a compaction: Claude Code's `/compact` in a `-p --continue` run between two others of one
 * session; the conversation resumed from the summary is a `compaction` trace of the summarised one.
 */
import { randomUUID } from "node:crypto";
import type { CompletionRecord, TaskRecord, Trajectory } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireAgentClis, startAgentStack, type AgentStack } from "../agents/stack.js";
import { apiClient } from "../support/http.js";
import { terminalTask } from "../support/poll.js";
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

const terminal = (id: string) => terminalTask(api, id, 10 * 60_000, 500);

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

describe("claude-code compaction", () => {
  // Claude Code's automatic compaction did not start in a -p run even with CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=1
  // (a 34k-token prompt); its /compact command does, in a -p run that continues the session (--continue).
  it("/compact between two -p runs of one session: the resumed conversation is a compaction trace whose parent is the summarised one", async () => {
    const word = `c-ok-${randomUUID().slice(0, 6)}`;
    // The summary request is the conversation so far plus the summary instruction: it plays the
    // script's next step (the final answer is not part of it), so the summary is the second step.
    const mainScript = [{ tool_calls: [{ name: "Bash", arguments: { command: `echo ${word} > c.txt` } }] }, { text: `The file c.txt holds ${word}, written with Bash.` }];
    const resumed = [{ text: "Resumed after compaction." }];
    const claude = "claude --model rollgate-policy -p";
    const script = [`${claude} "$ROLLGATE_INSTRUCTION" --allowedTools Bash`, `${claude} --continue /compact`, `${claude} --continue "$RESUME"`].join(" && ");
    const id = `t-compact-${randomUUID().slice(0, 8)}`;
    const res = await api("/v1/tasks", {
      body: {
        id,
        instruction: `Write c.txt.\n#sim: ${JSON.stringify(mainScript)}`,
        // Claude Code unmodified, three times in one sandbox (the claude-code preset runs it once):
        // the preset's quiet variables are given here.
        agent: {
          harness: "command",
          command: ["bash", "-c", script],
          env: { RESUME: `Go on.\n#sim: ${JSON.stringify(resumed)}`, CI: "1", DO_NOT_TRACK: "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1", DISABLE_TELEMETRY: "1", DISABLE_AUTOUPDATER: "1", DISABLE_ERROR_REPORTING: "1" },
        },
        evaluator: { kind: "file", path: "c.txt", equals: `${word}\n` },
        sampling: { max_tokens: 4096 },
        limits: { timeout_s: 300, max_llm_calls: 12 },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    const t = await terminal(id);
    expect(t.result, diag(t)).toMatchObject({ status: "completed", reward: 1 });
    expect(t.result!.agent.log_tail).toContain("Resumed after compaction.");
    const records = ((await api(`/v1/sessions/${t.session_id}/completions`)).body as { completions: CompletionRecord[] }).completions;
    const traj = t.result!.trajectory as Trajectory;
    const summary = JSON.stringify({ kinds: traj.traces.map((x) => [x.kind, x.parent]), breaks: traj.stats.breaks }, null, 1);
    // Bash call, answer, the summary request (/compact), the resumed conversation's answer.
    expect(records).toHaveLength(4);
    const [, , summarise, resume] = records;
    expect(JSON.stringify(summarise!.request.messages.at(-1))).toMatch(/summary/i);
    expect(resume!.message.content).toBe("Resumed after compaction.");
    // The summary request keeps the tools and extends the conversation (a sibling of its answer),
    // so it is a trace of kind main; the resumed conversation quotes its answer: a compaction of trace 0.
    expect(traj.traces.map((x) => x.kind), summary).toEqual(["main", "main", "compaction"]);
    expect(traj.traces[0]!.completion_ids).toEqual([records[0]!.id, records[1]!.id]);
    expect(traj.traces[2]!.parent, summary).toEqual({ trace: 0, record_id: summarise!.id, tool_call_id: null });
    expect(traj.stats.breaks.map((b) => b.reason), summary).toEqual(["sibling", "compaction"]);
  });
});
