import { randomUUID } from "node:crypto";
import { closeSync, openSync, writeSync } from "node:fs";
import path from "node:path";
import { RollgateError, isOutage, isTerminal, type TaskResult } from "@rollgate/client";
import { TerminalStatus, type TaskInput, type TaskStatus } from "@rollgate/protocol";
import { UsageError, numberOption, type CommandSpec } from "../framework.js";
import { EXIT, fmt, reportError, statusColor, type Context } from "../output.js";
import { ProgressView, emptyCounts, type ProgressCounts } from "../progress.js";
import { describeCounts, describeExits, listIds, mean, statusRows, std } from "../summary.js";
import { renderTable } from "../table.js";
import { TasksFileError, readTasksFile } from "../tasks-file.js";

interface Tracked {
  id: string;
  status: TaskStatus;
  result: TaskResult | null;
}

function defaultOut(file: string): string {
  if (file === "-") return "rollgate-results.jsonl";
  // In the current directory, named after the input: never next to a task file in a repository.
  return `${path.basename(file).replace(/\.(jsonl|ndjson|json)$/i, "")}.results.jsonl`;
}

/** Runs `work` over `items` with at most `limit` at once. */
async function pool<T>(items: T[], limit: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) await work(items[next++]!);
    }),
  );
}

/**
 * Some lines were submitted and then the submission stopped (an error, Ctrl-C): the tasks already
 * submitted run on the cluster, so say which, and which lines were not, before exiting.
 */
function reportPartial(
  ctx: Context,
  err: unknown,
  p: { file: string; lines: number[]; linesDone: number; ids: string[]; groups: { group_id: string; task_ids: string[] }[] },
): number {
  const notSubmitted = p.lines.slice(p.linesDone);
  const partial = {
    submitted: p.ids.length,
    task_ids: p.ids,
    group_ids: p.groups.map((g) => g.group_id),
    not_submitted_lines: notSubmitted,
  };
  const lineRange = notSubmitted.length === 1 ? `line ${notSubmitted[0]}` : `lines ${notSubmitted[0]}–${notSubmitted.at(-1)}`;
  const what = `${p.linesDone} of ${p.lines.length} task line(s) of ${p.file} were submitted (${p.ids.length} task(s)); ${lineRange} were not`;
  if (err === null) {
    if (ctx.json) ctx.printJson({ interrupted: true, ...partial });
    ctx.err(`${ctx.errStyle.yellow("interrupted:")} ${what}.`);
  } else {
    const code = reportError({ ...ctx, json: false }, err);
    if (ctx.json) {
      const e = err instanceof RollgateError ? err.toJSON().error : { type: "cli_error", message: String((err as Error)?.message ?? err) };
      ctx.printJson({ error: { ...e, details: { ...(e.details !== undefined ? { error: e.details } : {}), partial_submission: partial } } });
    }
    ctx.err(`${ctx.errStyle.yellow("partial submission:")} ${what}.`);
    if (err instanceof RollgateError && err.unreachable) ctx.err(`  The request for line ${notSubmitted[0]} got no answer: the gateway may have taken it (rollgate tasks shows what it has).`);
    ctx.err(`  The submitted tasks run on the cluster (${listIds(p.ids)}); a re-run of the whole file submits tasks without an id again.`);
    return code;
  }
  ctx.err(`  The submitted tasks run on the cluster (${listIds(p.ids)}); a re-run of the whole file submits tasks without an id again.`);
  return 130;
}

export const submitCommand: CommandSpec<Context> = {
  name: "submit",
  summary: "submit tasks from a JSONL file, follow them with a live progress bar, write the results",
  description: `Submits every task of a JSONL file (one task per line; a .json file may hold one task or an
array) in batches, prints the ids it created (tasks, and groups with -n), then follows them to
the end: a live progress bar on a terminal (queued / running / done / failed, tokens/s, mean
reward), plain progress lines every few seconds otherwise. Each result is appended to the --out
JSONL file as its task ends (one TaskResult per line, the callback body; earlier runs' lines are
kept); a summary table follows, per status: how many, their error kinds (infrastructure: the
rollout lost LLM calls and was not scored) and agents that exited non-zero. With -n, every task
becomes a GRPO group of n rollouts. Exit code 0 when every task completed, 1 when some failed,
timed out or were cancelled.`,
  args: [{ name: "tasks.jsonl", required: true, description: "tasks to submit ('-' reads stdin)" }],
  options: [
    { name: "out", short: "o", type: "string", value: "<file>", description: "results JSONL, appended to ('-' = stdout); default ./<tasks name>.results.jsonl" },
    { name: "group-size", short: "n", type: "string", value: "<n>", description: "submit each task as a GRPO group of n rollouts (ids <group_id>-<k>)" },
    { name: "wait", type: "boolean", default: true, description: "follow the tasks to the end (--no-wait: submit, print the ids and exit)" },
    { name: "interval", type: "string", value: "<s>", default: "1", description: "seconds between status polls" },
    { name: "progress-every", type: "string", value: "<s>", default: "5", description: "seconds between plain progress lines (when not on a terminal)" },
    { name: "timeout", type: "string", value: "<s>", description: "stop waiting after this many seconds (exit 1; tasks keep running)" },
    { name: "chunk", type: "string", value: "<n>", default: "500", description: "tasks per batch request" },
    { name: "quiet", short: "q", type: "boolean", description: "no progress output" },
  ],
  examples: [
    "rollgate submit examples/react-agent/task.json",
    "rollgate submit tasks.jsonl -n 8 --out rollouts.jsonl",
    "rollgate submit tasks.jsonl --json | jq .mean_reward",
  ],
  async run(ctx, [file], values) {
    const groupSize = numberOption(values, "group-size", "submit", { integer: true, min: 1 });
    const intervalMs = (numberOption(values, "interval", "submit", { min: 0.05 }) ?? 1) * 1000;
    const everyMs = (numberOption(values, "progress-every", "submit", { min: 0.1 }) ?? 5) * 1000;
    const timeoutS = numberOption(values, "timeout", "submit", { min: 0.1 });
    const chunk = numberOption(values, "chunk", "submit", { integer: true, min: 1 }) ?? 500;
    let lines;
    try {
      lines = readTasksFile(file!);
    } catch (err) {
      if (err instanceof TasksFileError) {
        if (ctx.json) ctx.printJson({ error: { type: "invalid_tasks_file", message: err.message } });
        ctx.err(`${ctx.errStyle.red("rollgate:")} ${err.message}`);
        return EXIT.usage;
      }
      throw err;
    }
    const outPath = (values.out as string | undefined) ?? defaultOut(file!);
    const resultsToStdout = outPath === "-";
    if (resultsToStdout && ctx.json) throw new UsageError("--out - and --json both want stdout: pick one", "submit");
    const say = (line: string) => (resultsToStdout || ctx.json ? ctx.err(line) : ctx.out(line));

    // ── submit ──
    const ids: string[] = [];
    const groups: { group_id: string; task_ids: string[] }[] = [];
    const startedAt = Date.now();
    const runTag = randomUUID().slice(0, 8);
    const groupIdOf = (l: (typeof lines)[number]) => l.task.group_id ?? l.task.id ?? `g-${runTag}-${l.line}`;
    if (groupSize) {
      // The group's task ids are <group_id>-<k>, and a submit is idempotent on them: a second line
      // naming the same group would be answered with the first line's tasks and never run.
      const seen = new Map<string, number>();
      for (const l of lines) {
        const g = groupIdOf(l);
        if (seen.has(g)) throw new UsageError(`${file}: lines ${seen.get(g)} and ${l.line} are both group ${g} (with -n each line is its own group: give them distinct group_id or id)`, "submit");
        seen.set(g, l.line);
      }
    }
    // Ctrl-C while submitting stops after the request in flight: what was submitted is said, never
    // left unknown (tasks without an id would be submitted again by a re-run).
    let stopSubmitting = false;
    const onSigintWhileSubmitting = () => {
      if (stopSubmitting) process.exit(130);
      stopSubmitting = true;
    };
    process.on("SIGINT", onSigintWhileSubmitting);
    let linesDone = 0;
    try {
      if (groupSize) {
        for (const l of lines) {
          if (stopSubmitting) break;
          const { id: _id, group_id: _gid, ...rest } = l.task;
          const groupId = groupIdOf(l);
          const accepted = await ctx.client.submitGroup({ group_id: groupId, n: groupSize, task: rest as TaskInput });
          ids.push(...accepted.map((a) => a.id));
          groups.push({ group_id: groupId, task_ids: accepted.map((a) => a.id) });
          linesDone++;
        }
      } else {
        for (let i = 0; i < lines.length && !stopSubmitting; i += chunk) {
          const accepted = await ctx.client.submitBatch(lines.slice(i, i + chunk).map((l) => l.task));
          ids.push(...accepted.map((a) => a.id));
          linesDone = Math.min(lines.length, i + chunk);
        }
      }
    } catch (err) {
      if (linesDone === 0) throw err;
      return reportPartial(ctx, err, { file: file!, lines: lines.map((l) => l.line), linesDone, ids, groups });
    } finally {
      process.off("SIGINT", onSigintWhileSubmitting);
    }
    if (stopSubmitting) return reportPartial(ctx, null, { file: file!, lines: lines.map((l) => l.line), linesDone, ids, groups });
    if (values.wait === false) {
      // stdout holds only the ids (one per line), for scripts.
      if (!values.quiet && !ctx.json) ctx.err(`submitted ${ids.length} task(s) from ${file} to ${ctx.url}${groups.length ? ` in ${groups.length} group(s): ${listIds(groups.map((g) => g.group_id))}` : ""}`);
      if (ctx.json) ctx.printJson({ submitted: ids.length, task_ids: ids, groups });
      else for (const id of ids) ctx.out(id);
      return EXIT.ok;
    }
    if (!values.quiet) {
      say(`submitted ${ids.length} task(s) from ${file} to ${ctx.url}; results appended to ${resultsToStdout ? "stdout" : outPath}`);
      if (groups.length === 0) say(`  tasks: ${listIds(ids)}`);
      for (const g of groups.slice(0, 20)) say(`  group ${g.group_id}: ${listIds(g.task_ids, 8)}`);
      if (groups.length > 20) say(`  … and ${groups.length - 20} more groups`);
      say(`  follow one with rollgate watch <task or group id>; list them with rollgate tasks${groups.length === 1 ? ` --group ${groups[0]!.group_id}` : ""}`);
    }

    // ── follow ──
    const tracked = new Map<string, Tracked>(ids.map((id) => [id, { id, status: "queued", result: null }]));
    const counts: ProgressCounts = emptyCounts(ids.length);
    // Appended to: results of earlier runs into the same file are kept.
    const fd = resultsToStdout ? 1 : openSync(outPath, "a");
    const tty = process.stderr.isTTY === true && !process.env.CI;
    const progress = new ProgressView((s) => void process.stderr.write(s), {
      tty,
      everyMs,
      style: ctx.errStyle,
      columns: process.stderr.columns ?? 100,
    });
    let interrupted = false;
    const onSigint = () => {
      if (interrupted) process.exit(130);
      interrupted = true;
    };
    process.on("SIGINT", onSigint);
    const recount = () => {
      const all = [...tracked.values()];
      counts.queued = all.filter((t) => t.status === "queued").length;
      counts.running = all.filter((t) => t.status === "running").length;
      counts.done = all.filter((t) => t.status === "completed").length;
      counts.failed = all.filter((t) => isTerminal(t.status) && t.status !== "completed").length;
    };
    const deadline = timeoutS !== undefined ? startedAt + timeoutS * 1000 : Infinity;
    let lastError: unknown = null;
    /** Tasks the gateway answered an error for (a 404: the record is gone): no longer followed. */
    const gone = new Map<string, RollgateError>();
    let inOutage = false;
    const note = (line: string) => void (!values.quiet && progress.log(line));
    try {
      while (!interrupted) {
        const pending = [...tracked.values()].filter((t) => !t.result && !gone.has(t.id));
        if (pending.length === 0) break;
        await pool(pending, 16, async (t) => {
          try {
            const record = await ctx.client.getTask(t.id);
            t.status = record.status;
            if (record.result) {
              t.result = record.result;
              t.status = record.result.status;
              writeSync(fd, `${JSON.stringify(record.result)}\n`);
              counts.completionTokens += record.result.usage.completion_tokens;
              if (record.result.status === "completed" && record.result.reward !== null) {
                counts.rewardSum += record.result.reward;
                counts.rewardCount++;
              }
            }
            lastError = null;
          } catch (err) {
            // The gateway away (a restart, a deploy): retried on the next sweep. Any other answer
            // would be the same on every sweep: following that task would never end.
            if (isOutage(err) || !(err instanceof RollgateError)) lastError = err;
            else gone.set(t.id, err);
          }
        });
        if (lastError && !inOutage) note(`${ctx.errStyle.yellow("warning:")} the gateway is not answering (${(lastError as Error).message}); still following: the tasks keep running on the cluster`);
        else if (!lastError && inOutage) note("the gateway answers again");
        inOutage = lastError !== null;
        recount();
        if (!values.quiet) progress.update(counts);
        if (!tracked.size || [...tracked.values()].every((t) => t.result || gone.has(t.id))) break;
        if (Date.now() >= deadline) break;
        await new Promise((r) => setTimeout(r, intervalMs));
      }
    } finally {
      process.off("SIGINT", onSigint);
      if (!resultsToStdout) closeSync(fd);
    }
    recount();
    if (!values.quiet) progress.finish(counts);
    const elapsedMs = Date.now() - startedAt;
    const results = [...tracked.values()].flatMap((t) => (t.result ? [t.result] : []));
    const unfinished = ids.length - results.length;
    if (unfinished && lastError) ctx.err(`${ctx.errStyle.yellow("warning:")} last status poll failed: ${(lastError as Error).message}`);
    if (gone.size) {
      const [first] = gone.values();
      ctx.err(`${ctx.errStyle.red("rollgate:")} ${gone.size} task(s) could not be followed: the gateway answered ${first!.status} ${first!.type}: ${first!.message} (${listIds([...gone.keys()])})`);
    }

    // ── summary ──
    const rows = statusRows(results);
    const rewards = results.filter((r) => r.status === "completed" && r.reward !== null).map((r) => r.reward!);
    const byGroup = new Map<string, TaskResult[]>();
    for (const r of results) if (r.group_id) byGroup.set(r.group_id, [...(byGroup.get(r.group_id) ?? []), r]);
    const groupRows = [...byGroup.entries()].map(([group_id, rs]) => {
      const rw = rs.filter((r) => r.reward !== null && r.status === "completed").map((r) => r.reward!);
      return { group_id, tasks: rs.length, completed: rs.filter((r) => r.status === "completed").length, mean_reward: mean(rw), std_reward: std(rw) };
    });
    const tokens = results.reduce((a, r) => a + r.usage.completion_tokens, 0);
    const summary = {
      submitted: ids.length,
      ended: results.length,
      unfinished,
      interrupted,
      not_followed: [...gone.entries()].map(([id, e]) => ({ id, error: e.toJSON().error, status: e.status })),
      by_status: Object.fromEntries(TerminalStatus.options.map((st) => [st, rows.find((r) => r.status === st)?.tasks ?? 0])),
      statuses: rows,
      mean_reward: mean(rewards),
      llm_calls: results.reduce((a, r) => a + r.usage.llm_calls, 0),
      completion_tokens: tokens,
      tokens_per_s: elapsedMs > 0 ? (tokens * 1000) / elapsedMs : 0,
      elapsed_ms: elapsedMs,
      results_file: resultsToStdout ? null : path.resolve(outPath),
      groups: groupRows,
      task_ids: ids,
      group_ids: groups.map((g) => g.group_id),
    };
    if (ctx.json) {
      ctx.printJson(summary);
    } else {
      const s = ctx.style;
      const ascii = !s.enabled && !process.env.LANG?.includes("UTF");
      const table = rows.map((r) => [
        statusColor(s, r.status),
        String(r.tasks),
        fmt.reward(r.mean_reward),
        r.llm_calls_per_task.toFixed(1),
        fmt.int(r.completion_tokens),
        fmt.ms(r.mean_total_ms),
        describeCounts(r.errors),
        describeExits(r.nonzero_agent_exits),
      ]);
      if (unfinished) table.push([s.yellow("unfinished"), String(unfinished), "–", "–", "–", "–", "–", "–"]);
      table.push([s.bold("total"), s.bold(String(ids.length)), s.bold(fmt.reward(mean(rewards))), "", s.bold(fmt.int(tokens)), fmt.ms(elapsedMs), "", ""]);
      say("");
      say(renderTable(["status", "tasks", "mean reward", "LLM calls/task", "tokens", "mean time", "errors", "agent exit ≠ 0"], table, { right: [1, 2, 3, 4, 5], ascii }));
      const infra = rows.reduce((a, r) => a + (r.errors.infrastructure ?? 0), 0);
      if (infra > 0) say(s.yellow(`${infra} rollout(s) lost LLM calls to infrastructure and were not scored (error.kind "infrastructure"): rollgate task <id> says why.`));
      if (groupRows.length > 0) {
        const shown = groupRows.slice(0, 30);
        say(
          renderTable(
            ["group", "tasks", "completed", "mean reward", "std"],
            shown.map((g) => [g.group_id, String(g.tasks), String(g.completed), fmt.reward(g.mean_reward), fmt.reward(g.std_reward)]),
            { right: [1, 2, 3, 4], ascii },
          ),
        );
        if (groupRows.length > shown.length) say(`… and ${groupRows.length - shown.length} more groups`);
      }
      say(`${summary.tokens_per_s.toFixed(1)} tok/s over ${fmt.ms(elapsedMs)}${resultsToStdout ? "" : `; results appended to ${outPath}`}`);
      if ((interrupted || unfinished) && unfinished > gone.size) {
        say(
          s.yellow(
            `${unfinished - gone.size} task(s) had not ended when we stopped ${interrupted ? "(interrupted)" : "(timeout)"}; they keep running on the cluster: rollgate watch <id> follows one.`,
          ),
        );
      }
    }
    if (interrupted) return 130;
    if (gone.size) return EXIT.api;
    return unfinished || results.some((r) => r.status !== "completed") ? EXIT.failed : EXIT.ok;
  },
};
