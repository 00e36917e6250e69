import { PyDict, PyFloat, PyInt, parsePyJson, pyDumps } from "@rollgate/pyjson";
import type { PyValue } from "@rollgate/pyjson";
import { stringEnd, valueEnd } from "./json-extent.js";
import type { SnapshotCall } from "./snapshot.js";
import type { ParsedCall } from "./types.js";

/**
 * vLLM's text tool parsers for the non-Qwen3 families, each as a non-streaming `parse` (what
 * `extract_tool_calls` returns) and a streaming `snapshot` (what the incremental parser has sent
 * once the text so far is in). Formats:
 *  - qwen3_coder: `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`,
 *    values converted by the tool's JSON schema type, arguments re-serialised with json.dumps;
 *  - llama3_json: `{"name": NAME, "parameters": {…}}` (or "arguments"), several joined by "; ",
 *    optionally after `<|python_tag|>`; arguments re-serialised; content is null when calls parse;
 *  - deepseek_v3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
 *  - deepseek_v31: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
 *    both DeepSeek parsers return the arguments text as the model wrote it.
 */

export interface ToolParse {
  toolsCalled: boolean;
  calls: ParsedCall[];
  content: string | null;
}

export interface ToolSnapshot {
  content: string;
  calls: SnapshotCall[];
}

export interface TextToolParser {
  parse(text: string, tools: readonly Record<string, unknown>[]): ToolParse;
  snapshot(text: string, final: boolean, tools: readonly Record<string, unknown>[]): ToolSnapshot;
  /** The first streamed delta of a call carries `arguments: ""`. */
  emptyArgsWithName: boolean;
  /** Streamed tool-call ids are the parser's own ("call_…") rather than vLLM's default. */
  ownIds: boolean;
}

const noCalls = (text: string): ToolParse => ({ toolsCalled: false, calls: [], content: text });

// ---------------------------------------------------------------- qwen3_coder

/** The `properties` of a tool's parameters schema (by function name), as vLLM's `_get_arguments_config`. */
function paramConfig(name: string, tools: readonly Record<string, unknown>[]): Record<string, unknown> {
  for (const t of tools) {
    const fn = t.function as Record<string, unknown> | undefined;
    if (t.type !== "function" || !fn || fn.name !== name) continue;
    const params = fn.parameters;
    if (params && typeof params === "object" && !Array.isArray(params)) {
      const props = (params as Record<string, unknown>).properties;
      return props && typeof props === "object" ? (props as Record<string, unknown>) : (params as Record<string, unknown>);
    }
    return {};
  }
  return {};
}

/** Python's float() of a parameter string, or NaN. */
function pyFloat(s: string): number {
  const t = s.trim();
  if (/^[+-]?(inf(inity)?|nan)$/i.test(t)) return /nan/i.test(t) ? NaN : t.startsWith("-") ? -Infinity : Infinity;
  return /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(t) ? Number(t) : NaN;
}

/** vLLM's `_convert_param_value`: the value by its schema type (string, int, number, bool, object/array). */
function convertParam(value: string, name: string, config: Record<string, unknown>): PyValue {
  if (value.toLowerCase() === "null") return null;
  if (!(name in config)) return value;
  const spec = config[name];
  const type = spec && typeof spec === "object" && "type" in spec ? String((spec as { type: unknown }).type).trim().toLowerCase() : "string";
  if (["string", "str", "text", "varchar", "char", "enum"].includes(type)) return value;
  if (/^(int|uint|long|short|unsigned)/.test(type)) return /^\s*[+-]?\d+\s*$/.test(value) ? new PyInt(String(BigInt(value.trim()))) : value;
  if (type.startsWith("num") || type.startsWith("float")) {
    const f = pyFloat(value);
    if (Number.isNaN(f) && !/nan/i.test(value)) return value;
    return Number.isInteger(f) ? new PyInt(String(f)) : new PyFloat(f);
  }
  if (["boolean", "bool", "binary"].includes(type)) return value.toLowerCase() === "true";
  try {
    return parsePyJson(value);
  } catch {
    return value;
  }
}

const PARAM_RE = /<parameter=([\s\S]*?)(?:<\/parameter>|(?=<parameter=)|(?=<\/function>)|$)/g;

/** One `<function=…` body (the text after `<function=`) as a call; vLLM strips one "\n" around each value. */
function coderCall(body: string, tools: readonly Record<string, unknown>[]): ParsedCall {
  const gt = body.indexOf(">");
  if (gt < 0) throw new Error("no > after the function name");
  const name = body.slice(0, gt);
  const config = paramConfig(name, tools);
  const entries: [string, PyValue][] = [];
  for (const m of body.slice(gt + 1).matchAll(PARAM_RE)) {
    const raw = m[1]!;
    const i = raw.indexOf(">");
    if (i < 0) throw new Error("no > after a parameter name");
    const pname = raw.slice(0, i);
    let value = raw.slice(i + 1);
    if (value.startsWith("\n")) value = value.slice(1);
    if (value.endsWith("\n")) value = value.slice(0, -1);
    const at = entries.findIndex(([k]) => k === pname);
    const v = convertParam(value, pname, config);
    if (at >= 0) entries[at] = [pname, v];
    else entries.push([pname, v]);
  }
  return { name, arguments: pyDumps(new PyDict(entries)) };
}

export const qwen3Coder: TextToolParser = {
  emptyArgsWithName: true,
  ownIds: true,
  parse(text, tools) {
    if (!text.includes("<function=")) return noCalls(text);
    try {
      const blocks = [...text.matchAll(/<tool_call>([\s\S]*?)<\/tool_call>|<tool_call>([\s\S]*?)$/g)].map((m) => m[1] ?? m[2] ?? "");
      const fns = (blocks.length > 0 ? blocks : [text]).flatMap((b) => [...b.matchAll(/<function=([\s\S]*?)<\/function>|<function=([\s\S]*)$/g)].map((m) => m[1] ?? m[2] ?? ""));
      if (fns.length === 0) return noCalls(text);
      const calls = fns.map((f) => coderCall(f, tools));
      const tc = text.indexOf("<tool_call>");
      const content = text.slice(0, tc >= 0 ? tc : text.indexOf("<function="));
      return { toolsCalled: true, calls, content: content || null };
    } catch {
      return noCalls(text);
    }
  },
  snapshot(text, final, tools) {
    const first = text.indexOf("<tool_call>");
    if (first < 0) return { content: text, calls: [] };
    const calls: SnapshotCall[] = [];
    for (const seg of text.slice(first).split("<tool_call>").slice(1)) {
      const f = seg.indexOf("<function=");
      const gt = f < 0 ? -1 : seg.indexOf(">", f);
      if (gt < 0) {
        calls.push({ name: null, args: "" });
        continue;
      }
      const name = seg.slice(f + "<function=".length, gt);
      const end = seg.indexOf("</function>");
      if (end >= 0 || (final && seg.includes("</tool_call>"))) {
        calls.push({ name, args: coderCall(seg.slice(f + "<function=".length, end >= 0 ? end : seg.indexOf("</tool_call>")), tools).arguments });
        continue;
      }
      // Parameters whose end is known (their close tag or the next parameter) stream as an unclosed object.
      const body = seg.slice(gt + 1);
      const done: string[] = [];
      const re = /<parameter=/g;
      const starts = [...body.matchAll(re)].map((m) => m.index);
      starts.forEach((s, k) => {
        const close = body.indexOf("</parameter>", s);
        const next = starts[k + 1];
        if (close >= 0 && (next === undefined || close < next)) done.push(body.slice(s, close + "</parameter>".length));
        else if (next !== undefined) done.push(body.slice(s, next));
      });
      const partial = done.length > 0 ? coderCall(`${name}>${done.join("")}`, tools).arguments.slice(0, -1) : "";
      calls.push({ name, args: partial });
    }
    return { content: text.slice(0, first), calls };
  },
};

// ---------------------------------------------------------------- llama3_json

const BOT = "<|python_tag|>";

/** Python's `json.JSONDecoder().raw_decode` at `from`: the value and where it ends. */
function rawDecode(text: string, from: number): { value: PyValue; end: number } {
  let depth = 0;
  let i = from;
  for (; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === "\\") i++;
    } else if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") {
      depth--;
      if (depth === 0) break;
    }
  }
  if (depth !== 0) throw new Error("unterminated JSON");
  return { value: parsePyJson(text.slice(from, i + 1)), end: i + 1 };
}

function llamaCall(obj: PyValue): ParsedCall {
  if (!(obj instanceof PyDict)) throw new Error("not an object");
  const name = obj.get("name");
  if (typeof name !== "string") throw new Error("no name");
  const args = obj.has("arguments") ? obj.get("arguments")! : obj.get("parameters");
  if (args === undefined) throw new Error("no arguments or parameters");
  return { name, arguments: pyDumps(args) };
}

/**
 * The arguments of an unfinished llama3_json call that later tokens cannot change, as the finished
 * call's arguments print them (`pyDumps`): the object's finished pairs, and a string value being
 * written so far (vLLM's llama3_json streams the JSON its partial parse makes of them, so a call cut
 * mid-arguments has streamed what it had); "" until the first pair has a value begun.
 */
function unfinishedArgs(raw: string): string {
  const entries: [string, PyValue][] = [];
  let partial: string | null = null;
  let closed = false;
  let i = raw.indexOf("{") === 0 ? 1 : -1;
  const ws = () => {
    while (i < raw.length && /\s/.test(raw[i]!)) i++;
  };
  while (i > 0) {
    ws();
    if (raw[i] === "}") {
      closed = true;
      break;
    }
    if (raw[i] !== '"') break;
    const keyEnd = stringEnd(raw, i);
    if (keyEnd < 0) break;
    const key = JSON.parse(raw.slice(i, keyEnd)) as string;
    i = keyEnd;
    ws();
    if (raw[i] !== ":") break;
    i++;
    ws();
    if (i >= raw.length) break;
    const end = valueEnd(raw, i);
    if (end < 0) {
      // A string being written: its text so far (an escape cut in half waits for its end).
      if (raw[i] === '"') partial = decodedPrefix(raw.slice(i + 1));
      if (partial !== null) entries.push([key, partial]);
      break;
    }
    entries.push([key, parsePyJson(raw.slice(i, end))]);
    i = end;
    ws();
    if (raw[i] === ",") i++;
  }
  if (entries.length === 0) return "";
  const dumped = pyDumps(new PyDict(entries));
  if (partial !== null) return dumped.slice(0, -2);
  return closed ? dumped : dumped.slice(0, -1);
}

/** The text of an unclosed JSON string's body written so far, without an escape cut in half or a lone high surrogate. */
function decodedPrefix(body: string): string | null {
  const cut = /\\(?:u[0-9a-fA-F]{0,3})?$/.exec(body.replace(/\\\\/g, "  "));
  const whole = cut ? body.slice(0, cut.index) : body;
  try {
    const text = JSON.parse(`"${whole}"`) as string;
    return /[\ud800-\udbff]$/.test(text) ? text.slice(0, -1) : text;
  } catch {
    return null;
  }
}

export const llama3Json: TextToolParser = {
  emptyArgsWithName: false,
  ownIds: false,
  parse(text) {
    if (!text.includes(BOT) && !text.includes("{")) return noCalls(text);
    const calls: ParsedCall[] = [];
    let end = -1;
    for (let at = text.indexOf("{"); at >= 0; at = text.indexOf("{", at + 1)) {
      if (at <= end) continue;
      try {
        const d = rawDecode(text, at);
        end = at + (d.end - at) - 1;
        calls.push(llamaCall(d.value));
      } catch {
        return noCalls(text);
      }
    }
    return calls.length > 0 ? { toolsCalled: true, calls, content: null } : noCalls(text);
  },
  snapshot(text) {
    if (!text.startsWith(BOT) && !text.startsWith("{")) return { content: text, calls: [] };
    const calls: SnapshotCall[] = [];
    let at = text.startsWith(BOT) ? BOT.length : 0;
    while (at < text.length) {
      const open = text.indexOf("{", at);
      if (open < 0) break;
      let d;
      try {
        d = rawDecode(text, open);
      } catch {
        // Incomplete: the name streams once it is complete, the arguments as far as they are sure.
        const m = /^\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"/.exec(text.slice(open));
        const a = m ? /^\s*,\s*"(?:parameters|arguments)"\s*:\s*/.exec(text.slice(open + m[0].length)) : null;
        const args = m && a ? unfinishedArgs(text.slice(open + m[0].length + a[0].length)) : "";
        calls.push({ name: m ? (JSON.parse(`"${m[1]}"`) as string) : null, args });
        break;
      }
      try {
        calls.push({ ...llamaCall(d.value), args: llamaCall(d.value).arguments });
      } catch {
        break;
      }
      at = d.end;
    }
    return { content: "", calls: calls.map((c) => ({ name: c.name, args: c.args })) };
  },
};

// ---------------------------------------------------------------- deepseek_v3 / deepseek_v31

const CALLS_BEGIN = "<｜tool▁calls▁begin｜>";
const CALL_BEGIN = "<｜tool▁call▁begin｜>";
const CALL_END = "<｜tool▁call▁end｜>";
const SEP = "<｜tool▁sep｜>";

/** `.` of Python's `re` without DOTALL: anything but a newline. */
const V3_CALL = /<｜tool▁call▁begin｜>(.*)<｜tool▁sep｜>(.*)\n```json\n(.*)\n```<｜tool▁call▁end｜>/g;
const V31_CALL = /<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>/g;

function deepseekParse(text: string, re: RegExp, call: (m: RegExpMatchArray) => ParsedCall): ToolParse {
  if (!text.includes(CALLS_BEGIN)) return noCalls(text);
  const calls = [...text.matchAll(re)].map(call);
  const content = text.slice(0, text.indexOf(CALLS_BEGIN));
  return { toolsCalled: true, calls, content: content || null };
}

function deepseekSnapshot(text: string, segment: (seg: string) => SnapshotCall): ToolSnapshot {
  const begin = text.indexOf(CALLS_BEGIN);
  if (begin < 0) return { content: text, calls: [] };
  const calls = text
    .slice(begin)
    .split(CALL_BEGIN)
    .slice(1)
    .map((seg) => segment(seg.split(CALL_END)[0]!));
  return { content: text.slice(0, begin), calls };
}

export const deepseekV3: TextToolParser = {
  emptyArgsWithName: false,
  ownIds: false,
  parse: (text) => deepseekParse(text, V3_CALL, (m) => ({ name: m[2]!, arguments: m[3]! })),
  snapshot: (text) =>
    deepseekSnapshot(text, (seg) => {
      const sep = seg.indexOf(SEP);
      const nl = sep < 0 ? -1 : seg.indexOf("\n", sep);
      if (nl < 0) return { name: null, args: "" };
      const name = seg.slice(sep + SEP.length, nl);
      const fence = "\n```json\n";
      const body = seg.slice(nl).startsWith(fence) ? seg.slice(nl + fence.length) : "";
      const close = body.indexOf("\n```");
      // Hold back what may be the start of the closing fence.
      const args = close >= 0 ? body.slice(0, close) : body.replace(/\n`{0,2}$/, "");
      return { name, args };
    }),
};

export const deepseekV31: TextToolParser = {
  emptyArgsWithName: false,
  ownIds: false,
  parse: (text) => deepseekParse(text, V31_CALL, (m) => ({ name: m[1]!, arguments: m[2]! })),
  snapshot: (text) =>
    deepseekSnapshot(text, (seg) => {
      const sep = seg.indexOf(SEP);
      if (sep < 0) return { name: null, args: "" };
      return { name: seg.slice(0, sep), args: seg.slice(sep + SEP.length) };
    }),
};
