import type { CanonicalChatRequest, CompletionRecord } from "@rollgate/protocol";
import type { EngineResult } from "@rollgate/transforms";

/**
 * Replay-then-branch (docs/data-model.md#branches): a branch's first calls are answered from the
 * source session's records. Pure helpers: whether the agent asked what the source asked, and the
 * recorded answer as an engine result.
 */

/** JSON with object keys sorted, so two requests compare by content, not by key order. */
function canonicalJson(v: unknown): string {
  return JSON.stringify(v, (_key, value: unknown) => {
    if (value === null || typeof value !== "object" || Array.isArray(value)) return value;
    const obj = value as Record<string, unknown>;
    return Object.fromEntries(Object.keys(obj).sort().map((k) => [k, obj[k]]));
  });
}

/**
 * Both sides of a difference, each cut around the first character where they part (a system prompt
 * is thousands of characters long: its start tells nothing), so the message names what differs.
 */
function differingParts(a: unknown, b: unknown): { recorded: string; asked: string } {
  const sa = canonicalJson(a) ?? "undefined";
  const sb = canonicalJson(b) ?? "undefined";
  let at = 0;
  while (at < sa.length && at < sb.length && sa[at] === sb[at]) at++;
  const from = Math.max(0, at - 60);
  const cut = (s: string) => `${from > 0 ? "..." : ""}${s.slice(from, at + 100)}${s.length > at + 100 ? "..." : ""}`;
  return { recorded: cut(sa), asked: cut(sb) };
}

/**
 * What else shapes the answer besides the messages and tools: how the template renders them
 * (thinking on or off, the effort, the client's template kwargs) and what decoding may emit (a
 * forced tool). The recorded answer was sampled for the recorded request's, so they must be the same.
 */
const RENDERING_FIELDS = ["reasoning_effort", "chat_template_kwargs", "enable_thinking", "tool_choice"] as const;

/**
 * Null when the agent's request asks what the recorded one asked (the same messages, with echoed
 * turns restored from the session's records, the same tools, and the same rendering and tool
 * choice); else the first difference, in words.
 */
export function replayDifference(recorded: CompletionRecord["request"], asked: CanonicalChatRequest): string | null {
  const a = recorded.messages;
  const b = asked.messages;
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (canonicalJson(a[i]) !== canonicalJson(b[i])) {
      const d = differingParts(a[i], b[i]);
      return `message ${i} differs: recorded ${d.recorded}, asked ${d.asked}`;
    }
  }
  if (a.length !== b.length) return `the recorded request has ${a.length} messages, this one ${b.length}`;
  if (canonicalJson(recorded.tools ?? []) !== canonicalJson(asked.tools ?? [])) {
    return `the tools differ: recorded ${(recorded.tools ?? []).map((t) => t.function.name).join(", ") || "none"}, asked ${(asked.tools ?? []).map((t) => t.function.name).join(", ") || "none"}`;
  }
  for (const field of RENDERING_FIELDS) {
    if (canonicalJson(recorded[field]) !== canonicalJson(asked[field])) {
      const d = differingParts(recorded[field], asked[field]);
      return `${field} differs: recorded ${d.recorded}, asked ${d.asked}`;
    }
  }
  return null;
}

/**
 * Why a rollout that numbered `numbered` calls, with these records, cannot be replayed to call
 * `calls`, or null when it can. A call of it that failed (no record) is no obstacle: its answer
 * is the agent's retry's, a later call's (chat-call.ts `replaySource`).
 */
export function replayGap(records: readonly Pick<CompletionRecord, "seq">[], calls: number, numbered: number): string | null {
  if (calls > numbered) return `its rollout made ${numbered} LLM calls`;
  if (!records.some((r) => r.seq < calls)) return `none of its first ${calls} calls has a record (they failed)`;
  return null;
}

/** The UTF-8 bytes of a token's text; none for a piece of a character (its text reads U+FFFD, its own bytes are not known). */
const tokenBytes = (text: string): number[] | null => (text.includes("\uFFFD") ? null : [...Buffer.from(text, "utf8")]);

/**
 * The recorded answer as the engine gave it: the same tokens, logprobs, message and finish.
 * `tokenTexts` (each output token's text, when the agent asked for logprobs) spells the logprobs'
 * tokens as the engine did; without them a token's text is "".
 */
export function recordedResult(r: CompletionRecord, tokenTexts?: readonly string[]): EngineResult {
  return {
    prompt_ids: r.prompt_ids,
    output_ids: r.output_ids,
    output_logprobs: r.output_logprobs,
    // Per-token detail (top logprobs) is not recorded: the sampled token's logprob only.
    logprobs: r.output_logprobs.map((logprob, i) => {
      const token = tokenTexts?.[i] ?? "";
      return { token, logprob, bytes: tokenTexts ? tokenBytes(token) : null, top_logprobs: [] };
    }),
    message: r.message,
    finish_reason: r.finish_reason,
    stop_reason: null,
    usage: r.usage,
    ...(r.output_weight_versions ? { output_versions: r.output_weight_versions } : {}),
    ...(r.routed_experts ? { routed_experts: r.routed_experts } : {}),
  };
}
