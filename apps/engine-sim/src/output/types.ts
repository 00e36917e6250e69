import type { SimTokenizer } from "../tokenizer.js";

/**
 * The engine's output parsers (vLLM's `--reasoning-parser` and `--tool-call-parser`) as one object
 * per request: a non-streaming parse of a finished answer, and a streaming parser fed one token at
 * a time. Tool-call ids are made by the route (vLLM and SGLang format them differently).
 */

export interface ParsedCall {
  name: string;
  arguments: string;
}

export interface ParsedOutput {
  reasoning: string | null;
  content: string | null;
  toolCalls: ParsedCall[];
  /** vLLM's `tools_called` (finish_reason "tool_calls"). */
  toolsCalled: boolean;
}

export interface DeltaToolCall {
  id?: string;
  type?: "function";
  index: number;
  function: { name?: string; arguments?: string };
}

/** A streamed delta (the keys present are exactly those vLLM sets; null = the chunk is swallowed). */
export interface Delta {
  reasoning?: string;
  content?: string;
  tool_calls?: DeltaToolCall[];
}

export interface StreamingParser {
  /** One generated token: its id and the text it added (request's skip_special_tokens applied). */
  push(id: number, deltaText: string, isLast: boolean): Delta | null;
  /** Tool calls whose name was streamed (vLLM's prev_tool_call_arr): finish_reason "tool_calls". */
  readonly toolsStreamed: number;
}

export interface ParseRequest {
  tok: SimTokenizer;
  /** Tool parsing is on: the request has tools and tool_choice is not "none". */
  toolParsing: boolean;
  /** The request's tools (for parsers that convert argument types by schema, like qwen3_coder). */
  tools: readonly Record<string, unknown>[];
  chatTemplateKwargs: Record<string, unknown>;
}

export interface OutputParser {
  /** `text` is the answer as detokenised for the request (stop token excluded); `ids` its token ids. */
  parse(text: string, ids: readonly number[], req: ParseRequest): ParsedOutput;
  stream(req: ParseRequest): StreamingParser;
}

/** vLLM's `make_tool_call_id()`: "chatcmpl-tool-" + uuid4 hex. */
export { makeToolCallId } from "./qwen3-hermes.js";
