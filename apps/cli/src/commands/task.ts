import type { CommandSpec } from "../framework.js";
import { EXIT, fmt, printable, statusColor, type Context } from "../output.js";

export const taskCommand: CommandSpec<Context> = {
  name: "task",
  summary: "show a task: status, reward, usage, timings, callback state (--logs: the agent's output)",
  args: [{ name: "id", required: true, description: "task id" }],
  options: [
    { name: "logs", short: "l", type: "boolean", description: "also print the agent's output (bounded, newest kept)" },
    { name: "instruction", type: "boolean", description: "print the whole instruction (default: its first line)" },
  ],
  examples: ["rollgate task t-123", "rollgate task t-123 --json | jq .result.reward"],
  async run(ctx, [id], values) {
    const t = await ctx.client.getTask(id!);
    const logs = values.logs ? await ctx.client.getLogs(id!) : undefined;
    if (ctx.json) {
      ctx.printJson(logs === undefined ? t : { ...t, logs });
      return EXIT.ok;
    }
    const s = ctx.style;
    const r = t.result;
    const rows: [string, string][] = [
      ["status", statusColor(s, t.status)],
      ["reward", r ? s.bold(fmt.reward(r.reward)) : "–"],
      ...(r?.error ? ([["error", s.red(printable(`${r.error.kind}: ${r.error.message}`))]] as [string, string][]) : []),
      ["group", t.group_id ?? "–"],
      ["instruction", values.instruction ? t.task.instruction : (t.task.instruction.split("\n")[0] ?? "").slice(0, 120)],
      ["agent", t.task.agent.harness === "command" ? `command ${JSON.stringify(t.task.agent.command)}` : t.task.agent.harness],
      ["created", `${t.created_at}`],
      ["started", t.started_at ?? "–"],
      ["finished", t.finished_at ?? "–"],
      ["attempts", String(t.attempts)],
      ["worker", t.worker ?? "–"],
      ["session", t.session_id ?? "–"],
      ["callback", t.callback.state === "none" ? "none" : `${t.callback.state} (${t.callback.attempts} attempt(s)${t.callback.last_error ? `, last error: ${t.callback.last_error}` : ""})`],
    ];
    if (r) {
      rows.push(
        ["llm calls", fmt.int(r.usage.llm_calls)],
        ["tokens", `prompt ${fmt.int(r.usage.prompt_tokens)} · completion ${fmt.int(r.usage.completion_tokens)} · cached ${fmt.int(r.usage.cached_tokens)}`],
        ["timings", `queued ${fmt.ms(r.timings.queued_ms)} · run ${fmt.ms(r.timings.run_ms)} · eval ${fmt.ms(r.timings.eval_ms)} · total ${fmt.ms(r.timings.total_ms)}`],
        ["agent exit", `${r.agent.exit_code ?? "–"}${r.agent.signal ? ` (${r.agent.signal})` : ""}`],
        ["evaluation", r.evaluation ? `${r.evaluation.kind} · exit ${r.evaluation.exit_code ?? "–"}` : "–"],
      );
      if (r.trajectory) rows.push(["trajectory", `${r.trajectory.builder}: ${r.trajectory.stats.traces} trace(s), ${r.trajectory.stats.trainable_tokens}/${r.trajectory.stats.response_tokens} response tokens trainable`]);
    }
    const w = Math.max(...rows.map(([k]) => k.length));
    ctx.out(s.bold(t.id));
    for (const [k, v] of rows) ctx.out(`  ${s.gray(k.padEnd(w))}  ${v}`);
    // The agent's and its grader's own bytes: shown, never played on the terminal.
    if (r?.evaluation?.stdout_tail) ctx.out(`  ${s.gray("eval output".padEnd(w))}  ${printable(r.evaluation.stdout_tail).trim().split("\n").slice(-3).join(" ⏎ ")}`);
    if (logs !== undefined) {
      ctx.out("");
      ctx.out(s.gray("── agent output ──"));
      ctx.out(printable(logs).trimEnd() || s.gray("(none)"));
    }
    return EXIT.ok;
  },
};
