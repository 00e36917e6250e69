import type { ChatMessage } from "@rollgate/protocol";

/**
 * The conversation as an engine whose chat template renders at most `max` tool calls per assistant
 * turn can take it: a turn with more becomes consecutive turns of at most `max` calls each (the
 * first keeps the content and reasoning). Only what the engine renders changes; the gateway matches
 * and records the turn as the model wrote it, and continues token-in from its recorded ids where it
 * can. `max` undefined: the messages as they are.
 */
export function splitToolCallTurns(messages: readonly ChatMessage[], max: number | undefined): ChatMessage[] {
  if (max === undefined || !messages.some((m) => m.role === "assistant" && (m.tool_calls?.length ?? 0) > max)) return [...messages];
  return messages.flatMap((m) => {
    const calls = m.role === "assistant" ? (m.tool_calls ?? []) : [];
    if (m.role !== "assistant" || calls.length <= max) return [m];
    const turns: ChatMessage[] = [];
    for (let i = 0; i < calls.length; i += max) {
      const part = calls.slice(i, i + max);
      turns.push(i === 0 ? { ...m, tool_calls: part } : { role: "assistant", content: null, tool_calls: part });
    }
    return turns;
  });
}
