import type { AssistantOutput } from "@rollgate/protocol";

/** A streamed tool-call fragment, OpenAI-chunk shaped (the first fragment of a call has id and name). */
export interface ParsedToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function?: { name?: string; arguments?: string };
}

export interface ParsedDelta {
  content?: string;
  reasoning?: string;
  tool_calls?: ParsedToolCallDelta[];
}

/**
 * An incremental parser of one answer's generated text into what an engine's chat route would
 * have made of it (content, reasoning, tool calls). A non-streamed answer is its whole text pushed
 * at once, so streamed and unstreamed calls give the same message by construction.
 */
export interface OutputParser {
  /** Feeds generated text; returns what can be said about it now (null: nothing yet). */
  push(text: string): ParsedDelta | null;
  /** The generation ended: flush what was held back. */
  end(): ParsedDelta | null;
  /** Tool calls emitted so far (the finish reason becomes "tool_calls" when any). */
  readonly toolCalls: number;
}

export interface GatewayParser {
  name: string;
  /** A fresh parser for one answer; `parseTools`: the request has tools and tool_choice is not "none". */
  create(parseTools: boolean, newId?: () => string): OutputParser;
  /**
   * The end-of-turn tokens' texts this family's output may end with: an engine's /detokenize keeps
   * them, the chat route would have skipped them as special tokens.
   */
  endTokens: readonly string[];
}

/** Runs a whole answer through a parser: the message a non-streaming chat route gives. */
export function parseWhole(parser: OutputParser, text: string): AssistantOutput {
  let content = "";
  let reasoning: string | null = null;
  const calls: AssistantOutput["tool_calls"] = [];
  for (const d of [parser.push(text), parser.end()]) {
    if (!d) continue;
    if (d.content !== undefined) content += d.content;
    if (d.reasoning !== undefined) reasoning = (reasoning ?? "") + d.reasoning;
    for (const c of d.tool_calls ?? []) {
      calls.push({ id: c.id ?? "", type: "function", function: { name: c.function?.name ?? "", arguments: c.function?.arguments ?? "" } });
    }
  }
  return { content: content === "" ? null : content, reasoning, tool_calls: calls };
}
