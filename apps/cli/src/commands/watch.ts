import { RollgateError, type TaskEvent, type TaskRecord } from "@rollgate/client";
import type { CommandSpec } from "../framework.js";
import { EXIT, fmt, printable, statusColor, type Context, type Style } from "../output.js";
import { memberOrder } from "../summary.js";

/** One event as a line a person reads. */
export function describeEvent(s: Style, e: TaskEvent): string {
  const d = e.data as Record<string, unknown>;
  switch (e.type) {
    case "queued":
      return "queued";
    case "started":
      return `started on ${d.worker} (attempt ${d.attempt}, session ${d.session_id})`;
    case "llm_call":
      return `${s.magenta("llm_call")} #${d.seq}: prompt ${d.prompt_tokens} · completion ${d.completion_tokens} · cached ${d.cached_tokens} · ${d.latency_ms}ms · ${d.finish_reason}${d.replayed ? ` · ${s.gray("replayed")}` : ""}`;
    case "retrying":
      if (d.reason === "lost_call") return `${s.yellow("retrying")}: attempt ${d.attempt} lost an LLM call and is not scored; it runs again in a fresh session (${d.cause})`;
      if (d.reason === "infrastructure") return `${s.yellow("retrying")}: attempt ${d.attempt} failed on infrastructure and is not scored; it runs again (${printable(String(d.cause))})`;
      return `${s.yellow("retrying")}: the worker running it (${d.previous_worker ?? "?"}) is gone; it runs again`;
    case "evaluating":
      return `evaluating (agent exit ${d.agent_exit_code ?? "–"})`;
    case "terminal": {
      const err = d.error as { kind?: string; message?: string } | null | undefined;
      const reward = d.reward === null || d.reward === undefined ? "" : ` · reward ${fmt.reward(d.reward as number)}`;
      return `${s.bold("ended")} ${statusColor(s, String(d.status))}${reward}${err ? ` · ${printable(`${err.kind}: ${err.message}`)}` : ""}`;
    }
    default:
      return `${e.type}${Object.keys(d).length ? ` ${JSON.stringify(d)}` : ""}`;
  }
}

export const watchCommand: CommandSpec<Context> = {
  name: "watch",
  summary: "follow a task's (or a whole group's) events until it ends",
  description: `Streams the lifecycle events of a task (queued, started, llm_call, evaluating, terminal) as they
happen, from its first event, and exits when it ends. Given a group id, follows every task of
the group and prints the group's rewards at the end. --json prints one event per line (NDJSON,
each with its task_id). Exit code 0 when everything watched completed, 1 otherwise.`,
  args: [{ name: "task|group", required: true, description: "a task id, or a GRPO group id" }],
  options: [],
  examples: ["rollgate watch t-123", "rollgate watch g-7 --json | jq -c 'select(.type==\"terminal\")'"],
  async run(ctx, [id]) {
    const s = ctx.style;
    let ids: string[];
    let isGroup = false;
    try {
      await ctx.client.getTask(id!);
      ids = [id!];
    } catch (err) {
      if (!(err instanceof RollgateError && err.status === 404)) throw err;
      const tasks: TaskRecord[] = [];
      for await (const t of ctx.client.listTasks({ group_id: id!, limit: 1000 })) tasks.push(t);
      if (tasks.length === 0) throw new RollgateError(`no task or group ${id}`, 404, "not_found");
      ids = memberOrder(id!, tasks).map((t) => t.id);
      isGroup = true;
      if (!ctx.json) ctx.out(`group ${s.bold(id!)}: ${ids.length} task(s)`);
    }
    const width = Math.max(...ids.map((i) => i.length));
    const ended = new Map<string, { status: string; reward: number | null }>();
    // Said once per outage (every stream of a group sees the same one), on stderr: stdout stays events.
    let waitingSince: number | null = null;
    await Promise.all(
      ids.map(async (taskId) => {
        const onReconnect = (cause: unknown) => {
          if (waitingSince !== null) return;
          waitingSince = Date.now();
          ctx.err(`${ctx.errStyle.yellow("warning:")} lost the gateway (${cause instanceof Error ? cause.message : String(cause)}); reconnecting, the task keeps running`);
        };
        for await (const e of ctx.client.streamEvents(taskId, { onReconnect })) {
          if (waitingSince !== null) {
            ctx.err(`reconnected after ${fmt.ms(Date.now() - waitingSince)}`);
            waitingSince = null;
          }
          if (ctx.json) ctx.printJson({ task_id: taskId, ...e }, true);
          else ctx.out(`${s.gray(fmt.time(e.at))} ${isGroup ? `${s.cyan(taskId.padEnd(width))} ` : ""}${describeEvent(s, e)}`);
          if (e.type === "terminal") ended.set(taskId, { status: String(e.data.status), reward: (e.data.reward as number | null | undefined) ?? null });
        }
      }),
    );
    if (isGroup && !ctx.json) {
      const rewards = [...ended.values()].filter((r) => r.status === "completed" && r.reward !== null).map((r) => r.reward!);
      const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
      ctx.out(
        `group ${id}: ${[...ended.values()].filter((r) => r.status === "completed").length}/${ids.length} completed · mean reward ${fmt.reward(mean)} · rewards [${rewards.map((r) => r.toFixed(2)).join(", ")}]`,
      );
    }
    return ids.every((i) => ended.get(i)?.status === "completed") ? EXIT.ok : EXIT.failed;
  },
};
