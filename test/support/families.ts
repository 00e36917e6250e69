/**
 * Running an agent against one model family, end to end: engine-sim serving the family (its real
 * tokenizer, template and output format) as vLLM or SGLang, a gateway on the family's model
 * profile, and a worker; then checking what the trainer gets. Reusable by any suite that runs an
 * agent (the example agent here, the real agent CLIs elsewhere):
 *
 *   const stack = await startFamilyStack({ family: "llama3.1", kind: "vllm" });
 *   const run = await stack.runTask(task);          // → status, reward, session, trajectory verdict
 *   await stack.stop();
 */
import { randomUUID } from "node:crypto";
import type { StartedChild } from "@rollgate/testkit";
import { buildEngineSim } from "@rollgate/engine-sim";
import type { CompletionRecord, DecodedTrajectory, TaskRecord, Trajectory, TraceBreak } from "@rollgate/protocol";
import type { FastifyInstance } from "fastify";
import { startApp, stopChild } from "./apps.js";
import { apiClient } from "./http.js";
import { poll } from "./poll.js";
import { dropPrefix, uniquePrefix } from "./redis.js";

/** engine-sim's families, the rollgate profile of each, and the kinds of server each runs on. */
export const FAMILIES = {
  qwen3: { profile: "qwen3", kinds: ["vllm", "sglang"] },
  "qwen3-coder": { profile: "qwen3-coder", kinds: ["vllm", "sglang"] },
  "llama3.1": { profile: "llama3", kinds: ["vllm", "sglang"] },
  "deepseek-v3": { profile: "deepseek-v3", kinds: ["vllm", "sglang"] },
  "deepseek-v3.1": { profile: "deepseek-v3.1", kinds: ["vllm", "sglang"] },
  "gpt-oss": { profile: "gpt-oss", kinds: ["vllm", "sglang"] },
} as const;
export type Family = keyof typeof FAMILIES;
export type Kind = "vllm" | "sglang";

/** Whether a family's output format can hold reasoning, and text beside a tool call. */
export const FAMILY_CAN = {
  qwen3: { think: true, textWithCall: true },
  "qwen3-coder": { think: false, textWithCall: true },
  "llama3.1": { think: false, textWithCall: false },
  "deepseek-v3": { think: false, textWithCall: true },
  "deepseek-v3.1": { think: false, textWithCall: true },
  "gpt-oss": { think: true, textWithCall: true },
} satisfies Record<Family, unknown>;

export interface SimToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

/**
 * A `#sim:` script of tool turns the family can write: each turn's calls, with reasoning and a
 * sentence beside the calls where the family's format has room for them, then a final answer.
 */
export function familyScript(family: Family, turns: SimToolCall[][], answer: string): Record<string, unknown>[] {
  const can = FAMILY_CAN[family];
  const steps: Record<string, unknown>[] = turns.map((calls, i) => ({
    ...(can.think ? { think: `Step ${i + 1}: I use the tool.` } : {}),
    ...(can.textWithCall && i > 0 ? { text: "Checking the result." } : {}),
    tool_calls: calls,
  }));
  steps.push({ ...(can.think ? { think: "All done." } : {}), text: answer });
  return steps;
}

export interface TrajectoryVerdict {
  traces: number;
  breaks: TraceBreak[];
  /** Every trainable token is an engine output token, in order, with the engine's logprob; masked tokens carry 0. */
  exact: boolean;
  /** Every trace, decoded through the gateway (the engine's /detokenize), is the engine's own text of its last call's prompt + output. */
  decodes: boolean;
  /** The trace that holds the session's last call, as the engine decodes it: the conversation. */
  text: string;
  records: CompletionRecord[];
  trajectory: Trajectory;
}

export interface FamilyRun extends TrajectoryVerdict {
  task: TaskRecord;
  sessionId: string;
}

export interface FamilyStack {
  family: Family;
  kind: Kind;
  gatewayUrl: string;
  engineUrl: string;
  prefix: string;
  /** Submits a task, waits for its end, and checks its session's trajectory. */
  runTask: (task: Record<string, unknown>, timeoutMs?: number) => Promise<FamilyRun>;
  /** Checks one session's trajectory (what a trainer would be given). */
  verdict: (sessionId: string) => Promise<TrajectoryVerdict>;
  stop: () => Promise<void>;
}

/** The engine's own text of `ids` (its /detokenize, special tokens kept): decoding without knowing the family. */
export async function engineDetokenize(engineUrl: string, kind: Kind, ids: number[]): Promise<string> {
  const res = await fetch(`${engineUrl}/detokenize`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ tokens: ids, ...(kind === "sglang" ? { skip_special_tokens: false } : {}) }),
  });
  if (res.status !== 200) throw new Error(`${engineUrl}/detokenize answered ${res.status}: ${await res.text()}`);
  const j = (await res.json()) as { prompt?: string; text?: string };
  return (j.prompt ?? j.text)!;
}

async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: "127.0.0.1" });
  const addr = app.server.address();
  return `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
}

/** engine-sim (in this process) serving `family` as `kind`, and a gateway and a worker (processes) on the family's profile. */
export async function startFamilyStack(opts: {
  family: Family;
  kind: Kind;
  /** engine-sim options beyond the family (vllmVersion, tpotMs, …). */
  sim?: Record<string, unknown>;
  workerEnv?: Record<string, string>;
}): Promise<FamilyStack> {
  const prefix = uniquePrefix(`fam-${opts.family.replace(/\./g, "")}-${opts.kind}`);
  // The templates that print a date get a fixed one, so runs compare across days.
  const sim = buildEngineSim({ kind: opts.kind, family: opts.family, dpSize: 1, startDate: "2026-01-05", ...opts.sim });
  const engineUrl = await listen(sim);
  const children: StartedChild[] = [];
  try {
    const gateway = await startApp("gateway", ["--port", "0"], {
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: JSON.stringify([{ kind: opts.kind, url: engineUrl, dp_size: 1, profile: FAMILIES[opts.family].profile }]),
      ROLLGATE_HEALTH_INTERVAL_S: "0",
    });
    children.push(gateway);
    const worker = await startApp("worker", [], {
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_GATEWAY_URL: gateway.ready,
      ROLLGATE_WORKER_NAME: `w-${opts.family}`,
      ...opts.workerEnv,
    });
    children.push(worker);
    const api = apiClient(() => gateway.ready);

    const verdict = async (sessionId: string): Promise<TrajectoryVerdict> => {
      const [recs, traj, decoded] = await Promise.all([
        api(`/v1/sessions/${sessionId}/completions`),
        api(`/v1/sessions/${sessionId}/trajectory?builder=prefix_merging`),
        api(`/v1/sessions/${sessionId}/trajectory/decoded?builder=prefix_merging`),
      ]);
      const records = (recs.body as { completions: CompletionRecord[] }).completions;
      const trajectory = traj.body as Trajectory;
      if (traj.status !== 200) throw new Error(`trajectory answered ${traj.status}: ${JSON.stringify(traj.body)}`);
      const byId = new Map(records.map((r) => [r.id, r]));
      let exact = trajectory.traces.length > 0;
      for (const t of trajectory.traces) {
        const sampled = t.completion_ids.flatMap((id) => byId.get(id)?.output_ids ?? [NaN]);
        const lps = t.completion_ids.flatMap((id) => byId.get(id)?.output_logprobs ?? [NaN]);
        const masked = t.response_ids.filter((_, i) => t.loss_mask[i] === 1);
        const maskedLps = t.response_logprobs.filter((_, i) => t.loss_mask[i] === 1);
        exact &&=
          JSON.stringify(masked) === JSON.stringify(sampled) &&
          JSON.stringify(maskedLps) === JSON.stringify(lps) &&
          t.response_logprobs.every((lp, i) => t.loss_mask[i] === 1 || lp === 0);
      }
      const d = decoded.body as DecodedTrajectory;
      const engineText = (ids: number[]) => engineDetokenize(engineUrl, opts.kind, ids);
      // Every trace, decoded through the gateway, is the engine's text of its last record's prompt + output.
      let decodes = d.traces.length === trajectory.traces.length && d.traces.length > 0;
      let text = "";
      const lastRecord = records.at(-1)?.id;
      for (const [i, t] of trajectory.traces.entries()) {
        const dt = d.traces[i];
        const last = byId.get(t.completion_ids.at(-1)!);
        if (!dt || !last) {
          decodes = false;
          continue;
        }
        const got = dt.prompt_text + dt.segments.map((seg) => seg.text).join("");
        decodes &&= got === (await engineText([...last.prompt_ids, ...last.output_ids]));
        if (t.completion_ids.includes(lastRecord ?? "")) text = got;
      }
      return { traces: trajectory.traces.length, breaks: trajectory.stats.breaks, exact, decodes, text, records, trajectory };
    };

    return {
      family: opts.family,
      kind: opts.kind,
      gatewayUrl: gateway.ready,
      engineUrl,
      prefix,
      verdict,
      runTask: async (task, timeoutMs = 60_000) => {
        const id = (task.id as string | undefined) ?? `t-${randomUUID()}`;
        const accepted = await api("/v1/tasks", { body: { ...task, id } });
        if (accepted.status !== 202) throw new Error(`POST /v1/tasks answered ${accepted.status}: ${JSON.stringify(accepted.body)}`);
        const record = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (r) => r.result !== null, timeoutMs, 200);
        if (!record.result) throw new Error(`task ${id} still ${record.status} after ${timeoutMs} ms`);
        const sessionId = record.result.session_id;
        if (!sessionId) throw new Error(`task ${id} ended ${record.status} without a session: ${JSON.stringify(record.result.error)}`);
        return { task: record, sessionId, ...(await verdict(sessionId)) };
      },
      stop: async () => {
        await Promise.all(children.map((c) => stopChild(c.proc, 5_000)));
        await sim.close();
        await dropPrefix(prefix);
      },
    };
  } catch (err) {
    await Promise.all(children.map((c) => stopChild(c.proc, 5_000)));
    await sim.close();
    await dropPrefix(prefix);
    throw err;
  }
}

/** The example agent's task (examples/react-agent): write hello.txt with the shell tool, read it back, answer. */
export function exampleAgentTask(family: Family, stream: boolean): Record<string, unknown> {
  const script = familyScript(family, [[{ name: "shell", arguments: { command: "echo hello > hello.txt" } }], [{ name: "shell", arguments: { command: "cat hello.txt" } }]], "I created hello.txt.");
  return {
    instruction: `Create hello.txt containing the word hello.\n#sim: ${JSON.stringify(script)}`,
    agent: { harness: "command", command: ["rollgate-example-agent"], env: stream ? { AGENT_STREAM: "1" } : {} },
    evaluator: { kind: "command", command: ["bash", "-c", 'test "$(cat hello.txt)" = hello'] },
    limits: { timeout_s: 60 },
    trajectory: { builder: "prefix_merging" },
  };
}
