import type { ChatMessage } from "@rollgate/protocol";

/**
 * Agents send earlier assistant turns back as they received them, and the engine renders them
 * again through the chat template. Where the template cannot reproduce what the engine generated,
 * the trajectory breaks. This normalises the known cases so the re-render is token-exact:
 *
 * - Qwen3 (vLLM's reasoning + hermes parsers): the answer `<think>…</think>\n\n<tool_call>…` comes
 *   back as `content: "\n\n"` plus tool_calls. The template strips leading newlines from content
 *   but still writes a "\n" before the first tool call when content is non-empty, adding a token
 *   the model never produced. Whitespace-only content beside tool calls carries nothing: drop it.
 */
export function normalizeEchoedHistory(messages: ChatMessage[]): ChatMessage[] {
  return messages.map((m) => {
    if (m.role !== "assistant" || !m.tool_calls || m.tool_calls.length === 0) return m;
    if (typeof m.content === "string" && m.content !== "" && /^\n+$/.test(m.content)) return { ...m, content: "" };
    return m;
  });
}
