/**
 * Reasoning splitters of vLLM's DeepSeek parsers, on the output text:
 *  - deepseek_r1 (`BaseThinkingReasoningParser` + R1's streaming): an optional leading `<think>` is
 *    dropped; everything before `</think>` is reasoning (models whose prompt already holds `<think>`
 *    write no start tag); without `</think>` the whole output is reasoning and content is null;
 *  - deepseek_v3: deepseek_r1 when `chat_template_kwargs` has `thinking` (or `enable_thinking`)
 *    true, else the identity parser (everything is content).
 */

export const THINK_START = "<think>";
export const THINK_END = "</think>";

export interface ReasoningSplit {
  reasoning: string | null;
  /** What follows the reasoning (the tool parser's input). */
  rest: string;
  /** vLLM returns null content when nothing follows `</think>` (or no `</think>` came). */
  contentNull: boolean;
}

export function splitR1(text: string): ReasoningSplit {
  const at = text.indexOf(THINK_START);
  const body = at >= 0 ? text.slice(at + THINK_START.length) : text;
  const end = body.indexOf(THINK_END);
  if (end < 0) return { reasoning: body, rest: "", contentNull: true };
  const rest = body.slice(end + THINK_END.length);
  return { reasoning: body.slice(0, end), rest, contentNull: rest === "" };
}

export function deepseekThinking(kwargs: Record<string, unknown>): boolean {
  return Boolean(kwargs.thinking) || Boolean(kwargs.enable_thinking);
}
