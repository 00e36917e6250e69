import { z } from "zod";

/**
 * What conversation a trace holds inside its rollout (docs/trace-kinds.md says how each CLI's wire
 * shows it): the agent's own (`main`), a sub-agent one of its tool calls started (`sub_agent`), the
 * agent's conversation resumed from a summary of itself (`compaction`), or a call the CLI makes
 * beside the agent loop, such as a title or a summary request without tools (`side_request`).
 */
export const TraceKind = z.enum(["main", "sub_agent", "compaction", "side_request"]);
export type TraceKind = z.infer<typeof TraceKind>;

/**
 * Where a trace came from, when the wire shows it: for a sub-agent, the trace and record whose tool
 * call started it; for a compaction, the trace that was summarised and the record that wrote the
 * summary; for a summary side request, the trace it summarised.
 */
export const TraceParent = z.object({
  /** Index of the parent trace in the trajectory's `traces`. */
  trace: z.number().int().nonnegative(),
  /** The record in that trace that made the tool call or wrote the summary (its last record when neither). */
  record_id: z.string(),
  /** The tool call that started a sub-agent; null for the other kinds. */
  tool_call_id: z.string().nullable(),
});
export type TraceParent = z.infer<typeof TraceParent>;
