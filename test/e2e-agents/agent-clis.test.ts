/**
 * "Any agent, unmodified": the real agent CLIs from npm (pinned in test/agents, installed by
 * test/agents/install.sh) run as harness presets through task → worker → sandbox → gateway →
 * engine-sim → trajectory → signed callback, offline. Each task's instruction carries a `#sim:`
 * script that makes the model think, call the CLI's own shell tool (by the name and argument schema
 * the CLI declares) to write a file, read it back with the CLI's read tool, and answer. The
 * evaluator checks the file; the trajectory is checked token by token against the engine's records.
 *
 * Every CLI runs on Qwen3 (every protocol opencode and pi speak). Then CLIs speaking different
 * protocols run on other model families (engine-sim serving the family's tokenizer, template and
 * output format; the gateway on the family's profile): by default Claude Code (Anthropic Messages)
 * and Codex (OpenAI Responses) on Llama 3.1 and gpt-oss; ROLLGATE_AGENT_MATRIX=full runs every CLI
 * on every family. Each run writes its cell of the family × agent matrix (test/support/matrix.ts).
 *
 * Every CLI streams every main-turn request and none offers a non-streaming switch (see README,
 * "Agent CLIs"), so there is one run per CLI, protocol and family.
 */
import { createHmac, randomUUID } from "node:crypto";
import { mkdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { CompletionRecord, HarnessPreset, TaskRecord, TaskResult, Trajectory } from "@rollgate/protocol";
import { simLogprob } from "@rollgate/engine-sim";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AGENT_CASES, HARNESS_PACKAGES, SHELL_THOUGHT, agentTask, caseName, caseProtocol, caseSlug, scriptFor, type AgentCase, type AgentScript } from "../agents/cases.js";
import { AGENT_WORKER_ENV, requireAgentClis, startAgentStack, type AgentStack } from "../agents/stack.js";
import { REPO_ROOT } from "../support/cluster.js";
import { FAMILIES, FAMILY_CAN, engineDetokenize, startFamilyStack, type Family, type FamilyRun, type FamilyStack } from "../support/families.js";
import { apiClient } from "../support/http.js";
import { measureCell, type Measurement } from "../support/matrix.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

interface Planned extends AgentScript {
  c: AgentCase;
  taskId: string;
  secret: string;
}

/** ROLLGATE_AGENT_MATRIX=full: every CLI (one protocol each) on every family, not only the default cells. */
const FULL_MATRIX = process.env.ROLLGATE_AGENT_MATRIX === "full";
if (process.env.ROLLGATE_AGENT_MATRIX && !FULL_MATRIX) throw new Error(`ROLLGATE_AGENT_MATRIX must be "full" or unset, got "${process.env.ROLLGATE_AGENT_MATRIX}"`);
/** The non-Qwen3 families the CLIs run on. */
const MATRIX_FAMILIES: Family[] = FULL_MATRIX ? (Object.keys(FAMILIES) as Family[]).filter((f) => f !== "qwen3") : ["llama3.1", "gpt-oss"];
/** The CLIs that run on them: two protocols by default, every CLI (its first protocol) in the full matrix. */
const MATRIX_CASES: AgentCase[] = FULL_MATRIX
  ? AGENT_CASES.filter((c, i) => AGENT_CASES.findIndex((o) => o.harness === c.harness) === i)
  : AGENT_CASES.filter((c) => c.harness === "claude-code" || c.harness === "codex");

/**
 * Breaks a family's template causes in every CLI's session, and the words its profile gives
 * (as in test/e2e/families.test.ts): the gateway cannot keep a prefix through harmony history.
 */
const FAMILY_BREAKS: Partial<Record<Family, { reason: string; note: RegExp }>> = {
  "gpt-oss": { reason: "history_rewritten", note: /gpt-oss profile: the engine renders harmony history itself/ },
};

/**
 * Breaks a CLI's own side requests cause on any family: opencode's title request (no tools) is a
 * trace of its own (README, "Agent CLIs"). The count of such breaks per session.
 */
const CLI_BREAKS: Partial<Record<HarnessPreset, { reason: string; count: number }>> = {
  opencode: { reason: "tools_changed", count: 1 },
};

const prefix = uniquePrefix("agents");
let stack: AgentStack;
let trainer: Awaited<ReturnType<typeof startTrainer>>;
/** qwen-code's read_file wants an absolute path: the shell step links the sandbox folder here. */
let linkDir: string;
const api = apiClient(() => stack.fleet.url);
const planned = new Map<string, Planned>();
const report: { name: string; family: string; version: string; llm_calls: number; traces: number; breaks: string; run_s: string }[] = [];

function plan(c: AgentCase, family: Family = "qwen3"): Planned {
  const slug = family === "qwen3" ? caseSlug(c) : `${caseSlug(c)}-${family.replace(/\./g, "")}`;
  // Each family links its sandboxes in a folder of its own: a link is made once, by its case's slug.
  const links = family === "qwen3" ? linkDir : path.join(linkDir, family);
  mkdirSync(links, { recursive: true });
  const script = scriptFor(c, `agent-ok-${slug}-${randomUUID().slice(0, 6)}`, links, { think: FAMILY_CAN[family].think });
  return { ...script, c, taskId: `t-agents-${slug}-${randomUUID().slice(0, 8)}`, secret: `secret-${randomUUID()}` };
}

function taskBody(p: Planned, family: Family = "qwen3") {
  return {
    ...agentTask(p.c, p),
    id: p.taskId,
    callback: { url: trainer.url, secret: p.secret },
    metadata: { suite: "agent-clis", case: caseName(p.c), family },
  };
}

async function cliVersion(c: AgentCase): Promise<string> {
  const pkg = path.join(REPO_ROOT, "test", "agents", "node_modules", HARNESS_PACKAGES[c.harness], "package.json");
  return (await import(pkg, { with: { type: "json" } })).default.version as string;
}

beforeAll(async () => {
  requireAgentClis();
  linkDir = await mkdtemp(path.join(os.tmpdir(), "rollgate-agent-links-"));
  trainer = await startTrainer();
  stack = await startAgentStack({ prefix });
  // Every Qwen3 task goes in at once; the fleet runs them two by two while the tests below wait in turn.
  for (const c of AGENT_CASES) {
    const p = plan(c);
    planned.set(caseName(c), p);
    const res = await api("/v1/tasks", { body: taskBody(p) });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
  }
}, 5 * 60_000);

afterAll(async () => {
  if (report.length > 0) {
    const rows = report.map((r) => `| ${r.name} | ${r.family} | ${r.version} | ${r.llm_calls} | ${r.traces} | ${r.breaks} | ${r.run_s} |`);
    console.log(["", "| CLI | family | version | LLM calls | traces (prefix_merging) | breaks | run s |", "| --- | --- | --- | --- | --- | --- | --- |", ...rows].join("\n"));
  }
  await stack?.stop();
  await trainer?.close();
  if (linkDir) await rm(linkDir, { recursive: true, force: true });
  await dropPrefix(prefix);
}, 60_000);

type Message = CompletionRecord["request"]["messages"][number];

function toolCallsOf(m: Message): { id: string; function: { name: string; arguments: string } }[] {
  return m.role === "assistant" && m.tool_calls ? m.tool_calls : [];
}

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p: { text?: string }) => p.text ?? "").join("");
  return "";
}

/**
 * The trajectory is token-exact: spans, masks, logprobs and decoded text all match the engine's
 * records. `decode` is the engine's own /detokenize, so nothing here knows the model family.
 */
async function checkTrajectory(traj: Trajectory, records: CompletionRecord[], decode: (ids: number[]) => Promise<string>) {
  const byId = new Map(records.map((r) => [r.id, r]));
  expect(traj.builder).toBe("prefix_merging");
  expect(traj.stats.per_trace).toHaveLength(traj.traces.length);
  const merged: string[] = [];
  for (const [i, trace] of traj.traces.entries()) {
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
    expect(await decode([...trace.prompt_ids, ...trace.response_ids])).toBe(await decode([...last.prompt_ids, ...last.output_ids]));
  }
  // Every record sits in exactly one trace.
  expect([...merged].sort()).toEqual(records.map((r) => r.id).sort());
  // The logprobs are the engine's own: engine-sim's documented function of the context.
  for (const r of records) {
    r.output_ids.forEach((id, k) => {
      expect(r.output_logprobs[k]).toBe(simLogprob(r.weight_version ?? "0", [...r.prompt_ids, ...r.output_ids.slice(0, k)], id));
    });
  }
}

/**
 * Everything a run of a CLI case must show: completed with reward 1 from the file its shell tool
 * wrote, the scripted answer printed, a signed callback, the CLI's own tools called as declared,
 * the read tool's result sent back, and a token-exact trajectory.
 */
async function checkRun(
  p: Planned,
  result: TaskResult,
  records: CompletionRecord[],
  opts: { think: boolean; decode: (ids: number[]) => Promise<string>; note: (m: Measurement) => void },
): Promise<Trajectory> {
  const c = p.c;
  const diag = () => JSON.stringify({ status: result?.status, error: result?.error, agent: result?.agent }, null, 1);
  expect(result.status, diag()).toBe("completed");
  expect(result.agent.exit_code, diag()).toBe(0);
  // The evaluator read the file the CLI's shell tool wrote in the sandbox.
  expect(result.reward, diag()).toBe(1);
  expect(result.evaluation).toMatchObject({ kind: "file", details: { path: "result.txt", exists: true, matched: true } });
  // The CLI printed the scripted answer.
  expect(result.agent.log_tail).toContain(p.answer);

  // The callback arrives, signed with the task's secret.
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

  expect(records.length).toBe(result.usage.llm_calls);
  expect(records.every((r) => r.protocol === caseProtocol(c))).toBe(true);
  const traj = result.trajectory!;
  opts.note({ llm_calls: records.length, traces: traj.traces.length, breaks: traj.stats.breaks.map((b) => b.reason) });

  // The model called the CLI's own shell tool, by the name and argument the CLI declared.
  const shellCall = records.find((r) => r.message.tool_calls.some((t) => t.function.name === c.shell.name && JSON.parse(t.function.arguments)[c.shell.arg] === p.shellCommand));
  expect(shellCall, `a ${c.shell.name} call`).toBeDefined();
  // ... after thinking (the family's reasoning, parsed out of the answer as vLLM does), where the family can think.
  if (opts.think) expect(shellCall!.message.reasoning).toContain(SHELL_THOUGHT);
  else expect(shellCall!.message.reasoning ?? "").toBe("");
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

  await checkTrajectory(traj, records, opts.decode);
  opts.note({ exact: true });
  return traj;
}

async function logRun(name: string, family: Family, c: AgentCase, result: TaskResult, records: CompletionRecord[]) {
  const traj = result.trajectory!;
  report.push({
    name,
    family,
    version: await cliVersion(c),
    llm_calls: records.length,
    traces: traj.traces.length,
    breaks: traj.stats.breaks.map((b) => b.reason).join(", ") || "—",
    run_s: (result.timings.run_ms / 1000).toFixed(1),
  });
  console.log(`${name} on ${family}: ${records.length} LLM calls, ${traj.traces.length} trace(s)`, JSON.stringify(traj.stats.breaks.map((b) => ({ reason: b.reason, detail: b.detail }))));
}

describe.each(AGENT_CASES.map((c) => [caseName(c), c] as const))("%s", (name, c) => {
  it("runs the real CLI: its own shell tool writes the file, its read tool reads it, token-exact signed result", async () => {
    const cell = { family: "qwen3", agent: c.harness, protocol: caseProtocol(c), kind: "vllm" as const, variant: "", suite: "agent-clis", version: await cliVersion(c) };
    await measureCell(cell, async (note) => {
      const p = planned.get(name)!;
      const rec = await poll(async () => (await api(`/v1/tasks/${p.taskId}`)).body as TaskRecord, (t) => t.result !== null, 10 * 60_000, 500);
      expect(rec.result, `task ${p.taskId} is still ${rec.status}`).not.toBeNull();
      const result = rec.result!;
      const { body } = await api(`/v1/sessions/${result.session_id}/completions`);
      const records = (body as { completions: CompletionRecord[] }).completions;
      await checkRun(p, result, records, { think: true, decode: (ids) => engineDetokenize(stack.engine.ready, "vllm", ids), note });
      await logRun(name, "qwen3", c, result, records);
    });
  });
});

describe.each(MATRIX_FAMILIES)("on %s", (family) => {
  let fam: FamilyStack;
  const runs = new Map<string, { p: Planned; run: Promise<FamilyRun> }>();

  beforeAll(async () => {
    fam = await startFamilyStack({ family, kind: "vllm", sim: { randomTokens: 8 }, workerEnv: AGENT_WORKER_ENV });
    // The family's tasks go in at once and run two by two (the worker's concurrency).
    for (const c of MATRIX_CASES) {
      const p = plan(c, family);
      const run = fam.runTask(taskBody(p, family), 10 * 60_000);
      run.catch(() => {}); // awaited (and reported) by its own test
      runs.set(caseName(c), { p, run });
    }
  }, 5 * 60_000);
  afterAll(async () => fam?.stop(), 60_000);

  it.each(MATRIX_CASES.map((c) => [caseName(c), c] as const))("%s: completed, reward 1, token-exact, its traces counted", async (name, c) => {
    const cell = { family, agent: c.harness, protocol: caseProtocol(c), kind: "vllm" as const, variant: "", suite: "agent-clis", version: await cliVersion(c) };
    await measureCell(cell, async (note) => {
      const { p, run: pending } = runs.get(name)!;
      const run = await pending;
      note({ llm_calls: run.records.length, traces: run.traces, breaks: run.breaks.map((b) => b.reason), exact: run.exact });
      const result = run.task.result!;
      await checkRun(p, result, run.records, { think: FAMILY_CAN[family].think, decode: (ids) => engineDetokenize(fam.engineUrl, "vllm", ids), note });
      // The gateway's own verdict agrees: trainable tokens exact, every trace decodes to the engine's text of its calls.
      expect(run.exact, "every trainable token is the engine's, with its logprob").toBe(true);
      expect(run.decodes, "every trace decodes to the engine's text of its calls").toBe(true);
      // Traces per session: the CLI's conversation is one trace unless the family's template forces
      // breaks, each named in the profile's words; the CLI's own side requests are traces of their own.
      const known = FAMILY_BREAKS[family];
      const side = CLI_BREAKS[c.harness];
      expect(run.breaks.length).toBe(run.traces - 1);
      const sideBreaks = run.breaks.filter((b) => b.reason === side?.reason);
      expect(sideBreaks.length, JSON.stringify(run.breaks)).toBe(side?.count ?? 0);
      const familyBreaks = run.breaks.filter((b) => b.reason !== side?.reason);
      if (!known) expect(familyBreaks, JSON.stringify(run.breaks)).toEqual([]);
      for (const b of familyBreaks) {
        expect(b.reason).toBe(known!.reason);
        expect(b.detail).toMatch(known!.note);
      }
      await logRun(name, family, c, result, run.records);
    });
  });
});
