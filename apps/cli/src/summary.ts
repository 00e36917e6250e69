import type { TaskResult } from "@rollgate/client";
import { TerminalStatus } from "@rollgate/protocol";

/** What `submit` reports per terminal status (pure: results in, figures out). */
export interface StatusRow {
  status: TaskResult["status"];
  tasks: number;
  /** Mean reward of the rows' scored tasks (only `completed` ones have rewards). */
  mean_reward: number | null;
  llm_calls_per_task: number;
  completion_tokens: number;
  mean_total_ms: number | null;
  /** `error.kind` → how many (e.g. infrastructure: a rollout that lost LLM calls, never scored). */
  errors: Record<string, number>;
  /** Agents that exited non-zero (or by a signal): exit code or signal name → how many. */
  nonzero_agent_exits: Record<string, number>;
}

/** Equal values: their value and a spread of exactly 0 (a float sum of three 0.1 does not average to 0.1). */
const allEqual = (xs: number[]): boolean => xs.every((x) => x === xs[0]);

export function mean(xs: number[]): number | null {
  if (xs.length && allEqual(xs)) return xs[0]!;
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
}

export function std(xs: number[]): number | null {
  if (xs.length && allEqual(xs)) return 0;
  const m = mean(xs);
  return m === null ? null : Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / xs.length);
}

function tally(keys: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of keys) out[k] = (out[k] ?? 0) + 1;
  return out;
}

/** The exit that makes an agent's end non-zero: its code, its signal, or null when it exited 0 (or never ran). */
export function nonzeroExit(agent: TaskResult["agent"]): string | null {
  if (agent.signal) return agent.signal;
  if (agent.exit_code !== null && agent.exit_code !== 0) return String(agent.exit_code);
  return null;
}

/** One row per terminal status that has tasks, in a fixed order. */
export function statusRows(results: TaskResult[]): StatusRow[] {
  return TerminalStatus.options.flatMap((status) => {
    const rs = results.filter((r) => r.status === status);
    if (rs.length === 0) return [];
    return [
      {
        status,
        tasks: rs.length,
        mean_reward: mean(rs.filter((r) => r.reward !== null).map((r) => r.reward!)),
        llm_calls_per_task: rs.reduce((a, r) => a + r.usage.llm_calls, 0) / rs.length,
        completion_tokens: rs.reduce((a, r) => a + r.usage.completion_tokens, 0),
        mean_total_ms: mean(rs.map((r) => r.timings.total_ms)),
        errors: tally(rs.flatMap((r) => (r.error ? [r.error.kind] : []))),
        nonzero_agent_exits: tally(rs.flatMap((r) => nonzeroExit(r.agent) ?? [])),
      },
    ];
  });
}

/** `{infrastructure: 2, timeout: 1}` → "infrastructure ×2, timeout"; "–" when empty. */
export function describeCounts(counts: Record<string, number>): string {
  const parts = Object.entries(counts).map(([k, n]) => (n > 1 ? `${k} ×${n}` : k));
  return parts.length ? parts.join(", ") : "–";
}

/** `{"3": 2, SIGKILL: 1}` → "3 (exit 3 ×2, SIGKILL)"; "–" when none. */
export function describeExits(exits: Record<string, number>): string {
  const total = Object.values(exits).reduce((a, b) => a + b, 0);
  if (total === 0) return "–";
  const parts = Object.entries(exits).map(([k, n]) => `${/^-?\d+$/.test(k) ? `exit ${k}` : k}${n > 1 ? ` ×${n}` : ""}`);
  return `${total} (${parts.join(", ")})`;
}

/** Ids for a line of output: all of them up to `max`, then how many more. */
export function listIds(ids: string[], max = 20): string {
  return ids.length <= max ? ids.join(" ") : `${ids.slice(0, max).join(" ")} … and ${ids.length - max} more`;
}

/**
 * A group's tasks in member order (`<group>-0`, `<group>-1`, …, `<group>-10` by number, not as
 * strings), from the list the API gives newest first: members created in the same millisecond
 * come back in reverse string order there. Tasks named otherwise keep their creation order, last.
 */
export function memberOrder<T extends { id: string }>(groupId: string, newestFirst: readonly T[]): T[] {
  const prefix = `${groupId}-`;
  const index = (id: string): number => (id.startsWith(prefix) && /^\d+$/.test(id.slice(prefix.length)) ? Number(id.slice(prefix.length)) : Infinity);
  return newestFirst
    .slice()
    .reverse()
    .map((t, created) => ({ t, created, k: index(t.id) }))
    .sort((a, b) => (a.k === b.k ? a.created - b.created : a.k < b.k ? -1 : 1))
    .map((x) => x.t);
}
