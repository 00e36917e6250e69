import type { TaskRecord } from "@rollgate/client";
import { TaskStatus } from "@rollgate/protocol";
import { numberOption, type CommandSpec } from "../framework.js";
import { nonzeroExit } from "../summary.js";
import { renderTable } from "../table.js";
import { EXIT, clip, fmt, printable, statusColor, type Context } from "../output.js";

const STATUSES = TaskStatus.options;

/** How long ago, in a few characters ("4s", "12m", "3h", "2d"). */
export function ago(iso: string | null, now: number): string {
  if (!iso) return "–";
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86_400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86_400)}d`;
}

/** Since when a task is in its status: ended, started, or submitted. */
function since(t: TaskRecord): string {
  return t.finished_at ?? t.started_at ?? t.created_at;
}

export const tasksCommand: CommandSpec<Context> = {
  name: "tasks",
  summary: "list tasks, newest first: status, group, since when, reward, error (filters: --status, --group)",
  description: `Lists the gateway's tasks, newest first: id, status, GRPO group, how long it has been in that
status, attempts, reward, and for a task that did not complete its error kind (and the agent's exit
when it was not 0). Use the ids with rollgate watch, task or trajectory. --json prints the task
records (TaskRecord) as one JSON array.`,
  args: [],
  options: [
    { name: "status", short: "s", type: "string", value: "<status>", choices: STATUSES, description: "only tasks in this status" },
    { name: "group", short: "g", type: "string", value: "<group id>", description: "only the tasks of this GRPO group" },
    { name: "limit", short: "n", type: "string", value: "<n>", default: "20", description: "at most this many tasks" },
  ],
  examples: ["rollgate tasks", "rollgate tasks --status failed", "rollgate tasks --group g-7 --json | jq -r '.[].id'"],
  async run(ctx, _args, values) {
    const limit = numberOption(values, "limit", "tasks", { integer: true, min: 1 }) ?? 20;
    const status = values.status as TaskStatus | undefined;
    const group = values.group as string | undefined;
    const tasks: TaskRecord[] = [];
    for await (const t of ctx.client.listTasks({ ...(status ? { status } : {}), ...(group ? { group_id: group } : {}), limit: Math.min(limit, 1000), max: limit })) tasks.push(t);
    if (ctx.json) {
      ctx.printJson(tasks);
      return EXIT.ok;
    }
    const filters = [status ? `status ${status}` : "", group ? `group ${group}` : ""].filter(Boolean).join(", ");
    if (tasks.length === 0) {
      ctx.out(`no tasks${filters ? ` (${filters})` : ""}`);
      return EXIT.ok;
    }
    const s = ctx.style;
    const now = Date.now();
    const rows = tasks.map((t) => {
      const r = t.result;
      const exit = r ? nonzeroExit(r.agent) : null;
      const note = [r?.error ? printable(`${r.error.kind}: ${r.error.message}`) : "", exit ? `agent exit ${exit}` : ""].filter(Boolean).join(" · ");
      return [t.id, statusColor(s, t.status), t.group_id ?? "–", ago(since(t), now), String(t.attempts), r ? fmt.reward(r.reward) : "–", clip(note, 80) || "–"];
    });
    ctx.out(renderTable(["id", "status", "group", "since", "attempts", "reward", "error"], rows, { right: [3, 4, 5], ascii: !s.enabled && !process.env.LANG?.includes("UTF") }));
    ctx.out(s.gray(`${tasks.length} task(s)${filters ? ` (${filters})` : ""}, newest first${tasks.length === limit ? `; --limit shows more` : ""} · rollgate watch <id> follows one`));
    return EXIT.ok;
  },
};
