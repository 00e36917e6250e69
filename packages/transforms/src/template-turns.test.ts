import type { ChatMessage } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { splitToolCallTurns } from "./template-turns.js";

const call = (id: string) => ({ id, type: "function" as const, function: { name: "shell", arguments: `{"command": "${id}"}` } });

describe("splitToolCallTurns", () => {
  const messages: ChatMessage[] = [
    { role: "user", content: "go" },
    { role: "assistant", content: "Running.", tool_calls: [call("a"), call("b"), call("c")] },
    { role: "tool", tool_call_id: "a", content: "1" },
  ];

  it("gives a turn with more calls than the template renders as consecutive turns, content on the first", () => {
    expect(splitToolCallTurns(messages, 1)).toEqual([
      messages[0],
      { role: "assistant", content: "Running.", tool_calls: [call("a")] },
      { role: "assistant", content: null, tool_calls: [call("b")] },
      { role: "assistant", content: null, tool_calls: [call("c")] },
      messages[2],
    ]);
    expect(splitToolCallTurns(messages, 2).map((m) => (m.role === "assistant" ? m.tool_calls?.length : 0))).toEqual([0, 2, 1, 0]);
  });

  it("leaves the messages as they are without a limit or within it", () => {
    expect(splitToolCallTurns(messages, undefined)).toEqual(messages);
    expect(splitToolCallTurns(messages, 3)).toEqual(messages);
  });
});
