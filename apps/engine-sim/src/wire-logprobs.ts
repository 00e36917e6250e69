import type { GenToken } from "./engine.js";
import { contextHash, extendContextHash, topLogprobs } from "./logprobs.js";
import type { TokenLogprob } from "./logprobs.js";
import type { SimTokenizer } from "./tokenizer.js";

/** The logprob shapes of each wire format, built from the engine's deterministic logprobs. */

const utf8 = new TextEncoder();
const lossy = new TextDecoder("utf-8", { fatal: false });
const clamp = (lp: number) => Math.max(lp, -9999);

/** vLLM's logprob token string: the token decoded alone (lossy for split UTF-8), or "token_id:N". */
export function tokenString(tok: SimTokenizer, id: number, asIds: boolean): string {
  return asIds ? `token_id:${id}` : lossy.decode(tok.tokenBytes(id));
}

/** One `logprobs.content[]` entry of a chat answer: vLLM order {token, logprob, bytes, top_logprobs}; SGLang {token, bytes, logprob, top_logprobs}. */
export function chatLogprobEntry(tok: SimTokenizer, t: GenToken, asIds: boolean, sglang = false) {
  const entry = (id: number, logprob: number) => {
    const token = tokenString(tok, id, asIds);
    const bytes = Array.from(utf8.encode(token));
    return sglang ? { token, bytes, logprob: clamp(logprob) } : { token, logprob: clamp(logprob), bytes };
  };
  return { ...entry(t.id, t.logprob), top_logprobs: t.top.map((a) => entry(a.id, a.logprob)) };
}

/** Per prompt position i ≥ 1: the actual token's logprob given ids[0..i) and `k` alternatives (sampled first). */
export function promptTops(weightVersion: string, promptIds: readonly number[], k: number, regularVocab: number): TokenLogprob[][] {
  const out: TokenLogprob[][] = [];
  if (promptIds.length === 0) return out;
  let h = contextHash(weightVersion, promptIds.slice(0, 1));
  for (let i = 1; i < promptIds.length; i++) {
    out.push(topLogprobs(h, promptIds[i]!, Math.max(1, k + 1), regularVocab));
    h = extendContextHash(h, promptIds[i]!);
  }
  return out;
}

type PromptEntry = Record<string, { logprob: number; rank: number; decoded_token: string }>;

/** vLLM's `prompt_logprobs`: entry 0 null, then {"<id>": {logprob, rank, decoded_token}} incl. top-k. */
export function vllmPromptLogprobs(tok: SimTokenizer, weightVersion: string, promptIds: readonly number[], k: number): (PromptEntry | null)[] {
  const out: (PromptEntry | null)[] = [null];
  for (const top of promptTops(weightVersion, promptIds, k, tok.regularVocabSize)) {
    const actual = top[0]!;
    const alts = top.slice(1, k + 1);
    const entry: PromptEntry = {};
    entry[String(actual.id)] = { logprob: actual.logprob, rank: 1 + alts.filter((a) => a.logprob > actual.logprob).length, decoded_token: tok.decode([actual.id]) };
    alts.forEach((a, r) => {
      entry[String(a.id)] ??= { logprob: a.logprob, rank: r + 1, decoded_token: tok.decode([a.id]) };
    });
    out.push(entry);
  }
  return out;
}

/** One position of a legacy completions logprobs list: the token id and its step dict (sampled first), or null (prompt position 0). */
export interface LegacyStep {
  id: number;
  top: TokenLogprob[] | null;
}

/**
 * vLLM's legacy completions logprobs `{text_offset, token_logprobs, tokens, top_logprobs}`
 * (`_create_completion_logprobs`): top_logprobs keeps the first k+1 entries of each step dict,
 * keyed by token string; text_offset advances by Python len() of each token string.
 */
export function legacyLogprobs(tok: SimTokenizer, steps: readonly LegacyStep[], k: number, asIds: boolean, initialOffset = 0) {
  const text_offset: number[] = [];
  const token_logprobs: (number | null)[] = [];
  const tokens: string[] = [];
  const top_logprobs: (Record<string, number> | null)[] = [];
  let offset = initialOffset;
  for (const s of steps) {
    const token = asIds ? `token_id:${s.id}` : s.top ? tokenString(tok, s.id, false) : tok.decode([s.id]);
    tokens.push(token);
    if (!s.top) {
      token_logprobs.push(null);
      top_logprobs.push(null);
    } else {
      token_logprobs.push(clamp(s.top[0]!.logprob));
      const d: Record<string, number> = {};
      for (const a of s.top.slice(0, k + 1)) d[tokenString(tok, a.id, asIds)] = clamp(a.logprob);
      top_logprobs.push(d);
    }
    text_offset.push(offset);
    offset += [...token].length;
  }
  return { text_offset, token_logprobs, tokens, top_logprobs };
}

/** SGLang's `[logprob, id, text|null]` triple (text only with `return_text_in_logprobs`). */
export function sglangTriple(tok: SimTokenizer, lp: number | null, id: number, withText: boolean): [number | null, number, string | null] {
  return [lp, id, withText ? tok.decode([id]) : null];
}
