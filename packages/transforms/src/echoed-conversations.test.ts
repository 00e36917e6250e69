/**
 * One session, several conversations (an agent and its sub-agents): an echoed turn whose words
 * another conversation also answered at the same position is restored from its own conversation's
 * record, not from whichever was written last.
 */
import type { AssistantOutput, ChatMessage, RecordHead } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { conversationKey, matchEchoedHistory, prefixConversationKeys, recordHead } from "./echoed-history.js";

function record(seq: number, messages: ChatMessage[], message: Partial<AssistantOutput>): RecordHead {
  return recordHead({
    id: `r${seq}`,
    session_id: "s",
    seq,
    created_at: "2026-01-01T00:00:00.000Z",
    protocol: "openai_chat",
    engine: "http://e",
    dp_rank: 0,
    weight_version: null,
    request: { messages, sampling: {} },
    prompt_ids: [1],
    output_ids: [2],
    output_logprobs: [-0.5],
    finish_reason: "stop",
    message: { content: null, reasoning: null, tool_calls: [], ...message },
    usage: { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 0 },
    latency_ms: 1,
  });
}

const MAIN: ChatMessage = { role: "system", content: "main agent" };
const SUB: ChatMessage = { role: "system", content: "sub-agent" };
const USER: ChatMessage = { role: "user", content: "check the files" };
const NEXT: ChatMessage = { role: "user", content: "and now?" };

describe("the same words answered at the same position in two conversations of a session", () => {
  // The main agent's answer was written first, the sub-agent's after: the latest is the sub-agent's.
  const main = record(0, [MAIN, USER], { content: "All good.", reasoning: "the main agent's thought" });
  const sub = record(1, [SUB, USER], { content: "All good.", reasoning: "the sub-agent's thought" });
  const echo = (system: ChatMessage): ChatMessage[] => [system, USER, { role: "assistant", content: "All good." }, NEXT];

  it("each conversation's echoed turn is restored from its own record when the request's tools are given", () => {
    for (const [system, own] of [
      [MAIN, main],
      [SUB, sub],
    ] as const) {
      const { messages, producers } = matchEchoedHistory(echo(system), [main, sub], { tools: undefined });
      expect(producers[2]?.id).toBe(own.id);
      expect(messages[2]).toMatchObject({ role: "assistant", reasoning: own.message.reasoning });
    }
  });

  it("without them, the latest answer of that position wins, as before", () => {
    expect(matchEchoedHistory(echo(MAIN), [main, sub]).producers[2]?.id).toBe(sub.id);
  });

  it("a retry of the same conversation still goes to the latest answer", () => {
    const retry = record(2, [MAIN, USER], { content: "All good.", reasoning: "the main agent's second thought" });
    expect(matchEchoedHistory(echo(MAIN), [main, sub, retry], { tools: undefined }).producers[2]?.id).toBe(retry.id);
  });

  it("prefix keys are the conversation keys of every prefix", () => {
    const messages = echo(MAIN);
    const tools = [{ type: "function" as const, function: { name: "shell" } }];
    expect(prefixConversationKeys(messages, tools)).toEqual(messages.map((_, i) => conversationKey(messages.slice(0, i), tools)).concat(conversationKey(messages, tools)));
  });
});
