import type { ChatMessage } from "@rollgate/protocol";

/**
 * Empirical normalisation of echoed assistant turns. A turn restored exactly as the engine parsed
 * it may still re-render differently from what the model generated: the chat route's parsers and
 * the chat template do not always invert each other. Qwen3's template, for one, writes a "\n"
 * before the first tool call whenever content is non-empty, so `text\n<tool_call>` comes back as
 * content `"text\n"` and would re-render as `text\n\n<tool_call>`; and `</think>\n\n<tool_call>`
 * comes back as content `"\n\n"`. DeepSeek's and Kimi's templates print content verbatim, so the
 * same edit would break them instead; DeepSeek-V3's renders tool calls only when content is null.
 *
 * So no rule is fixed: for each kind of turn (its shape) the gateway tries a few forms against the
 * record's own token ids and keeps the one that reproduces them, per engine. These are the pure
 * parts: shapes, the forms tried, and applying what was learned.
 */

type AssistantMessage = Extract<ChatMessage, { role: "assistant" }>;

/** The forms a turn is tried in, in order of preference (as generated first). */
export const NORMALIZATIONS = ["as_generated", "trim_end", "blank_to_empty", "blank_to_null", "null_to_empty"] as const;
export type Normalization = (typeof NORMALIZATIONS)[number];

/** What decides how a template re-renders a turn: tool calls or not, and what kind of content. */
export function turnShape(m: AssistantMessage): string {
  const calls = (m.tool_calls?.length ?? 0) > 0 ? "calls" : "text";
  const c = m.content;
  if (c === null || c === undefined) return `${calls}:null`;
  if (typeof c !== "string") return `${calls}:parts`;
  if (c === "") return `${calls}:empty`;
  if (/^\s+$/.test(c)) return `${calls}:blank`;
  return /\s$/.test(c) ? `${calls}:text-space` : `${calls}:text`;
}

/** The turn in one form, or null when the form does not apply to it. */
export function normalized(m: AssistantMessage, form: Normalization): AssistantMessage | null {
  const c = m.content;
  switch (form) {
    case "as_generated":
      return m;
    case "trim_end":
      // Streamed parses keep the whitespace between tool calls too ("text\n\n"), so all of it goes.
      return typeof c === "string" && c.trim() !== "" && /\s$/.test(c) ? { ...m, content: c.trimEnd() } : null;
    case "blank_to_empty":
      return typeof c === "string" && c !== "" && c.trim() === "" ? { ...m, content: "" } : null;
    case "blank_to_null":
      return typeof c === "string" && c.trim() === "" ? { ...m, content: null } : null;
    case "null_to_empty":
      return c === null || c === undefined ? { ...m, content: "" } : null;
  }
}

/** Every form a turn can be tried in (as generated first). */
export function candidateForms(m: AssistantMessage): { form: Normalization; message: AssistantMessage }[] {
  return NORMALIZATIONS.flatMap((form) => {
    const message = normalized(m, form);
    return message ? [{ form, message }] : [];
  });
}

/**
 * The learned forms applied to the turns at `indexes` (the restored ones: an agent's own turns are
 * left as it sent them). A shape with no learned form stays as generated.
 */
export function applyNormalizations(messages: readonly ChatMessage[], indexes: Iterable<number>, forms: ReadonlyMap<string, Normalization>): ChatMessage[] {
  const out = [...messages];
  for (const i of indexes) {
    const m = out[i];
    if (m?.role !== "assistant") continue;
    const form = forms.get(turnShape(m));
    if (form && form !== "as_generated") out[i] = normalized(m, form) ?? m;
  }
  return out;
}

/** Tokens two id lists share from the start. */
export function commonPrefixLength(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/**
 * The form that reproduces a recorded turn: `renders` holds, per candidate form, the engine's render
 * of the conversation with the turn in that form (and a message after it); `recorded` is the
 * record's prompt + output ids. The first form whose render starts with every recorded token wins;
 * null when none does (inconclusive: the history before the turn re-renders differently too).
 */
export function chooseForm(renders: readonly { form: Normalization; ids: readonly number[] }[], recorded: readonly number[]): Normalization | null {
  for (const r of renders) if (commonPrefixLength(r.ids, recorded) === recorded.length) return r.form;
  return null;
}
