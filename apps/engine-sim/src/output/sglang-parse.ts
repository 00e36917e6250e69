import { PyJsonError, parsePyJson, pyDumps } from "@rollgate/pyjson";
import { extractToolCalls } from "./qwen3-hermes.js";
import { deepseekV3, deepseekV31, llama3Json, qwen3Coder } from "./tool-parsers.js";
import type { ParsedCall } from "./types.js";

/**
 * SGLang's native parse routes over a finished answer's text (http_server.py):
 *   POST /parse_function_call {text, tools, tool_call_parser} → {normal_text, calls: [{tool_index, name, parameters}]}
 *   POST /separate_reasoning {text, reasoning_parser} → {text, reasoning_text}
 * As SGLang's detectors do: calls to functions not in `tools` are dropped, `parameters` is the
 * arguments as json.dumps writes them, `tool_index` is -1 (the caller places the call), the text
 * before the calls is stripped; reasoning text is stripped of its tags and whitespace.
 */

export const SGLANG_TOOL_PARSERS = ["qwen25", "qwen3_coder", "llama3", "deepseekv3", "deepseekv31", "gpt-oss"] as const;
export type SglangToolParser = (typeof SGLANG_TOOL_PARSERS)[number];
export const SGLANG_REASONING_PARSERS = ["qwen3", "deepseek-r1", "deepseek-v3", "gpt-oss"] as const;
export type SglangReasoningParser = (typeof SGLANG_REASONING_PARSERS)[number];

export interface SglangCall {
  tool_index: number;
  name: string;
  parameters: string;
}

/** json.dumps of the arguments when they are JSON, else the text as written. */
function dumps(args: string): string {
  try {
    return pyDumps(parsePyJson(args));
  } catch (e) {
    if (e instanceof PyJsonError) return args;
    throw e;
  }
}

// The answer's text ends before <|call|> (the stop token's text is not output).
const HARMONY_CALL = /(?:<\|start\|>assistant)?<\|channel\|>commentary to=functions\.([^\s<]+)\s*(?:<\|constrain\|>)?[^<]*<\|message\|>([\s\S]*?)(?:<\|call\|>|<\|end\|>|$)/g;

function harmonyCalls(text: string): { before: string; calls: ParsedCall[] } {
  const calls = [...text.matchAll(HARMONY_CALL)].map((m) => ({ name: m[1]!, arguments: m[2]! }));
  const at = text.search(/(?:<\|start\|>assistant)?<\|channel\|>commentary to=functions\./);
  return { before: at >= 0 ? text.slice(0, at) : text, calls };
}

function split(text: string, parser: SglangToolParser, tools: readonly Record<string, unknown>[]): { before: string; calls: ParsedCall[] } {
  switch (parser) {
    case "qwen25": {
      const r = extractToolCalls(text);
      const at = text.indexOf("<tool_call>");
      return { before: at >= 0 ? text.slice(0, at) : text, calls: r.toolCalls };
    }
    case "gpt-oss":
      return harmonyCalls(text);
    default: {
      const p = { qwen3_coder: qwen3Coder, llama3: llama3Json, deepseekv3: deepseekV3, deepseekv31: deepseekV31 }[parser];
      const r = p.parse(text, tools);
      if (!r.toolsCalled) return { before: text, calls: [] };
      const markers = ["<tool_call>", "<function=", "<|python_tag|>", "{", "<｜tool▁calls▁begin｜>"];
      const at = Math.min(...markers.map((m) => text.indexOf(m)).filter((i) => i >= 0));
      return { before: text.slice(0, at), calls: r.calls };
    }
  }
}

export function parseFunctionCall(text: string, parser: SglangToolParser, tools: readonly Record<string, unknown>[]): { normal_text: string; calls: SglangCall[] } {
  const known = new Set(tools.map((t) => (t.function as { name?: unknown } | undefined)?.name).filter((n): n is string => typeof n === "string"));
  const { before, calls } = split(text, parser, tools);
  const kept = calls.filter((c) => known.has(c.name)).map((c) => ({ tool_index: -1, name: c.name, parameters: dumps(c.arguments) }));
  if (kept.length === 0) return { normal_text: text, calls: [] };
  return { normal_text: before.trim(), calls: kept };
}

const ANALYSIS = /(?:<\|start\|>assistant)?<\|channel\|>analysis<\|message\|>([\s\S]*?)(?:<\|end\|>|$)/g;
/** Visible messages (final answers, recipient-less commentary) reduce to their text; calls stay for the call parser. */
const VISIBLE = /(?:<\|start\|>assistant)?<\|channel\|>(?:final|commentary)<\|message\|>([\s\S]*?)(?:<\|end\|>|<\|return\|>|$)/g;

export function separateReasoning(text: string, parser: SglangReasoningParser): { text: string; reasoning_text: string } {
  if (parser === "gpt-oss") {
    const reasoning = [...text.matchAll(ANALYSIS)].map((m) => m[1]!).join("");
    const normal = text.replace(ANALYSIS, "").replace(VISIBLE, (_all, body: string) => body);
    return { text: normal.trim(), reasoning_text: reasoning.trim() };
  }
  // deepseek-r1 is forced into reasoning (its prompt holds <think>); the others need the tag in the text.
  const forced = parser === "deepseek-r1";
  if (!forced && !text.includes("<think>")) return { text, reasoning_text: "" };
  const body = text.replaceAll("<think>", "").trim();
  const end = body.indexOf("</think>");
  if (end < 0) return { text: "", reasoning_text: body };
  return { text: body.slice(end + "</think>".length).trim(), reasoning_text: body.slice(0, end) };
}
