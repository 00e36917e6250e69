import { fnv1a, hashIds, mix32 } from "./hash.js";

/**
 * Deterministic logprobs, so tests anywhere can predict what the engine reports.
 *
 * Contract of `simLogprob(weightVersion, contextIds, tokenId)` (all arithmetic unsigned 32-bit):
 *   fnv1a(s)   = FNV-1a 32 over the UTF-8 bytes of s (offset 0x811c9dc5, prime 0x01000193)
 *   fmix32(h)  = murmur3 finaliser: h^=h>>>16; h*=0x85ebca6b; h^=h>>>13; h*=0xc2b2ae35; h^=h>>>16
 *   mix32(h,v) = fmix32((h * 0x01000193) XOR v)
 *   h = fnv1a(weightVersion); for id in contextIds: h = mix32(h, id)      // the context hash
 *   u = mix32(h, tokenId) / 2^32                                           // in [0, 1)
 *   logprob = -10 * (u * u * u)                                            // in (-10, 0], IEEE doubles
 * For a generated token, `contextIds` = prompt ids followed by the ids generated before it, and
 * `weightVersion` is the engine's weight version when that token was generated (default "0").
 * The reported value is max(logprob, -9999) as in vLLM (a no-op here).
 *
 * top_logprobs (N requested): the sampled token first, then N-1 alternatives sorted by logprob
 * (descending); alternative k = 1, 2, … is mix32(h, 0x80000000 + k) mod R, where R is the tokenizer's
 * count of ordinary (non-added) ids (Qwen3 151,643; Llama 3.1 and DeepSeek-V3 128,000; gpt-oss 199,998),
 * skipping the sampled id and repeats, with logprob simLogprob(weightVersion, contextIds, alt).
 */
export function simLogprob(weightVersion: string, contextIds: readonly number[], tokenId: number): number {
  return logprobAt(contextHash(weightVersion, contextIds), tokenId);
}

/** The context hash `h` of the contract (fold more ids in with `extendContextHash`). */
export function contextHash(weightVersion: string, contextIds: readonly number[]): number {
  return hashIds(fnv1a(weightVersion), contextIds);
}

export function extendContextHash(h: number, id: number): number {
  return mix32(h, id);
}

/** logprob of `tokenId` given a context hash. */
export function logprobAt(h: number, tokenId: number): number {
  const u = mix32(h, tokenId) / 4294967296;
  return Math.max(-10 * (u * u * u), -9999);
}

export interface TokenLogprob {
  id: number;
  logprob: number;
}

/** The sampled token and its alternatives, `n` entries in all (0 → none). */
export function topLogprobs(h: number, sampled: number, n: number, regularVocab: number): TokenLogprob[] {
  if (n <= 0) return [];
  const alts: TokenLogprob[] = [];
  const seen = new Set([sampled]);
  for (let k = 1; alts.length < n - 1 && k < 10_000; k++) {
    const id = mix32(h, (0x80000000 + k) >>> 0) % regularVocab;
    if (seen.has(id)) continue;
    seen.add(id);
    alts.push({ id, logprob: logprobAt(h, id) });
  }
  alts.sort((a, b) => b.logprob - a.logprob);
  return [{ id: sampled, logprob: logprobAt(h, sampled) }, ...alts];
}
