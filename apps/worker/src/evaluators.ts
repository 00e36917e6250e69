import vm from "node:vm";
import type { EvaluatorSpec, TaskError, TaskResult } from "@rollgate/protocol";
import { z } from "zod";
import { EgressDenied, egressRequest } from "./egress.js";
import type { RunResult } from "./sandbox/process.js";
import type { Sandbox } from "./sandbox/runtime.js";

export type Evaluation = NonNullable<TaskResult["evaluation"]>;

export type EvalOutcome =
  | { kind: "scored"; reward: number | null; evaluation: Evaluation | null }
  | { kind: "cancelled"; evaluation: Evaluation | null }
  | { kind: "broken"; error: TaskError; evaluation: Evaluation | null };

export interface EvalContext {
  sandbox: Pick<Sandbox, "exec" | "readFile" | "removeFile">;
  /** How long a `file` evaluator's regex may run on the file (default REGEX_TIMEOUT_MS). */
  regexTimeoutMs?: number;
  env: Record<string, string>;
  signal?: AbortSignal;
  /** What an `http` evaluator is sent: the result so far, without the trajectory. */
  summary: () => Record<string, unknown>;
}

const RewardJson = z.object({ reward: z.number() }).loose();

/** The longest a `file` evaluator's regex may run on the file the agent wrote. */
export const REGEX_TIMEOUT_MS = 10_000;

const REGEX_TEST = new vm.Script("new RegExp(regex).test(text)");

/**
 * Whether `regex` matches `text`, or null when it ran out of time (or does not compile). The text is the agent's: a
 * regex that backtracks catastrophically on it (`^(\\w+\\s?)*$` on a long line that does not
 * match) would otherwise hold the worker's event loop for good, and every rollout on the worker
 * with it. Run in a context of its own, which V8 can interrupt at the time limit.
 */
function regexMatches(regex: string, text: string, timeoutMs: number): boolean | null {
  try {
    return REGEX_TEST.runInNewContext({ regex, text }, { timeout: timeoutMs }) as boolean;
  } catch {
    // ERR_SCRIPT_EXECUTION_TIMEOUT, or a regex that does not compile (refused at submission; a
    // task stored before that).
    return null;
  }
}

function broken(message: string, evaluation: Evaluation | null = null): EvalOutcome {
  return { kind: "broken", error: { kind: "evaluator_error", message }, evaluation };
}

/** A reward from a command's stdout, per `reward` mode; a string is the reason it could not be read. */
export function rewardFromOutput(mode: "exit_code" | "last_line_float" | "json", exitCode: number, stdout: string): { reward: number; details?: unknown } | string {
  if (mode === "exit_code") return { reward: exitCode === 0 ? 1 : 0 };
  const lines = stdout.split("\n").map((l) => l.trim()).filter(Boolean);
  if (mode === "last_line_float") {
    const last = lines.at(-1) ?? "";
    const value = Number(last);
    return last !== "" && Number.isFinite(value) ? { reward: value } : `last stdout line is not a number: ${JSON.stringify(last.slice(0, 200))}`;
  }
  // json: the last line that parses as an object with a numeric reward.
  for (const line of [...lines].reverse()) {
    try {
      const parsed = RewardJson.safeParse(JSON.parse(line));
      if (parsed.success) return { reward: parsed.data.reward, details: parsed.data };
    } catch {
      // not JSON: keep looking
    }
  }
  return "no stdout line is a JSON object with a numeric reward";
}

async function runCommand(argv: string[], timeoutS: number, ctx: EvalContext): Promise<RunResult> {
  // Not in the agent's HOME and TMPDIR: a usercustomize.py it left there would run inside a Python grader.
  // An evaluator's step: it sees the evaluator-only binds (hidden tests), the agent never did.
  return ctx.sandbox.exec(argv, { env: ctx.env, timeoutMs: timeoutS * 1000, freshHome: true, evaluator: true, ...(ctx.signal ? { signal: ctx.signal } : {}) });
}

function commandFailure(r: RunResult, timeoutS: number): string | null {
  if (r.spawnError) return `cannot start the evaluator: ${r.spawnError}`;
  if (r.timedOut) return `the evaluator timed out after ${timeoutS}s`;
  if (r.exitCode === null) return `the evaluator was killed by ${r.signal}`;
  return null;
}

/** The files a `reward_file` evaluator reads, first found first. */
function rewardFiles(rel: string | undefined): string[] {
  return rel ? [rel] : ["reward.json", "reward.txt"];
}

/**
 * The largest reward file whose other fields are kept as the evaluation's details. Every stored
 * result, its callback and every read of the task carry them: a reward.json filled up to the read
 * limit (MAX_READ_BYTES) would put megabytes into each.
 */
export const MAX_DETAILS_BYTES = 64 * 1024;

async function readRewardFile(sandbox: EvalContext["sandbox"], rel: string | undefined): Promise<{ reward: number; details: unknown } | string> {
  const candidates = rewardFiles(rel);
  for (const name of candidates) {
    const text = await sandbox.readFile(name);
    if (text === null) continue;
    if (name.endsWith(".json")) {
      try {
        const parsed = RewardJson.safeParse(JSON.parse(text));
        if (parsed.success) {
          const { reward } = parsed.data;
          const bytes = Buffer.byteLength(text);
          const details =
            bytes <= MAX_DETAILS_BYTES
              ? parsed.data
              : { reward, truncated: `${name}'s other fields (${bytes} bytes) were dropped: evaluation details keep at most ${MAX_DETAILS_BYTES} bytes` };
          return { reward, details };
        }
      } catch {
        // fall through
      }
      return `${name} is not {"reward": <number>, ...}`;
    }
    const value = Number(text.trim());
    return Number.isFinite(value) && text.trim() !== "" ? { reward: value, details: { file: name } } : `${name} does not hold a number`;
  }
  return `no reward file (${candidates.join(" or ")}) in the working directory`;
}

/** Scores a finished rollout with the task's evaluator (docs/data-model.md#evaluators; the evaluation is kept in `evaluation`). */
export async function evaluate(spec: EvaluatorSpec | null, ctx: EvalContext): Promise<EvalOutcome> {
  if (!spec || spec.kind === "none") return { kind: "scored", reward: null, evaluation: null };
  switch (spec.kind) {
    case "command": {
      const r = await runCommand(spec.command, spec.timeout_s, ctx);
      const evaluation: Evaluation = { kind: "command", exit_code: r.exitCode, stdout_tail: r.logTail.slice(-4_096) };
      if (r.aborted) return { kind: "cancelled", evaluation };
      const failure = commandFailure(r, spec.timeout_s);
      if (failure) return broken(failure, evaluation);
      const reward = rewardFromOutput(spec.reward, r.exitCode!, r.stdoutTail);
      if (typeof reward === "string") return broken(reward, evaluation);
      return { kind: "scored", reward: reward.reward, evaluation: { ...evaluation, ...(reward.details !== undefined ? { details: reward.details } : {}) } };
    }
    case "file": {
      const text = await ctx.sandbox.readFile(spec.path);
      const timeoutMs = ctx.regexTimeoutMs ?? REGEX_TIMEOUT_MS;
      const matched = text === null ? false : spec.equals !== undefined ? text === spec.equals : regexMatches(spec.regex!, text, timeoutMs);
      if (matched === null) {
        return broken(`evaluator.regex did not compile, or ran longer than ${timeoutMs / 1000}s on ${spec.path} (catastrophic backtracking on the agent's file?)`, {
          kind: "file",
          exit_code: null,
          stdout_tail: "",
          details: { path: spec.path, exists: true, matched: null },
        });
      }
      return {
        kind: "scored",
        reward: matched ? 1 : 0,
        evaluation: { kind: "file", exit_code: null, stdout_tail: "", details: { path: spec.path, exists: text !== null, matched } },
      };
    }
    case "reward_file": {
      let evaluation: Evaluation = { kind: "reward_file", exit_code: null, stdout_tail: "" };
      if (spec.command) {
        // The reward is the command's: a reward file the agent wrote (a planted reward.json is read
        // before the grader's reward.txt, and survives a grader that crashes) is removed first.
        try {
          for (const name of rewardFiles(spec.path)) await ctx.sandbox.removeFile(name);
        } catch (err) {
          return broken(`cannot clear the reward file before the evaluator runs: ${(err as Error).message}`);
        }
        const r = await runCommand(spec.command, spec.timeout_s, ctx);
        evaluation = { ...evaluation, exit_code: r.exitCode, stdout_tail: r.logTail.slice(-4_096) };
        if (r.aborted) return { kind: "cancelled", evaluation };
        // A non-zero exit may still have written a reward (a test runner that failed tests); a
        // command that could not start, timed out or was killed by a signal did not finish.
        const failure = commandFailure(r, spec.timeout_s);
        if (failure) return broken(failure, evaluation);
      }
      const reward = await readRewardFile(ctx.sandbox, spec.path);
      if (typeof reward === "string") return broken(reward, evaluation);
      return { kind: "scored", reward: reward.reward, evaluation: { ...evaluation, details: reward.details } };
    }
    case "http": {
      let close: (() => Promise<void>) | undefined;
      try {
        // The URL is the task's: only where the worker's egress policy allows (egress.ts).
        const sent = await egressRequest(spec.url, "evaluator.url", {
          method: "POST",
          headers: { "content-type": "application/json", ...spec.headers },
          body: JSON.stringify(ctx.summary()),
          headersTimeout: spec.timeout_s * 1000,
          bodyTimeout: spec.timeout_s * 1000,
          ...(ctx.signal ? { signal: ctx.signal } : {}),
        });
        close = sent.close;
        const res = sent.res;
        const text = await res.body.text();
        const evaluation: Evaluation = { kind: "http", exit_code: null, stdout_tail: text.slice(-4_096) };
        if (res.statusCode < 200 || res.statusCode >= 300) return broken(`evaluator ${spec.url} answered ${res.statusCode}`, evaluation);
        const parsed = RewardJson.safeParse(JSON.parse(text));
        if (!parsed.success) return broken(`evaluator ${spec.url} did not answer {"reward": <number>}`, evaluation);
        return { kind: "scored", reward: parsed.data.reward, evaluation: { ...evaluation, details: parsed.data } };
      } catch (err) {
        if (ctx.signal?.aborted) return { kind: "cancelled", evaluation: null };
        if (err instanceof EgressDenied) return broken(`evaluator not called: ${err.message}`);
        return broken(`evaluator ${spec.url} unreachable or invalid: ${(err as Error).message}`);
      } finally {
        await close?.();
      }
    }
  }
}
