import { PyDict, pyDumps, pyStrValue } from "@rollgate/pyjson";
import type { PyValue } from "@rollgate/pyjson";
import type { SimStep } from "../script.js";
import { bundledTemplate } from "./bundled.js";
import { countChatmlAnswers, openChatmlAnswer } from "./chatml.js";
import { QWEN3_TOKENIZER_PACKAGE, qwen3 } from "./qwen3.js";
import type { Family } from "./types.js";

/**
 * Qwen3-Coder: the Qwen3 tokenizer and ChatML turns, no reasoning, and XML tool calls
 *   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>
 * after the answer's text and a blank line. Values print as the template prints them (strings
 * verbatim, objects and lists as JSON, other values as Python's str(): True, 1.0, None).
 * Served as `vllm serve Qwen/Qwen3-Coder-30B-A3B-Instruct --tool-call-parser qwen3_coder`.
 */

/** A value as the Qwen3-Coder template prints it: JSON for objects and lists, Python str() otherwise. */
export function coderValue(v: PyValue): string {
  return v instanceof PyDict || Array.isArray(v) ? pyDumps(v) : pyStrValue(v);
}

function callText(c: { name: string; arguments: PyValue }): string {
  const args = c.arguments instanceof PyDict ? c.arguments.entries : [];
  return `<tool_call>\n<function=${c.name}>\n${args.map(([k, v]) => `<parameter=${k}>\n${coderValue(v)}\n</parameter>\n`).join("")}</function>\n</tool_call>`;
}

function write(step: SimStep): string {
  const text = step.text ?? "";
  const calls = step.tool_calls ?? [];
  if (calls.length === 0) return text;
  // The template renders a call turn as "assistant" + ("\n" + text.trim() + "\n") + "\n<tool_call>…".
  return (text.trim() ? `${text.trim()}\n\n` : "") + calls.map(callText).join("\n");
}

type Extras = { key: string; text: string }[];

function extras(d: unknown, handled: string[]): Extras {
  if (!(d instanceof PyDict)) return [];
  return d.entries.filter(([k]) => !handled.includes(k)).map(([key, v]) => ({ key, text: coderValue(v) }));
}

/** Tools with the fields the bundled template prints, rendered with Python semantics. */
function feedTools(tools: Record<string, unknown>[], pyTools: unknown[]): Record<string, unknown>[] {
  return tools.map((t, i) => {
    const py = pyTools[i] as PyDict;
    const fn = py.get("function") as PyDict;
    const params = fn.get("parameters");
    const props = params instanceof PyDict ? params.get("properties") : undefined;
    const simParams =
      props instanceof PyDict
        ? props.entries.map(([name, f]) => ({
            name,
            type: f instanceof PyDict && f.has("type") ? pyStrValue(f.get("type")!) : null,
            description: f instanceof PyDict && f.has("description") ? pyStrValue(f.get("description")!).trim() : null,
            extras: extras(f, ["name", "type", "description"]),
          }))
        : [];
    const desc = fn.has("description") ? fn.get("description")! : null;
    return {
      ...t,
      function: {
        ...(t.function as Record<string, unknown>),
        sim_description: desc === null ? null : pyStrValue(desc).trim(),
        sim_params: simParams,
        sim_param_extras: extras(params, ["type", "properties"]),
        sim_extras: extras(fn, ["type", "name", "description", "parameters"]),
      },
    };
  });
}

/** Assistant calls' arguments as the template prints them, keys in the order written. */
function feedMessages(messages: Record<string, unknown>[]): Record<string, unknown>[] {
  return messages.map((m) => {
    if (!Array.isArray(m.tool_calls)) return m;
    return {
      ...m,
      tool_calls: m.tool_calls.map((tc: { function: { arguments: unknown } }) => {
        const args = tc.function.arguments;
        const py = args instanceof PyDict ? args : null;
        return { ...tc, function: { ...tc.function, sim_args: py ? py.entries.map(([name, v]) => ({ name, text: coderValue(v) })) : [] } };
      }),
    };
  });
}

export const qwen3Coder: Family = {
  name: "qwen3-coder",
  defaultModel: "Qwen/Qwen3-Coder-30B-A3B-Instruct",
  modelType: "qwen3_moe",
  architectures: ["Qwen3MoeForCausalLM"],
  defaultMaxModelLen: 262144,
  tokenizerKey: QWEN3_TOKENIZER_PACKAGE,
  tokenizerFiles: qwen3.tokenizerFiles,
  bundledTemplate: bundledTemplate("qwen3-coder"),
  toolParser: "qwen3_coder",
  reasoningParser: null,
  argumentsAs: "python",
  feed: () => ({ vars: {}, messages: feedMessages, tools: feedTools }),
  eosToken: "<|im_end|>",
  extraStopTokens: ["<|endoftext|>"],
  // Qwen3-Coder does not think: a step's "think" is not written.
  write: (step) => ({ text: write(step), end: "<|im_end|>" }),
  writeWords: (words) => ({ text: words, end: "<|im_end|>" }),
  countAnswers: countChatmlAnswers,
  openAnswer: openChatmlAnswer,
};
