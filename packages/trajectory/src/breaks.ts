import type { ChatMessage, CompletionRecord, ContentPart } from "@rollgate/protocol";
import type { BreakReason, BuiltTraceBreak, RecordSpan, TemplateFacts } from "./types.js";

/**
 * Why a record extended no chain. Only runs for records that start a new trace; the token-level
 * evidence (closest chain, first differing position, sibling match) is gathered by the builder.
 */

/** What the classifier needs to know about a chain (a trace being built). */
export interface ChainView {
  index: number;
  prompt_length: number;
  spans: readonly RecordSpan[];
  records: readonly CompletionRecord[];
}

export interface BreakEvidence {
  record: CompletionRecord;
  /** The chain with the longest common prefix (or the sibling's chain); null when nothing is shared. */
  closest: ChainView | null;
  /** First token position where the record's prompt differs from `closest`'s sequence. */
  position: number | null;
  /**
   * Set when the prompt would have extended a state some chain already moved past: it starts with a
   * former tip of a chain, or it is identical to an earlier record's prompt.
   */
  sibling: { kind: "former_tip" | "identical_prompt"; record_id: string } | null;
}

/** A message's content as one string (images as `[image:<url>]`). */
export function text(content: string | ContentPart[] | null | undefined): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content.map((p) => (p.type === "text" ? p.text : `[image:${p.image_url.url}]`)).join("");
}

/** JSON with sorted keys, so equal objects compare equal whatever their key order. */
export function stableStringify(v: unknown): string {
  if (v === undefined) return "null";
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(stableStringify).join(",")}]`;
  const o = v as Record<string, unknown>;
  return `{${Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${stableStringify(o[k])}`)
    .join(",")}}`;
}

function normalizedArgs(args: string): string {
  try {
    return stableStringify(JSON.parse(args));
  } catch {
    return args;
  }
}

function systemText(messages: readonly ChatMessage[]): string {
  const first = messages[0];
  return first?.role === "system" ? text(first.content) : "";
}

/**
 * Whether the record's messages show an earlier assistant turn of the chain changed: at the index
 * where each chain record's answer belongs, the new request must hold that same answer.
 */
export function changedAssistantTurn(
  record: CompletionRecord,
  chainRecords: readonly CompletionRecord[],
): { record_id: string; why: string } | null {
  const messages = record.request.messages;
  for (const prev of chainRecords) {
    const m = messages[prev.request.messages.length];
    if (m === undefined) continue;
    if (m.role !== "assistant") return { record_id: prev.id, why: `its answer was replaced by a ${m.role} message` };
    const out = prev.message;
    // Surrounding whitespace is template glue the gateway normalises (e.g. "\n" before a tool call).
    if (text(m.content).trim() !== (out.content ?? "").trim()) return { record_id: prev.id, why: "its answer's content changed" };
    if ((m.reasoning ?? "") !== (out.reasoning ?? "")) {
      return { record_id: prev.id, why: m.reasoning ? "its reasoning changed" : "its reasoning was dropped" };
    }
    const a = m.tool_calls ?? [];
    const b = out.tool_calls;
    if (
      a.length !== b.length ||
      a.some(
        (c, i) =>
          c.function.name !== b[i]?.function.name ||
          normalizedArgs(c.function.arguments) !== normalizedArgs(b[i]?.function.arguments ?? ""),
      )
    ) {
      return { record_id: prev.id, why: "its tool calls changed" };
    }
  }
  return null;
}

/** A generation prompt is short (the longest known, Qwen3's with thinking off: `<|im_start|>assistant\n<think>\n\n</think>\n\n`, 7 tokens). */
const GENERATION_PROMPT_TOKENS = 16;

/** A user query: a user message that is not a tool result the template wraps (the profile says which wrappers). */
function isQuery(m: ChatMessage, t: TemplateFacts): boolean {
  if (m.role !== "user") return false;
  const body = text(m.content);
  return !(t.toolResultWrappers ?? []).some(([open, close]) => body.startsWith(open) && body.endsWith(close));
}

/**
 * Whether the record's request echoes `produced`'s answer with its reasoning while a later user
 * query follows it: the situation in which templates that drop earlier reasoning leave it out.
 */
function reasoningDropped(record: CompletionRecord, produced: CompletionRecord, t: TemplateFacts): boolean {
  if (!produced.message.reasoning) return false;
  const at = produced.request.messages.length;
  return record.request.messages.slice(at + 1).some((m) => isQuery(m, t));
}

/**
 * The forced tool choice a record's answer was generated under, in words (`tool_choice "required"`,
 * `tool_choice "f"`), or null. Engines answer one with guided decoding: the model writes bare JSON
 * rather than its tool-call markup, and the template renders the echoed call in the markup.
 */
function forcedChoice(r: CompletionRecord): string | null {
  const tc = r.request.tool_choice;
  if (tc === "required") return 'tool_choice "required"';
  if (tc !== undefined && typeof tc === "object") return `tool_choice "${tc.function.name}"`;
  return null;
}

/** " (<profile> profile: <note>)" when the template is known to do this, else "". */
function knownFor(t: TemplateFacts, note: string | null | undefined): string {
  return note ? ` (${t.profile ? `${t.profile} profile: ` : ""}${note})` : "";
}

/** The span whose output region contains response offset `r`, if any. */
function outputSpanAt(spans: readonly RecordSpan[], r: number): RecordSpan | undefined {
  return spans.find((s) => r >= s.output_start && r < s.end);
}

export function classifyBreak(e: BreakEvidence, template: TemplateFacts = {}): BuiltTraceBreak {
  const { record, closest, position } = e;
  const make = (reason: BreakReason, detail: string): BuiltTraceBreak => ({
    record_id: record.id,
    closest_trace: closest?.index ?? null,
    position,
    reason,
    detail,
  });

  if (e.sibling) {
    return make(
      "sibling",
      e.sibling.kind === "identical_prompt"
        ? `same prompt as record ${e.sibling.record_id}, whose chain continues without it (retry, n>1 or parallel call)`
        : `extends the state after record ${e.sibling.record_id}, which another record already extended`,
    );
  }
  if (closest === null || position === null) return make("unknown", "shares no token with any trace");

  const last = closest.records.at(-1);
  if (last === undefined) return make("unknown", "closest trace has no records");

  if (stableStringify(record.request.tools ?? []) !== stableStringify(last.request.tools ?? [])) {
    return make("tools_changed", `request.tools differ from record ${last.id}'s`);
  }
  if (systemText(record.request.messages) !== systemText(last.request.messages)) {
    return make("system_changed", `the system message differs from record ${last.id}'s`);
  }
  const lastSpan = closest.spans.at(-1);
  if (last.finish_reason === "length" && lastSpan && position >= closest.prompt_length + lastSpan.output_start) {
    return make(
      "truncated_output",
      `record ${last.id} stopped on length and the prompt diverges at or after its truncated output (token ${position})`,
    );
  }
  const r = position - closest.prompt_length;
  const span = r >= 0 ? outputSpanAt(closest.spans, r) : undefined;
  if (span) {
    const j = closest.spans.indexOf(span);
    const produced = closest.records[j];
    const at = `diverges at token ${r - span.output_start} of record ${span.record_id}'s generated output`;
    if (produced && reasoningDropped(record, produced, template)) {
      return make(
        "history_rewritten",
        `${at}: the chat template left out that turn's reasoning, now that a later user query follows it${knownFor(template, template.reasoningDropped)}`,
      );
    }
    // A profile that says how its template re-renders (gpt-oss: harmony, whose forced calls keep
    // their own format) is told by that note; otherwise a forced choice is the likely cause.
    const forced = produced && !template.rerendered ? forcedChoice(produced) : null;
    if (forced) {
      return make(
        "history_rewritten",
        `${at}: that answer was generated under ${forced}, which the engine answers with guided decoding (the model writes bare JSON), and the chat template renders the echoed call in the model's own tool-call markup; this call's prompt was rendered, not continued token-in`,
      );
    }
    return make("history_rewritten", `${at} (the history was re-rendered differently)${knownFor(template, template.rerendered)}`);
  }
  const changed = changedAssistantTurn(record, closest.records);
  if (changed) return make("history_rewritten", `record ${changed.record_id}: ${changed.why}`);
  // The divergence lies before the end of some record's answer that the request echoes back: the
  // template re-rendered that assistant turn differently from how it was generated (dropped earlier
  // reasoning, or a generation prompt the template does not write for a past turn).
  const j = closest.spans.findIndex((s) => r < s.end);
  const echoedAt = j >= 0 ? closest.records[j] : undefined;
  if (echoedAt && record.request.messages[echoedAt.request.messages.length]?.role === "assistant") {
    const gap = (closest.spans[j] as RecordSpan).output_start - r;
    if (gap > 0 && gap <= GENERATION_PROMPT_TOKENS) {
      return make(
        "history_rewritten",
        `diverges ${gap} tokens before record ${echoedAt.id}'s output, in the generation prompt it was sampled after: the chat template renders that turn without it${knownFor(template, template.generationPromptDropped)}`,
      );
    }
    return make(
      "history_rewritten",
      `diverges before the end of record ${echoedAt.id}'s turn, which the request echoes: the chat template re-rendered that turn differently`,
    );
  }
  return make("unknown", `diverges at token ${position}, outside any generated output`);
}
