/**
 * Small, fast, portable 32-bit hashes (all arithmetic is unsigned 32-bit, so the same numbers come
 * out of any language). Used for deterministic logprobs, the random policy and prefix-cache blocks.
 */

/** FNV-1a over the UTF-8 bytes of `s`. */
export function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(s)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h >>> 0;
}

/** murmur3's 32-bit finaliser (a bijection). */
export function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Folds one 32-bit value into a running hash: fmix32((h * 0x01000193 mod 2^32) XOR v). */
export function mix32(h: number, v: number): number {
  return fmix32((Math.imul(h, 0x01000193) ^ v) >>> 0);
}

/** Folds a sequence of ids into `h`, in order. */
export function hashIds(h: number, ids: readonly number[]): number {
  for (const id of ids) h = mix32(h, id);
  return h;
}
