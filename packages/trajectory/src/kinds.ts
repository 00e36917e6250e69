import type { ChatMessage, CompletionRecord, TraceBreak, TraceKind, TraceParent } from "@rollgate/protocol";
import { stableStringify, text } from "./breaks.js";

/**
 * Which conversation of the rollout each trace holds (`main`, `sub_agent`, `compaction`,
 * `side_request`) and where it came from, read from the records' canonical messages alone
 * (docs/trace-kinds.md describes what each CLI sends):
 *
 * - sub_agent: the first user message (one of its text parts, or its start or end at a line
 *   boundary) is, verbatim, a string argument of a tool call an earlier record of another trace
 *   made: the Task/Agent/task tool's `prompt`.
 * - compaction: the first request carries an earlier summary request's whole answer (a summary
 *   request is a record whose request a CLI's summary instruction marks, or a record of a trace
 *   without tools), or a CLI's continuation preamble.
 * - side_request: no request of the trace declares tools while another trace's do (title
 *   requests, summary requests, …).
 * - main: everything else.
 */

/** Phrases a CLI puts in the request that asks the model for a summary of the conversation. */
export const SUMMARY_REQUEST_MARKERS: readonly { cli: string; text: string }[] = [
  { cli: "Claude Code", text: "Your task is to create a detailed summary of the conversation so far" },
  { cli: "Codex", text: "You are performing a CONTEXT CHECKPOINT COMPACTION" },
  { cli: "Gemini CLI, Qwen Code", text: "You are the component that summarizes internal chat history into a given structure" },
];

/** Phrases a CLI puts before the summary when it resumes the conversation from it. */
export const CONTINUATION_MARKERS: readonly { cli: string; text: string }[] = [
  { cli: "Claude Code", text: "This session is being continued from a previous conversation that ran out of context" },
  { cli: "Codex", text: "Another language model started to solve this problem and produced a summary of its thinking process" },
  { cli: "pi", text: "The conversation history before this point was compacted into the following summary" },
];

/** Shorter tool arguments could equal a user message by chance ("yes", a file name). */
const MIN_TASK_CHARS = 16;
/** Shorter answers could be quoted by chance. */
const MIN_SUMMARY_CHARS = 32;

export interface TraceOrigin {
  kind: TraceKind;
  parent: TraceParent | null;
  /** Why, in words (quoted in the break that starts the trace). */
  why: string;
}

interface ToolArg {
  record: CompletionRecord;
  trace: number;
  tool_call_id: string;
}

/** Every string inside a tool call's JSON arguments (the whole string when it is not JSON). */
function stringsIn(args: string): string[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(args);
  } catch {
    return [args];
  }
  const out: string[] = [];
  const walk = (v: unknown): void => {
    if (typeof v === "string") out.push(v);
    else if (Array.isArray(v)) v.forEach(walk);
    else if (v !== null && typeof v === "object") Object.values(v).forEach(walk);
  };
  walk(parsed);
  return out;
}

/** Line boundaries looked at in one message (a task sits at the start or the end of it). */
const MAX_BOUNDARIES = 256;

/**
 * The forms a sub-agent's task can take in its first user message, trimmed: the whole text, each
 * text part, and every start or end of the text at a line boundary (Anthropic text blocks arrive
 * joined by "\n", so a task after a reminder block is the text's end).
 */
function textForms(m: ChatMessage, lengths: ReadonlySet<number>): string[] {
  const whole = text(m.content);
  const forms = [whole.trim()];
  if (Array.isArray(m.content)) for (const p of m.content) if (p.type === "text") forms.push(p.text.trim());
  let seen = 0;
  for (let at = whole.indexOf("\n"); at >= 0 && seen < MAX_BOUNDARIES; at = whole.indexOf("\n", at + 1), seen++) {
    forms.push(whole.slice(0, at).trim(), whole.slice(at + 1).trim());
  }
  // Only lengths some argument has are worth hashing for a lookup.
  return forms.filter((f) => lengths.has(f.length));
}

function hasTools(records: readonly CompletionRecord[]): boolean {
  return records.some((r) => (r.request.tools?.length ?? 0) > 0);
}

function lastUserText(r: CompletionRecord): string {
  const m = r.request.messages.findLast((x) => x.role === "user");
  return m ? text(m.content) : "";
}

function systemText(r: CompletionRecord): string {
  return r.request.messages
    .filter((m) => m.role === "system")
    .map((m) => text(m.content))
    .join("\n");
}

function isSummaryRequest(r: CompletionRecord): boolean {
  const asked = lastUserText(r);
  const system = systemText(r);
  return SUMMARY_REQUEST_MARKERS.some((m) => asked.includes(m.text) || system.includes(m.text));
}

/** How many leading non-system messages two requests share. */
function sharedMessages(a: CompletionRecord, b: CompletionRecord): number {
  const x = a.request.messages.filter((m) => m.role !== "system");
  const y = b.request.messages.filter((m) => m.role !== "system");
  let n = 0;
  while (n < x.length && n < y.length && stableStringify(x[n]) === stableStringify(y[n])) n++;
  return n;
}

/**
 * Classify every trace. `traces[i]` is trace i's records in order; a record's trace index is where
 * it sits. Pure: the same records give the same answer.
 */
export function classifyTraces(traces: readonly (readonly CompletionRecord[])[]): TraceOrigin[] {
  const sessionHasTools = traces.some(hasTools);
  const noTools = traces.map((rs) => sessionHasTools && !hasTools(rs));

  // Tool-call string arguments, by value: the task a sub-agent may have been given.
  const toolArgs = new Map<string, ToolArg[]>();
  // Answers a later conversation may resume from.
  const summaries: { record: CompletionRecord; trace: number; text: string }[] = [];
  traces.forEach((rs, trace) => {
    for (const record of rs) {
      for (const call of record.message.tool_calls) {
        for (const s of stringsIn(call.function.arguments)) {
          const v = s.trim();
          if (v.length < MIN_TASK_CHARS) continue;
          const list = toolArgs.get(v);
          const arg = { record, trace, tool_call_id: call.id };
          if (list) list.push(arg);
          else toolArgs.set(v, [arg]);
        }
      }
      const answer = (record.message.content ?? "").trim();
      if (answer.length >= MIN_SUMMARY_CHARS && (noTools[trace] || isSummaryRequest(record))) summaries.push({ record, trace, text: answer });
    }
  });

  /** The trace a summary request repeated: its own when it extended it, else the one sharing the most messages. */
  const memo = new Map<CompletionRecord, { trace: number; record: CompletionRecord } | null>();
  const summarised = (summary: CompletionRecord, own: number): { trace: number; record: CompletionRecord } | null => {
    if (!memo.has(summary)) memo.set(summary, findSummarised(summary, own));
    return memo.get(summary) ?? null;
  };
  const findSummarised = (summary: CompletionRecord, own: number): { trace: number; record: CompletionRecord } | null => {
    if ((traces[own] as readonly CompletionRecord[])[0] !== summary) return { trace: own, record: summary };
    let best: { trace: number; record: CompletionRecord; shared: number } | null = null;
    traces.forEach((rs, i) => {
      if (i === own) return;
      const last = rs.findLast((r) => r.seq < summary.seq);
      if (!last) return;
      const shared = sharedMessages(last, summary);
      if (shared > 0 && (best === null || shared > best.shared)) best = { trace: i, record: last, shared };
    });
    return best;
  };

  const argLengths = new Set([...toolArgs.keys()].map((k) => k.length));

  const origins: TraceOrigin[] = traces.map((rs, i) => {
    const first = rs[0];
    if (first === undefined) return { kind: "main", parent: null, why: "" };
    const messages = first.request.messages;

    const task = messages.find((m) => m.role === "user");
    if (task) {
      let found: ToolArg | undefined;
      for (const form of textForms(task, argLengths)) {
        for (const arg of toolArgs.get(form) ?? []) {
          if (arg.trace === i || arg.record.seq >= first.seq) continue;
          if (!found || arg.record.seq > found.record.seq) found = arg;
        }
      }
      if (found) {
        const name = found.record.message.tool_calls.find((c) => c.id === found.tool_call_id)?.function.name ?? "?";
        return {
          kind: "sub_agent",
          parent: { trace: found.trace, record_id: found.record.id, tool_call_id: found.tool_call_id },
          why: `its first user message is the task record ${found.record.id} gave in tool call ${found.tool_call_id} (${name})`,
        };
      }
    }

    // A resumed conversation opens with its summary: every CLI puts it before, or as, the first assistant turn.
    const firstAnswer = messages.findIndex((m) => m.role === "assistant");
    const opening = firstAnswer < 0 ? messages : messages.slice(0, firstAnswer + 1);
    const quoted = opening.filter((m) => m.role === "user" || m.role === "assistant").map((m) => text(m.content));
    const summary = summaries.findLast((s) => s.trace !== i && s.record.seq < first.seq && quoted.some((q) => q.includes(s.text)));
    if (summary) {
      const from = summarised(summary.record, summary.trace);
      return {
        kind: "compaction",
        parent: from ? { trace: from.trace, record_id: summary.record.id, tool_call_id: null } : null,
        why: `it resumes from record ${summary.record.id}'s summary`,
      };
    }
    const marker = CONTINUATION_MARKERS.find((m) => quoted.some((q) => q.includes(m.text)));
    if (marker) {
      // The CLI reworded the answer (Claude Code drops its analysis part): the summary is the latest marked summary request before it.
      let asked: { record: CompletionRecord; trace: number } | undefined;
      traces.forEach((rs, t) => {
        if (t === i) return;
        for (const r of rs) if (r.seq < first.seq && (!asked || r.seq > asked.record.seq) && isSummaryRequest(r)) asked = { record: r, trace: t };
      });
      const from = asked ? summarised(asked.record, asked.trace) : null;
      return asked && from
        ? { kind: "compaction", parent: { trace: from.trace, record_id: asked.record.id, tool_call_id: null }, why: `it opens with ${marker.cli}'s continuation preamble after record ${asked.record.id}'s summary request` }
        : { kind: "compaction", parent: null, why: `it opens with ${marker.cli}'s continuation preamble (no summary request of the session precedes it)` };
    }

    if (noTools[i]) {
      const from = isSummaryRequest(first) || summaries.some((s) => s.record === first) ? summarised(first, i) : null;
      return {
        kind: "side_request",
        parent: from ? { trace: from.trace, record_id: from.record.id, tool_call_id: null } : null,
        why: from ? `a summary request without tools for trace ${from.trace}` : "it declares no tools while the agent's requests do",
      };
    }
    return { kind: "main", parent: null, why: "" };
  });
  return origins;
}

/** A break that starts a conversation of another kind is named by that kind; its token diagnosis stays in the detail. */
export function nameBreaks(breaks: readonly TraceBreak[], firstRecords: readonly (string | undefined)[], origins: readonly TraceOrigin[]): TraceBreak[] {
  const traceOf = new Map<string, number>();
  firstRecords.forEach((id, i) => {
    if (id !== undefined) traceOf.set(id, i);
  });
  return breaks.map((b) => {
    const i = traceOf.get(b.record_id);
    const o = i === undefined ? undefined : origins[i];
    if (o === undefined || o.kind === "main") return b;
    return { ...b, reason: o.kind, detail: `${o.kind.replace("_", " ")}: ${o.why}; by tokens alone: ${b.reason}, ${b.detail}` };
  });
}
