import { randomBytes } from "node:crypto";
import { PyDict, parsePyJson, pyDumps } from "@rollgate/pyjson";
import type { SimTokenizer } from "../tokenizer.js";
import { valueEnd } from "./json-extent.js";
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
/** The call object up to where its arguments value begins. */
const ARGS_AT_RE = /^\s*\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"arguments"\s*:\s*/;
/** An arguments object whose first key has a value begun: vLLM's partial JSON parse first yields arguments then. */
const ARGS_BEGUN_RE = /^\{\s*"(?:[^"\\]|\\.)*"\s*:\s*\S/;

/**
 * Streaming parsers, one token at a time, as vLLM's serving_chat drives them: the reasoning parser
 * until `</think>`, then (with tools) the hermes parser on the rest. Tool-call deltas: the first
 * carries id/type/index/name once the name is complete; the arguments follow as the model writes
 * them, from when their first key has a value begun, token by token, ending with the arguments
 * value's own end (the call object's closing brace is not part of them). They are the model's text,
 * not a parse: a call whose JSON is malformed, or cut by max_tokens, has streamed the arguments it
 * had (vLLM does the same; its non-streamed answer then has no call, only content). Not kept from
 * vLLM: it drops a `}` ending any token inside the call, so arguments ending in a nested object
 * whose closing braces are separate tokens lose one; here they are whole. Text between calls goes
 * out as content (a real vLLM streaming quirk).
 */
export class StreamParser implements StreamingParser {
  private sawThinkStart = false;
  private reasoningEnded = false;
  private inCall = false;
  private callIndex = -1;
  private callText = "";
  private nameSent = false;
  private callName = "";
  /** Where the arguments value begins in `callText` (-1: not written yet), and how much of it went out. */
  private argsAt = -1;
  private argsSent = 0;
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
      this.argsAt = -1;
      this.argsSent = 0;
      return null;
    }
    if (!this.inCall) return { content: delta };
    if (id === this.toolEnd) {
      this.inCall = false;
      // The name went out: what is left of the arguments as written, whole or not (a malformed call too).
      if (this.nameSent) {
        const more = this.argsPiece(true);
        return more ? { tool_calls: [{ index: this.callIndex, function: { arguments: more } }] } : null;
      }
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
      // The whole call came with its end: name and arguments in one delta.
      this.nameSent = true;
      this.toolsStreamed++;
      return { tool_calls: [{ id: makeToolCallId(), type: "function", index: this.callIndex, function: { name, arguments: args } }] };
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
      return null;
    }
    const more = this.argsPiece(false);
    return more ? { tool_calls: [{ index: this.callIndex, function: { arguments: more } }] } : null;
  }

  /**
   * The arguments text written since the last piece: up to the end of the arguments value once it
   * is complete, else all of it. Nothing until the first key has a value begun (or, `closing`, the
   * call's end came), and nothing once the value is complete and sent.
   */
  private argsPiece(closing: boolean): string {
    if (this.argsAt < 0) {
      const m = ARGS_AT_RE.exec(this.callText);
      if (!m || m[0].length >= this.callText.length) return "";
      this.argsAt = m[0].length;
    }
    const end = valueEnd(this.callText, this.argsAt);
    const written = this.callText.slice(this.argsAt, end < 0 ? undefined : end);
    if (this.argsSent === 0 && end < 0 && !closing && !ARGS_BEGUN_RE.test(written)) return "";
    const more = written.slice(this.argsSent);
    this.argsSent = written.length;
    return more;
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
