import type { AssistantOutput, ChatMessage, RecordHead, ToolDefinition } from "@rollgate/protocol";
import { recordHead } from "../echoed-history.js";

/** A record as the gateway stores it (call `seq` of session "s", answering `messages`), read back as its head: what the history functions see. */
export function recordOf(seq: number, messages: ChatMessage[], message: Partial<AssistantOutput>, tools?: ToolDefinition[]): RecordHead {
  return recordHead({
    id: `r${seq}`,
    session_id: "s",
    seq,
    created_at: "2026-01-01T00:00:00.000Z",
    protocol: "openai_chat",
    engine: "http://e",
    dp_rank: 0,
    weight_version: null,
    request: { messages, sampling: {}, ...(tools ? { tools } : {}) },
    prompt_ids: [1],
    output_ids: [2],
    output_logprobs: [-0.5],
    finish_reason: "stop",
    message: { content: null, reasoning: null, tool_calls: [], ...message },
    usage: { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 0 },
    latency_ms: 1,
  });
}
