import { pyDumps } from "./pyjson.js";
import type { SimStep } from "./script.js";
import { IM_END_ID, IM_START_ID } from "./tokenizer.js";
import type { SimTokenizer } from "./tokenizer.js";
import { fnv1a, hashIds, mix32 } from "./hash.js";
import { findScriptInText } from "./script.js";

/**
 * What the simulated model generates: the scripted step or seeded random text, as the real Qwen3
 * token ids of the emitted text (so a trajectory decodes back exactly), ending with `<|im_end|>`
 * when the answer stops naturally. Request limits (max_tokens, stop) are applied later.
 */

export interface PolicyOutput {
  ids: number[];
  /** "length" when the policy itself cut the answer (script `finish: "length"` or `tokens` overflow). */
  finish: "stop" | "length";
}

/** The exact text Qwen3 writes for a step (DESIGN §7), without the trailing `<|im_end|>`. */
export function stepText(step: SimStep): string {
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

/** Pads `step.text` with " ok" filler until the answer is exactly `target` tokens (im_end included when natural). */
function padStep(step: SimStep, target: number, natural: boolean, tok: SimTokenizer): number[] {
  const extra = natural ? 1 : 0;
  let fill = target - (tok.encode(stepText(step)).length + extra);
  let ids: number[] = [];
  for (let attempt = 0; attempt < 6 && fill > 0; attempt++) {
    const text = step.text ?? "";
    const filler = (text ? " ok" : "ok") + " ok".repeat(fill - 1);
    ids = tok.encode(stepText({ ...step, text: text + filler }));
    const diff = target - (ids.length + extra);
    if (diff === 0) break;
    fill += diff;
  }
  return ids;
}

export function scriptedOutput(step: SimStep | null, tok: SimTokenizer): PolicyOutput {
  const s: SimStep = step ?? { text: "done" };
  const cut = s.finish === "length";
  let ids = tok.encode(stepText(s));
  if (!cut) ids.push(IM_END_ID);
  if (s.tokens !== undefined && ids.length < s.tokens) {
    ids = padStep(s, s.tokens, !cut, tok);
    if (!cut) ids.push(IM_END_ID);
  }
  if (s.tokens !== undefined && ids.length > s.tokens) return { ids: ids.slice(0, s.tokens), finish: "length" };
  return { ids, finish: cut ? "length" : "stop" };
}

const WORDS = (
  "the a model answer is of to and in that it for on with as was at by this be from or which an are " +
  "simple result value test data code file line step time state rank token text order list set case " +
  "run call read write check make take give find keep show start stop open close build move turn"
).split(" ");

let oneTokenWords: string[] | undefined;
/** Words that are one token both at the start and after a space, so N words are N tokens. */
function words(tok: SimTokenizer): string[] {
  oneTokenWords ??= WORDS.filter((w) => tok.encode(w).length === 1 && tok.encode(" " + w).length === 1);
  return oneTokenWords;
}

/** Seeded pseudo-random text of exactly `n` tokens, deterministic from (seed, prompt ids). */
export function randomOutput(seed: number, promptIds: readonly number[], n: number, tok: SimTokenizer): PolicyOutput {
  const vocab = words(tok);
  let state = hashIds(mix32(fnv1a(`seed:${seed}`), 0), promptIds);
  const picked: string[] = [];
  for (let i = 0; i < n; i++) {
    state = mix32(state, i);
    picked.push(vocab[state % vocab.length]!);
  }
  const ids = tok.encode(picked.join(" "));
  ids.push(IM_END_ID);
  return { ids, finish: "stop" };
}

/**
 * The policy for a raw prompt (completions, SGLang /generate): a `#sim:` script found in the
 * decoded prompt text (see findScriptInText), else the seeded random answer.
 */
export function promptPolicy(seed: number, randomTokens: number, promptIds: readonly number[], tok: SimTokenizer): PolicyOutput {
  const found = findScriptInText(tok.decode(promptIds));
  if (!found) return randomOutput(seed, promptIds, randomTokens, tok);
  return continuePartialTurn(scriptedOutput(found.step, tok), partialAssistantTurn(promptIds, tok));
}

/**
 * The tokens of an assistant turn the prompt leaves open (after the last `<|im_start|>assistant\n`,
 * with no `<|im_end|>` since): a generation cut short and sent back to be continued. Empty when
 * the prompt ends on the generation prompt itself or the last turn is closed.
 */
export function partialAssistantTurn(promptIds: readonly number[], tok: SimTokenizer): number[] {
  const opener = tok.encode("<|im_start|>assistant\n");
  for (let i = promptIds.length - opener.length; i >= 0; i--) {
    if (promptIds[i] !== IM_START_ID) continue;
    if (!opener.every((id, k) => promptIds[i + k] === id)) return [];
    const tail = promptIds.slice(i + opener.length);
    return tail.includes(IM_END_ID) ? [] : tail;
  }
  return [];
}

/** A model continues its own cut-short answer: when the scripted answer starts with the open turn's tokens, only the rest is generated. */
function continuePartialTurn(out: PolicyOutput, partial: readonly number[]): PolicyOutput {
  if (partial.length === 0 || partial.length > out.ids.length) return out;
  if (!partial.every((id, i) => out.ids[i] === id)) return out;
  return { ids: out.ids.slice(partial.length), finish: out.finish };
}

/** `ignore_eos`: the answer goes on past `<|im_end|>` with seeded words until `n` tokens. */
export function extendPastEos(out: PolicyOutput, n: number, seed: number, promptIds: readonly number[], tok: SimTokenizer): PolicyOutput {
  const ids = [...out.ids];
  for (let round = 0; ids.length < n; round++) {
    const more = randomOutput(seed + round + 1, [...promptIds, ...ids.slice(-8)], Math.min(64, n - ids.length), tok).ids.slice(0, -1);
    ids.push(...more);
  }
  return { ids: ids.slice(0, n), finish: "length" };
}
