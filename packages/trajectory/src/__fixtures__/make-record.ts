import type { ChatMessage, CompletionRecord, ToolDefinition } from "@rollgate/protocol";

export const IM_START = 151644;
export const IM_END = 151645;
export const NL = 198;

export interface RecordInput {
  id: string;
  seq: number;
  prompt_ids: number[];
  output_ids: number[];
  output_logprobs?: number[];
  finish_reason?: string;
  weight_version?: string | null;
  messages?: ChatMessage[];
  tools?: ToolDefinition[];
  message?: Partial<CompletionRecord["message"]>;
  session_id?: string;
  output_weight_versions?: (string | null)[];
  continued_after_pause?: number;
}

/** A completion record with plausible defaults; logprobs default to distinct non-zero values. */
export function makeRecord(r: RecordInput): CompletionRecord {
  return {
    id: r.id,
    session_id: r.session_id ?? "s-test",
    seq: r.seq,
    created_at: "2026-01-01T00:00:00.000Z",
    protocol: "openai_chat",
    engine: "engine-sim",
    dp_rank: 0,
    weight_version: r.weight_version === undefined ? "v1" : r.weight_version,
    request: {
      messages: r.messages ?? [{ role: "user", content: "hi" }],
      ...(r.tools ? { tools: r.tools } : {}),
      sampling: {},
    },
    prompt_ids: r.prompt_ids,
    output_ids: r.output_ids,
    output_logprobs: r.output_logprobs ?? r.output_ids.map((_, i) => -((r.seq + 1) * 0.1 + (i + 1) * 0.001)),
    finish_reason: r.finish_reason ?? "stop",
    message: { content: null, reasoning: null, tool_calls: [], ...r.message },
    usage: { prompt_tokens: r.prompt_ids.length, completion_tokens: r.output_ids.length, cached_tokens: 0 },
    latency_ms: 1,
    ...(r.output_weight_versions ? { output_weight_versions: r.output_weight_versions } : {}),
    ...(r.continued_after_pause ? { continued_after_pause: r.continued_after_pause } : {}),
  };
}

/** Records from a JSON fixture (only the token fields and a few scalars are given there). */
export function fromFixture(rows: ReadonlyArray<Omit<RecordInput, "output_logprobs"> & { output_logprobs: unknown[] }>): CompletionRecord[] {
  return rows.map((row) => makeRecord(row as RecordInput));
}
