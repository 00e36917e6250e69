/**
 * One session, several conversations (an agent and its sub-agents): an echoed turn whose words
 * another conversation also answered at the same position is restored from its own conversation's
 * record, not from whichever was written last.
 */
import type { ChatMessage } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { recordOf as record } from "./__fixtures__/record-heads.js";
import { conversationKey, matchEchoedHistory, prefixConversationKeys } from "./echoed-history.js";


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
