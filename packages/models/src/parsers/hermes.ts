import { randomBytes } from "node:crypto";
import { PyDict, parsePyJson, pyDumps, valueEnd } from "@rollgate/pyjson";
import type { GatewayParser, OutputParser, ParsedDelta } from "./types.js";

/**
 * What vLLM's `--tool-call-parser hermes` (and, for the `qwen3` parser, `--reasoning-parser qwen3`)
 * make of a Qwen model's generated text:
 *
 * - reasoning (qwen3 only): an answer that opens with `<think>` has its reasoning up to `</think>`,
 *   kept raw (newlines included); the content is what follows. An answer cut inside its reasoning
 *   keeps what came as reasoning (vLLM's streaming behaviour).
 * - tools (only when the request has tools and tool_choice is not "none", as in vLLM): each
 *   `<tool_call>{json}</tool_call>` becomes a call named `name` with `arguments` re-serialised as
 *   Python's `json.dumps(arguments, ensure_ascii=False)` (a string stays a JSON string: vLLM
 *   dumps whatever the model wrote), under a fresh `chatcmpl-tool-<hex>` id; the content is the
 *   text outside the calls, before, between and after them, as vLLM's streaming parser gives it
 *   (null when empty). The gateway reads the engine's chat route as a stream, so a call the model
 *   broke reads as that route gives it too: one whose JSON does not parse, or that was cut before
 *   its `</tool_call>` (max_tokens), is a call as soon as its name is readable, with its arguments
 *   as written (up to where their value ends, or all that came); one whose name never became
 *   readable is dropped, text and all, as vLLM's streaming parser drops it.
 *
 * Streaming holds back only what could be the start of a tag, and emits a tool call once its
 * `</tool_call>` closes (name and arguments in one delta).
 */

const THINK_START = "<think>";
const THINK_END = "</think>";
const TOOL_START = "<tool_call>";
const TOOL_END = "</tool_call>";

/** vLLM's `make_tool_call_id()`: "chatcmpl-tool-" + uuid4 hex. */
export function makeToolCallId(): string {
  return `chatcmpl-tool-${randomBytes(16).toString("hex")}`;
}

type Phase = "start" | "reasoning" | "content" | "calls";

/** Length of the longest suffix of `text` that is a proper prefix of `tag` (what to hold back). */
function partialTag(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) if (text.endsWith(tag.slice(0, n))) return n;
  return 0;
}

/** The call object up to its name, and up to where its arguments value begins (vLLM's streaming parser reads these as they come). */
const NAME_RE = /^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"/;
const ARGS_AT_RE = /^\s*\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"arguments"\s*:\s*/;
/** An arguments object whose first key has a value begun: until then a cut call has streamed no arguments. */
const ARGS_BEGUN_RE = /^\{\s*"(?:[^"\\]|\\.)*"\s*:\s*\S/;

/**
 * One `<tool_call>` body → a call, or null when the engine's streamed route gives none: a whole
 * call as vLLM's hermes parser re-serialises it; a broken or cut one (`closed`: its `</tool_call>`
 * came) as that route streamed it: its name, and its arguments as the model wrote them.
 */
function parseCall(body: string, closed: boolean): { name: string; arguments: string } | null {
  try {
    const obj = parsePyJson(body.trim());
    if (obj instanceof PyDict) {
      const name = obj.get("name");
      const args = obj.get("arguments");
      if (typeof name === "string" && args !== undefined) return { name, arguments: pyDumps(args) };
    }
  } catch {
    // not whole JSON: read as it was streamed, below
  }
  const named = NAME_RE.exec(body);
  if (!named) return null;
  let name: string;
  try {
    name = JSON.parse(`"${named[1]}"`) as string;
  } catch {
    name = named[1]!;
  }
  return { name, arguments: writtenArguments(body, closed) };
}

/** A broken call's arguments as written: up to where their value ends, else all that came. */
function writtenArguments(body: string, closed: boolean): string {
  const at = ARGS_AT_RE.exec(body);
  if (!at || at[0].length >= body.length) return "";
  const end = valueEnd(body, at[0].length);
  const written = body.slice(at[0].length, end < 0 ? undefined : end);
  return end < 0 && !closed && !ARGS_BEGUN_RE.test(written) ? "" : written;
}

export class HermesOutputParser implements OutputParser {
  private phase: Phase;
  private pending = "";
  private calls = 0;

  constructor(
    private readonly parseTools: boolean,
    private readonly newId: () => string = makeToolCallId,
    /** Whether an opening `<think>` starts reasoning (Qwen3's reasoning parser). */
    reasoning = true,
  ) {
    this.phase = reasoning ? "start" : "content";
  }

  get toolCalls(): number {
    return this.calls;
  }

  push(text: string): ParsedDelta | null {
    this.pending += text;
    const out: ParsedDelta = {};
    for (;;) {
      const p = this.pending;
      if (this.phase === "start") {
        if (p.startsWith(THINK_START)) {
          this.phase = "reasoning";
          this.pending = p.slice(THINK_START.length);
          continue;
        }
        if (THINK_START.startsWith(p)) break; // "" or a piece of "<think>": wait
        this.phase = "content";
        continue;
      }
      if (this.phase === "reasoning") {
        const end = p.indexOf(THINK_END);
        if (end >= 0) {
          add(out, "reasoning", p.slice(0, end));
          this.pending = p.slice(end + THINK_END.length);
          this.phase = "content";
          continue;
        }
        const hold = partialTag(p, THINK_END);
        add(out, "reasoning", p.slice(0, p.length - hold));
        this.pending = p.slice(p.length - hold);
        break;
      }
      if (this.phase === "content") {
        if (!this.parseTools) {
          add(out, "content", p);
          this.pending = "";
          break;
        }
        const at = p.indexOf(TOOL_START);
        if (at >= 0) {
          add(out, "content", p.slice(0, at));
          this.pending = p.slice(at);
          this.phase = "calls";
          continue;
        }
        const hold = partialTag(p, TOOL_START);
        add(out, "content", p.slice(0, p.length - hold));
        this.pending = p.slice(p.length - hold);
        break;
      }
      // calls: complete <tool_call>…</tool_call> blocks become calls; text between and after them is
      // content, as vLLM's streaming hermes parser gives it (and so the engine's chat route, read as a stream).
      const start = p.indexOf(TOOL_START);
      if (start < 0) {
        const hold = partialTag(p, TOOL_START);
        add(out, "content", p.slice(0, p.length - hold));
        this.pending = p.slice(p.length - hold);
        break;
      }
      add(out, "content", p.slice(0, start));
      const end = p.indexOf(TOOL_END, start);
      if (end < 0) {
        this.pending = p.slice(start);
        break;
      }
      this.emitCall(out, p.slice(start + TOOL_START.length, end), true);
      this.pending = p.slice(end + TOOL_END.length);
    }
    return nonEmpty(out);
  }

  end(): ParsedDelta | null {
    const out: ParsedDelta = {};
    const p = this.pending;
    this.pending = "";
    if (this.phase === "start" || this.phase === "content") add(out, "content", p);
    else if (this.phase === "reasoning") add(out, "reasoning", p);
    else if (p.startsWith(TOOL_START)) {
      // A call the answer ended inside (cut by max_tokens, or no </tool_call>): a call if its name came.
      this.emitCall(out, p.slice(TOOL_START.length), false);
    } else add(out, "content", p); // a held piece of "<tool_call>" that never became one
    return nonEmpty(out);
  }

  private emitCall(out: ParsedDelta, body: string, closed: boolean): void {
    const call = parseCall(body, closed);
    if (!call) return;
    (out.tool_calls ??= []).push({ index: this.calls++, id: this.newId(), type: "function", function: call });
  }
}

function add(out: ParsedDelta, key: "content" | "reasoning", text: string): void {
  if (text === "") return;
  out[key] = (out[key] ?? "") + text;
}

function nonEmpty(d: ParsedDelta): ParsedDelta | null {
  return d.content !== undefined || d.reasoning !== undefined || d.tool_calls !== undefined ? d : null;
}

/** Qwen's end-of-turn tokens (ChatML's and the base model's). */
const QWEN_END_TOKENS = ["<|im_end|>", "<|endoftext|>"] as const;

/** vLLM `--reasoning-parser qwen3 --tool-call-parser hermes`. */
export const qwen3Parser: GatewayParser = {
  name: "qwen3",
  create: (parseTools, newId) => new HermesOutputParser(parseTools, newId, true),
  endTokens: QWEN_END_TOKENS,
};

/** vLLM `--tool-call-parser hermes` without a reasoning parser (Qwen2.5). */
export const hermesParser: GatewayParser = {
  name: "hermes",
  create: (parseTools, newId) => new HermesOutputParser(parseTools, newId, false),
  endTokens: QWEN_END_TOKENS,
};
