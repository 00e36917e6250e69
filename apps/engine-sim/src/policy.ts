import type { SimModel } from "./model.js";
import type { SimStep } from "./script.js";
import { fnv1a, hashIds, mix32 } from "./hash.js";
import { findScriptInText } from "./script.js";

/**
 * What the simulated model generates: the scripted step or seeded random text, written the way the
 * served family's model writes it, as the real token ids of that text (so a trajectory decodes back
 * exactly), ending with the family's end-of-turn token when the answer stops naturally. Request
 * limits (max_tokens, stop) are applied later.
 */

export interface PolicyOutput {
  ids: number[];
  /** "length" when the policy itself cut the answer (script `finish: "length"` or `tokens` overflow). */
  finish: "stop" | "length";
}

/** Pads `step.text` with " ok" filler until the answer is exactly `target` tokens (end token included when natural). */
function padStep(step: SimStep, target: number, natural: boolean, model: SimModel, promptText: string): number[] {
  const tok = model.tok;
  const ctx = { tok, promptText };
  const extra = natural ? 1 : 0;
  let fill = target - (tok.encode(model.family.write(step, ctx).text).length + extra);
  let ids: number[] = [];
  for (let attempt = 0; attempt < 6 && fill > 0; attempt++) {
    const text = step.text ?? "";
    const filler = (text ? " ok" : "ok") + " ok".repeat(fill - 1);
    ids = tok.encode(model.family.write({ ...step, text: text + filler }, ctx).text);
    const diff = target - (ids.length + extra);
    if (diff === 0) break;
    fill += diff;
  }
  return ids;
}

/** The answer for a step (null: past the script's end, the model says "done"). */
export function scriptedOutput(step: SimStep | null, model: SimModel, promptText: string): PolicyOutput {
  const tok = model.tok;
  const s: SimStep = step ?? { text: "done" };
  const cut = s.finish === "length";
  const written = model.family.write(s, { tok, promptText });
  const endId = model.endId(written.end);
  let ids = tok.encode(written.text);
  if (!cut) ids.push(endId);
  if (s.tokens !== undefined && ids.length < s.tokens) {
    ids = padStep(s, s.tokens, !cut, model, promptText);
    if (!cut) ids.push(endId);
  }
  if (s.tokens !== undefined && ids.length > s.tokens) return { ids: ids.slice(0, s.tokens), finish: "length" };
  return { ids, finish: cut ? "length" : "stop" };
}

const WORDS = (
  "the a model answer is of to and in that it for on with as was at by this be from or which an are " +
  "simple result value test data code file line step time state rank token text order list set case " +
  "run call read write check make take give find keep show start stop open close build move turn"
).split(" ");

const oneTokenWords = new WeakMap<object, string[]>();
/** Words that are one token both at the start and after a space, so N words are N tokens. */
function words(model: SimModel): string[] {
  let w = oneTokenWords.get(model.tok);
  if (!w) {
    w = WORDS.filter((x) => model.tok.encode(x).length === 1 && model.tok.encode(" " + x).length === 1);
    oneTokenWords.set(model.tok, w);
  }
  return w;
}

/** Seeded pseudo-random words, `n` of them (one token each), deterministic from (seed, prompt ids). */
export function randomOutput(seed: number, promptIds: readonly number[], n: number, model: SimModel): PolicyOutput {
  const vocab = words(model);
  let state = hashIds(mix32(fnv1a(`seed:${seed}`), 0), promptIds);
  const picked: string[] = [];
  for (let i = 0; i < n; i++) {
    state = mix32(state, i);
    picked.push(vocab[state % vocab.length]!);
  }
  const written = model.family.writeWords(picked.join(" "));
  const ids = model.tok.encode(written.text);
  ids.push(model.endId(written.end));
  return { ids, finish: "stop" };
}

/**
 * The policy for a raw prompt (completions, SGLang /generate): a `#sim:` script found in the
 * decoded prompt text (see findScriptInText), else the seeded random answer.
 */
export function promptPolicy(seed: number, randomTokens: number, promptIds: readonly number[], model: SimModel): PolicyOutput {
  const text = model.tok.decode(promptIds);
  const found = findScriptInText(text, model.family);
  if (!found) return randomOutput(seed, promptIds, randomTokens, model);
  return continueOpenAnswer(scriptedOutput(found.step, model, text), promptIds, model);
}

/**
 * A model continues its own cut-short answer: when the prompt leaves an answer open and the
 * scripted answer starts with its tokens, only the rest is generated.
 */
export function continueOpenAnswer(out: PolicyOutput, promptIds: readonly number[], model: SimModel): PolicyOutput {
  const open = model.family.openAnswer(promptIds, model.tok);
  if (open.length === 0 || open.length > out.ids.length) return out;
  if (!open.every((id, i) => out.ids[i] === id)) return out;
  return { ids: out.ids.slice(open.length), finish: out.finish };
}

/** `ignore_eos`: the answer goes on past its end token with seeded words until `n` tokens. */
export function extendPastEos(out: PolicyOutput, n: number, seed: number, promptIds: readonly number[], model: SimModel): PolicyOutput {
  const ids = [...out.ids];
  for (let round = 0; ids.length < n; round++) {
    const more = randomOutput(seed + round + 1, [...promptIds, ...ids.slice(-8)], Math.min(64, n - ids.length), model).ids.slice(0, -1);
    ids.push(...more);
  }
  return { ids: ids.slice(0, n), finish: "length" };
}
