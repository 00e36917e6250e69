import { readFileSync } from "node:fs";
import { Task, issuesMessage, type TaskInput } from "@rollgate/protocol";

export interface TasksFileLine {
  line: number;
  task: TaskInput;
}

/** Thrown with every bad line listed, so a user fixes a file in one go. */
export class TasksFileError extends Error {}

const LONG_INTEGER = /(?<![\w.])-?\d{16,}(?![\d.eE])/g;

/**
 * An integer the file wrote that a JSON number (a double, here and at the gateway) cannot hold: a
 * 64-bit row id or seed would reach the task, and its results, silently changed. Names the field.
 */
function changedInteger(text: string, value: unknown): string | null {
  for (const [literal] of text.matchAll(LONG_INTEGER)) {
    const parsed = Number(literal);
    if (BigInt(literal) === BigInt(parsed)) continue;
    const field = fieldHolding(value, parsed);
    // Not found: the digits were inside a string, which keeps them.
    if (field !== null) return `${field || "the task"} = ${literal} cannot be held exactly by a JSON number (it would arrive as ${parsed}): write it as a string`;
  }
  return null;
}

function fieldHolding(value: unknown, n: number, path = ""): string | null {
  if (value === n) return path;
  if (value === null || typeof value !== "object") return null;
  const entries: [string, unknown][] = Array.isArray(value) ? value.map((v, i) => [`${path}[${i}]`, v]) : Object.entries(value).map(([k, v]) => [path ? `${path}.${k}` : k, v]);
  for (const [p, v] of entries) {
    const found = fieldHolding(v, n, p);
    if (found !== null) return found;
  }
  return null;
}

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
  const raw: { line: number; value: unknown; text: string }[] = [];
  const problems: { line: number; text: string }[] = [];
  const trimmed = content.trim();
  if (file.endsWith(".json") || (trimmed.startsWith("[") && trimmed.endsWith("]"))) {
    try {
      const v = JSON.parse(content) as unknown;
      (Array.isArray(v) ? v : [v]).forEach((value, i) => raw.push({ line: i + 1, value, text: content }));
    } catch (err) {
      throw new TasksFileError(`${file} is not valid JSON: ${(err as Error).message}`);
    }
  } else {
    content.split(/\r?\n/).forEach((l, i) => {
      const s = l.trim();
      if (!s || s.startsWith("#") || s.startsWith("//")) return;
      try {
        raw.push({ line: i + 1, value: JSON.parse(s), text: s });
      } catch (err) {
        problems.push({ line: i + 1, text: `line ${i + 1}: not JSON (${(err as Error).message})` });
      }
    });
  }
  const out: TasksFileLine[] = [];
  for (const { line, value, text } of raw) {
    const inexact = changedInteger(text, value);
    if (inexact) {
      problems.push({ line, text: `${file.endsWith(".json") ? "task" : "line"} ${line}: ${inexact}` });
      continue;
    }
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
