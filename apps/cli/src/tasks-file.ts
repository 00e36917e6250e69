import { readFileSync } from "node:fs";
import { Task, issuesMessage, type TaskInput } from "@rollgate/protocol";

export interface TasksFileLine {
  line: number;
  task: TaskInput;
}

/** Thrown with every bad line listed, so a user fixes a file in one go. */
export class TasksFileError extends Error {}

/**
 * Reads tasks: JSONL (one task per line; blank lines and lines starting with `#` or `//` are
 * skipped), or — for a `.json` file — one task object or an array of them. Every task is checked
 * with the protocol's schema before anything is submitted.
 */
export function readTasksFile(file: string, text?: string): TasksFileLine[] {
  let content: string;
  try {
    content = text ?? readFileSync(file === "-" ? 0 : file, "utf8");
  } catch (err) {
    throw new TasksFileError(`cannot read ${file}: ${(err as NodeJS.ErrnoException).code === "ENOENT" ? "no such file" : (err as Error).message}`);
  }
  const raw: { line: number; value: unknown }[] = [];
  const problems: { line: number; text: string }[] = [];
  const trimmed = content.trim();
  if (file.endsWith(".json") || (trimmed.startsWith("[") && trimmed.endsWith("]"))) {
    try {
      const v = JSON.parse(content) as unknown;
      (Array.isArray(v) ? v : [v]).forEach((value, i) => raw.push({ line: i + 1, value }));
    } catch (err) {
      throw new TasksFileError(`${file} is not valid JSON: ${(err as Error).message}`);
    }
  } else {
    content.split(/\r?\n/).forEach((l, i) => {
      const s = l.trim();
      if (!s || s.startsWith("#") || s.startsWith("//")) return;
      try {
        raw.push({ line: i + 1, value: JSON.parse(s) });
      } catch (err) {
        problems.push({ line: i + 1, text: `line ${i + 1}: not JSON (${(err as Error).message})` });
      }
    });
  }
  const out: TasksFileLine[] = [];
  for (const { line, value } of raw) {
    const parsed = Task.safeParse(value);
    if (parsed.success) out.push({ line, task: value as TaskInput });
    else problems.push({ line, text: `${file.endsWith(".json") ? "task" : "line"} ${line}: ${issuesMessage(parsed.error)}` });
  }
  if (problems.length) {
    const shown = problems.sort((a, b) => a.line - b.line).slice(0, 20).map((p) => p.text);
    if (problems.length > shown.length) shown.push(`… and ${problems.length - shown.length} more`);
    throw new TasksFileError(`${file} has ${problems.length} invalid task(s):\n  ${shown.join("\n  ")}`);
  }
  if (out.length === 0) throw new TasksFileError(`${file} holds no tasks`);
  const ids = new Map<string, number>();
  for (const t of out) {
    if (!t.task.id) continue;
    if (ids.has(t.task.id)) throw new TasksFileError(`${file}: task id ${t.task.id} appears on lines ${ids.get(t.task.id)} and ${t.line}`);
    ids.set(t.task.id, t.line);
  }
  return out;
}
