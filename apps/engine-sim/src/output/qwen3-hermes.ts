import { randomBytes } from "node:crypto";
import { PyDict, parsePyJson, pyDumps } from "@rollgate/pyjson";
import type { SimTokenizer } from "../tokenizer.js";
import type { Delta, OutputParser, ParsedCall, ParseRequest, StreamingParser } from "./types.js";

/**
 * vLLM's output parsers for Qwen3 (`--reasoning-parser qwen3 --tool-call-parser hermes`), applied to the generated text:
 *  - reasoning: `--reasoning-parser qwen3` (the v0.10/v0.11 parser: reasoning only when the output
 *    holds `<think>` … `</think>`; the reasoning is kept raw, newlines included);
 *  - tools: `--tool-call-parser hermes` (`<tool_call>{json}</tool_call>`, arguments re-serialised
 *    with `json.dumps(..., ensure_ascii=False)`), applied only when the request has tools and
 *    tool_choice is not "none" (as vLLM does).
 */

export const THINK_START = "<think>";
export const THINK_END = "</think>";
export const TOOL_START = "<tool_call>";
export const TOOL_END = "</tool_call>";

/** vLLM's `make_tool_call_id()`: "chatcmpl-tool-" + uuid4 hex. */
export function makeToolCallId(): string {
  return `chatcmpl-tool-${randomBytes(16).toString("hex")}`;
}

/** Non-streaming Qwen3 reasoning split: [reasoning, content]. */
export function extractReasoning(text: string): { reasoning: string | null; content: string | null } {
  if (!text.includes(THINK_START) || !text.includes(THINK_END)) return { reasoning: null, content: text };
  const at = text.indexOf(THINK_START);
  const rest = text.slice(at + THINK_START.length);
  const end = rest.indexOf(THINK_END);
  if (end < 0) return { reasoning: null, content: rest };
  const content = rest.slice(end + THINK_END.length);
  return { reasoning: rest.slice(0, end), content: content || null };
}

/** Non-streaming hermes: tool calls and the content before the first `<tool_call>` (null when empty). */
export function extractToolCalls(text: string): { toolsCalled: boolean; toolCalls: ParsedCall[]; content: string | null } {
  if (!text.includes(TOOL_START)) return { toolsCalled: false, toolCalls: [], content: text };
  try {
    const calls: ParsedCall[] = [];
    // vLLM: r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)" with DOTALL
    const re = /<tool_call>([\s\S]*?)<\/tool_call>|<tool_call>([\s\S]*)/g;
    for (let m = re.exec(text); m; m = re.exec(text)) {
      const obj = parsePyJson(m[1] ?? m[2] ?? "");
      if (!(obj instanceof PyDict)) throw new Error("tool call is not an object");
      const name = obj.get("name");
      if (typeof name !== "string") throw new Error("tool call without a name");
      const args = obj.get("arguments");
      if (args === undefined) throw new Error("tool call without arguments");
      calls.push({ name, arguments: pyDumps(args) });
    }
    const content = text.slice(0, text.indexOf(TOOL_START));
    return { toolsCalled: true, toolCalls: calls, content: content || null };
  } catch {
    // vLLM logs the exception and returns the whole text as content.
    return { toolsCalled: false, toolCalls: [], content: text };
  }
}

const NAME_RE = /^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"/;

/**
 * Streaming parsers, one token at a time, as vLLM's serving_chat drives them: the reasoning parser
 * until `</think>`, then (with tools) the hermes parser on the rest. Tool-call deltas: the first
 * carries id/type/index/name once the name is complete; the arguments follow in one fragment at
 * `</tool_call>`. Text between calls goes out as content (a real vLLM streaming quirk).
 */
export class StreamParser implements StreamingParser {
  private sawThinkStart = false;
  private reasoningEnded = false;
  private inCall = false;
  private callIndex = -1;
  private callText = "";
  private nameSent = false;
  private callName = "";
  /** Tool calls whose name was streamed (vLLM's prev_tool_call_arr): finish_reason "tool_calls". */
  toolsStreamed = 0;

  private readonly thinkStart: number | undefined;
  private readonly thinkEnd: number | undefined;
  private readonly toolStart: number | undefined;
  private readonly toolEnd: number | undefined;

  constructor(
    tok: SimTokenizer,
    private readonly reasoningParser: boolean,
    private readonly toolParser: boolean,
  ) {
    this.thinkStart = tok.tokenId(THINK_START);
    this.thinkEnd = tok.tokenId(THINK_END);
    this.toolStart = tok.tokenId(TOOL_START);
    this.toolEnd = tok.tokenId(TOOL_END);
  }

  push(id: number, delta: string): Delta | null {
    if (this.reasoningParser && !this.reasoningEnded) {
      if (!this.sawThinkStart) {
        if (id === this.thinkStart) {
          this.sawThinkStart = true;
          return null;
        }
        // The answer does not open with <think>: no reasoning in this output.
        this.reasoningEnded = true;
      } else {
        if (id === this.thinkEnd) {
          this.reasoningEnded = true;
          return null;
        }
        return { reasoning: delta };
      }
    }
    if (this.toolParser) return this.toolStep(id, delta);
    return { content: delta };
  }

  private toolStep(id: number, delta: string): Delta | null {
    if (id === this.toolStart) {
      this.inCall = true;
      this.callIndex++;
      this.callText = "";
      this.nameSent = false;
      return null;
    }
    if (!this.inCall) return { content: delta };
    if (id === this.toolEnd) {
      this.inCall = false;
      let args: string | undefined;
      let name: string | undefined;
      try {
        const obj = parsePyJson(this.callText);
        if (obj instanceof PyDict && typeof obj.get("name") === "string" && obj.get("arguments") !== undefined) {
          name = obj.get("name") as string;
          args = pyDumps(obj.get("arguments")!);
        }
      } catch {
        return null;
      }
      if (args === undefined || name === undefined) return null;
      if (!this.nameSent) {
        this.nameSent = true;
        this.toolsStreamed++;
        return { tool_calls: [{ id: makeToolCallId(), type: "function", index: this.callIndex, function: { name, arguments: args } }] };
      }
      return { tool_calls: [{ index: this.callIndex, function: { arguments: args } }] };
    }
    this.callText += delta;
    if (!this.nameSent) {
      const m = NAME_RE.exec(this.callText);
      if (m) {
        this.nameSent = true;
        this.toolsStreamed++;
        try {
          this.callName = JSON.parse(`"${m[1]}"`) as string;
        } catch {
          this.callName = m[1]!;
        }
        return { tool_calls: [{ id: makeToolCallId(), type: "function", index: this.callIndex, function: { name: this.callName } }] };
      }
    }
    return null;
  }
}

/** `--reasoning-parser qwen3` with `--tool-call-parser hermes` (either may be off). */
export function qwen3HermesParser(reasoning: boolean, tools: boolean): OutputParser {
  return {
    parse(text: string, _ids: readonly number[], req: ParseRequest) {
      const r = reasoning ? extractReasoning(text) : { reasoning: null, content: text };
      let content = r.content;
      let toolCalls: ParsedCall[] = [];
      let toolsCalled = false;
      if (tools && req.toolParsing) {
        const info = extractToolCalls(r.content ?? "");
        toolsCalled = info.toolsCalled;
        if (info.toolsCalled) {
          content = info.content;
          toolCalls = info.toolCalls;
        } else if (info.content) content = info.content;
      }
      return { reasoning: r.reasoning, content, toolCalls, toolsCalled };
    },
    stream: (req: ParseRequest) => new StreamParser(req.tok, reasoning, tools && req.toolParsing),
  };
}
