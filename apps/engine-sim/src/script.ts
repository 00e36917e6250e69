import { PyDict, PyFloat, PyInt, PyJsonError, parsePyJson } from "@rollgate/pyjson";
import type { PyValue } from "@rollgate/pyjson";
import type { Family } from "./families/types.js";
import { contentText } from "./template.js";

/**
 * The `#sim:` scripted policy. A line `#sim: [STEP, …]` in a user or system message is a
 * script; the k-th assistant answer after the message that holds it plays STEP[k] (k = number of
 * assistant messages after that message); past the end the model answers "done". When several
 * messages hold a script, the latest one wins (a new user turn can start a new script).
 */

export interface SimToolCall {
  name: string;
  /** Kept with Python semantics so the emitted JSON keeps `1.0`, key order, big ints. */
  arguments: PyValue;
}

export interface SimStep {
  text?: string;
  think?: string;
  tool_calls?: SimToolCall[];
  finish?: "stop" | "length";
  tokens?: number;
}

export class ScriptError extends Error {}

const SCRIPT_LINE = /^[ \t]*#sim:[ \t]*(\[.*\])[ \t]*$/m;
const STEP_KEYS = new Set(["text", "think", "tool_calls", "finish", "tokens"]);

function parseStep(v: PyValue, k: number): SimStep {
  if (!(v instanceof PyDict)) throw new ScriptError(`step ${k} must be an object`);
  const step: SimStep = {};
  for (const [key, x] of v.entries) {
    if (!STEP_KEYS.has(key)) throw new ScriptError(`step ${k}: unknown key "${key}"`);
    if (key === "text" || key === "think") {
      if (typeof x !== "string") throw new ScriptError(`step ${k}: "${key}" must be a string`);
      step[key] = x;
    } else if (key === "finish") {
      if (x !== "stop" && x !== "length") throw new ScriptError(`step ${k}: "finish" must be "stop" or "length"`);
      step.finish = x;
    } else if (key === "tokens") {
      const n = x instanceof PyInt ? Number(x.digits) : x instanceof PyFloat ? x.value : NaN;
      if (!Number.isInteger(n) || n < 1) throw new ScriptError(`step ${k}: "tokens" must be a positive integer`);
      step.tokens = n;
    } else {
      if (!Array.isArray(x)) throw new ScriptError(`step ${k}: "tool_calls" must be an array`);
      step.tool_calls = x.map((c, j) => {
        if (!(c instanceof PyDict) || typeof c.get("name") !== "string") throw new ScriptError(`step ${k}: tool_calls[${j}].name must be a string`);
        const args = c.get("arguments") ?? new PyDict([]);
        if (!(args instanceof PyDict)) throw new ScriptError(`step ${k}: tool_calls[${j}].arguments must be an object`);
        return { name: c.get("name") as string, arguments: args };
      });
    }
  }
  return step;
}

/** Parses the JSON array after `#sim:`. */
export function parseScript(json: string): SimStep[] {
  let v: PyValue;
  try {
    v = parsePyJson(json);
  } catch (e) {
    if (e instanceof PyJsonError) throw new ScriptError(`not valid JSON: ${e.message}`);
    throw e;
  }
  if (!Array.isArray(v)) throw new ScriptError("a script must be a JSON array of steps");
  return v.map(parseStep);
}

/** Finds the script in a conversation and the step the next answer plays (null: no script). */
export function findScriptStep(messages: readonly unknown[]): { step: SimStep | null; index: number } | null {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as { role?: unknown; content?: unknown } | null;
    if (!m || (m.role !== "user" && m.role !== "system")) continue;
    let text: string;
    try {
      text = contentText(m.content);
    } catch {
      continue;
    }
    const match = SCRIPT_LINE.exec(text);
    if (!match) continue;
    let steps: SimStep[];
    try {
      steps = parseScript(match[1]!);
    } catch (e) {
      throw new ScriptError(`invalid #sim script in messages[${i}]: ${(e as Error).message}`);
    }
    let k = 0;
    for (let j = i + 1; j < messages.length; j++) if ((messages[j] as { role?: unknown } | null)?.role === "assistant") k++;
    return { step: steps[k] ?? null, index: k };
  }
  return null;
}

/** The end of the JSON array starting at `from` (index after its `]`), or -1; strings are skipped. */
function arrayEnd(text: string, from: number): number {
  let depth = 0;
  for (let i = from; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === "\\") i++;
    } else if (c === "[" || c === "{") depth++;
    else if (c === "]" || c === "}") {
      depth--;
      if (depth === 0) return i + 1;
    } else if (c === "\n") return -1;
  }
  return -1;
}

/** `#sim:` at a line start or right after a special token (rendered prompts glue turns together). */
const SCRIPT_MARK = /(?:^|\n|\|>|｜>)[ \t]*#sim:[ \t]*(?=\[)/g;

/**
 * The script in a raw prompt (completions, /generate): the last `#sim:` line, and as step the number
 * of finished assistant answers after it, counted with the family's turn markers, so a rendered
 * chat prompt plays the same step as the chat route would.
 */
export function findScriptInText(text: string, family: Pick<Family, "countAnswers">): { step: SimStep | null; index: number } | null {
  let json: string | undefined;
  let end = -1;
  for (const m of text.matchAll(SCRIPT_MARK)) {
    const from = m.index + m[0].length;
    const e = arrayEnd(text, from);
    if (e < 0) continue;
    // After the array: the end of the line, or a special token (the turn's end marker).
    if (!/^[ \t]*(?:$|\n|<)/.test(text.slice(e, e + 64))) continue;
    json = text.slice(from, e);
    end = e;
  }
  if (json === undefined) return null;
  let steps: SimStep[];
  try {
    steps = parseScript(json);
  } catch (e) {
    throw new ScriptError(`invalid #sim script in the prompt: ${(e as Error).message}`);
  }
  const k = family.countAnswers(text.slice(end));
  return { step: steps[k] ?? null, index: k };
}
