import { PyDict, PyJsonError, parsePyJson, pyDumps, pyStr } from "@rollgate/pyjson";
import type { PyValue } from "@rollgate/pyjson";
import { stringEnd, valueEnd } from "./output/json-extent.js";
import type { Delta, DeltaToolCall, ParsedCall, StreamingParser } from "./output/types.js";
import { ScriptError } from "./script.js";
import type { SimStep } from "./script.js";

/**
 * A forced tool choice (`tool_choice: "required"` or a named function), answered as vLLM and SGLang
 * answer it on the chat route: guided decoding (a JSON schema) makes the model write bare JSON
 * instead of its family's tool-call markup, and the server builds `tool_calls` from that JSON itself,
 * without the tool parser. The reasoning parser still runs first (the grammar starts after the
 * reasoning ends), so a thinking model thinks, then writes the JSON.
 *
 *  - vLLM, named function: the schema is the function's parameters, so the model writes just the
 *    arguments object; the call is `{name: the named function, arguments: that text}`.
 *  - vLLM, required; SGLang, required or named: the schema is an array (at least one item) of
 *    `{"name": …, "parameters": …}` objects; each call's arguments are `json.dumps(parameters,
 *    ensure_ascii=False)`.
 *
 * finish_reason: vLLM says "tool_calls" for required and "stop" for a named function (its rule since
 * PR #25054, as OpenAI does), streamed and not; SGLang says "tool_calls" whenever it built a call.
 *
 * The harmony family (gpt-oss) is not guided this way: vLLM constrains it with a harmony structural
 * tag, so its output stays in harmony markup and the harmony parser reads it (as for "auto").
 */

export type ForcedChoice = { kind: "required" } | { kind: "named"; name: string };

/** The forced choice of a request, or null ("auto", "none", no tools, or the harmony family). */
export function forcedChoice(toolChoice: unknown, tools: readonly Record<string, unknown>[] | null | undefined, harmony: boolean): ForcedChoice | null {
  if (!tools || tools.length === 0 || harmony) return null;
  if (toolChoice === "required") return { kind: "required" };
  if (toolChoice && typeof toolChoice === "object") {
    const fn = (toolChoice as { function?: { name?: unknown } }).function;
    if (fn && typeof fn.name === "string") {
      const names = tools.map((t) => (t.function as { name?: unknown } | undefined)?.name);
      if (!names.includes(fn.name)) throw new GuidedError(`Tool '${fn.name}' has not been passed in \`tools\`.`);
      return { kind: "named", name: fn.name };
    }
  }
  return null;
}

/** A request the server refuses (400). */
export class GuidedError extends Error {}

/** Does the answer's JSON hold only the named function's arguments (vLLM named), or an array of calls? */
const argsOnly = (forced: ForcedChoice, sglang: boolean) => forced.kind === "named" && !sglang;

/**
 * The step as the model writes it under guided decoding: its reasoning (when the family thinks), then
 * the JSON of its calls as its text. A step the grammar cannot produce is a ScriptError.
 */
export function guidedStep(step: SimStep | null, forced: ForcedChoice, sglang: boolean): SimStep {
  const what = forced.kind === "required" ? 'tool_choice "required"' : `tool_choice naming "${forced.name}"`;
  const calls = step?.tool_calls ?? [];
  if (!step || calls.length === 0) throw new ScriptError(`with ${what} the model can only write tool calls (guided decoding): the step needs "tool_calls"`);
  if (step?.text !== undefined) throw new ScriptError(`with ${what} the model writes only the calls' JSON (guided decoding): the step cannot have "text"`);
  if (step.tokens !== undefined) throw new ScriptError(`with ${what} a step cannot set "tokens" (the padding would break the guided JSON)`);
  if (forced.kind === "named") {
    const other = calls.find((c) => c.name !== forced.name);
    if (other) throw new ScriptError(`with ${what} the model cannot call "${other.name}"`);
  }
  let json: string;
  if (argsOnly(forced, sglang)) {
    if (calls.length > 1) throw new ScriptError(`with ${what} vLLM's guided JSON is one arguments object: the step can have one call`);
    json = pyDumps(calls[0]!.arguments);
  } else {
    json = `[${calls.map((c) => `{"name": ${pyStr(c.name)}, "parameters": ${pyDumps(c.arguments)}}`).join(", ")}]`;
  }
  const out: SimStep = { text: json };
  if (step.think !== undefined) out.think = step.think;
  if (step.finish !== undefined) out.finish = step.finish;
  return out;
}

/** The calls the server builds from the answer's JSON (after the reasoning), or null when it does not parse. */
export function guidedCalls(content: string, forced: ForcedChoice, sglang: boolean): ParsedCall[] | null {
  // The text after the reasoning may start with the blank line the family writes after it: the JSON starts after it.
  if (argsOnly(forced, sglang)) return [{ name: (forced as { name: string }).name, arguments: content.trimStart() }];
  let v: PyValue;
  try {
    v = parsePyJson(content);
  } catch (e) {
    if (e instanceof PyJsonError) return null;
    throw e;
  }
  if (!Array.isArray(v)) return null;
  const calls: ParsedCall[] = [];
  for (const item of v) {
    if (!(item instanceof PyDict) || typeof item.get("name") !== "string") return null;
    calls.push({ name: item.get("name") as string, arguments: pyDumps(item.get("parameters") ?? null) });
  }
  return calls;
}

interface PartialCall {
  name: string;
  /** The arguments text so far (a prefix of the final one). */
  args: string;
}

/**
 * The calls an array of `{"name": …, "parameters": …}` written so far shows: a call appears once its
 * name is complete and its parameters have begun (as vLLM's streaming for "required" sends it), with
 * the parameters' text so far.
 */
function partialArray(s: string): PartialCall[] {
  const calls: PartialCall[] = [];
  const re = /\{\s*"name"\s*:\s*/g;
  re.lastIndex = s.indexOf("[") + 1;
  if (re.lastIndex === 0) return calls;
  for (;;) {
    const m = re.exec(s);
    if (!m) break;
    const nameAt = m.index + m[0].length;
    const nameEnd = stringEnd(s, nameAt);
    if (nameEnd < 0) break;
    const p = /^\s*,\s*"parameters"\s*:\s*/.exec(s.slice(nameEnd));
    if (!p) break;
    const argsAt = nameEnd + p[0].length;
    if (argsAt >= s.length) break;
    const name = JSON.parse(s.slice(nameAt, nameEnd)) as string;
    const end = valueEnd(s, argsAt);
    calls.push({ name, args: s.slice(argsAt, end < 0 ? s.length : end) });
    if (end < 0) break;
    re.lastIndex = end;
  }
  return calls;
}

/**
 * The streaming side: the family's parser with tool parsing off splits reasoning from the rest, and
 * the rest (the guided JSON) streams as tool-call deltas: the name in the first (vLLM named: beside
 * the first piece of the arguments), then the arguments piece by piece.
 */
export class GuidedStreamer implements StreamingParser {
  private json = "";
  private readonly sentArgs: number[] = [];
  toolsStreamed = 0;

  constructor(
    private readonly inner: StreamingParser,
    private readonly forced: ForcedChoice,
    private readonly sglang: boolean,
    private readonly makeId: () => string,
  ) {}

  push(id: number, deltaText: string, isLast: boolean): Delta | null {
    const d = this.inner.push(id, deltaText, isLast);
    const out: Delta = {};
    if (d?.reasoning !== undefined) out.reasoning = d.reasoning;
    if (d?.content) this.json = (this.json + d.content).trimStart();
    const calls: PartialCall[] = argsOnly(this.forced, this.sglang)
      ? this.json.length > 0
        ? [{ name: (this.forced as { name: string }).name, args: this.json }]
        : []
      : partialArray(this.json);
    const deltas: DeltaToolCall[] = [];
    calls.forEach((c, index) => {
      const sent = this.sentArgs[index];
      if (sent === undefined) {
        this.sentArgs[index] = c.args.length;
        this.toolsStreamed++;
        deltas.push({ id: this.makeId(), type: "function", index, function: { name: c.name, arguments: c.args } });
      } else if (c.args.length > sent) {
        this.sentArgs[index] = c.args.length;
        deltas.push({ index, function: { arguments: c.args.slice(sent) } });
      }
    });
    if (deltas.length > 0) out.tool_calls = deltas;
    return Object.keys(out).length > 0 ? out : null;
  }
}
