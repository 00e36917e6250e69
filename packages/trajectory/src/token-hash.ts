/**
 * Rolling hashes of token sequences and a (length, hash) index over them: how prefix merging
 * finds the chain a prompt extends without comparing it with every chain (linear time).
 *
 * Two 32-bit hashes in integer arithmetic only: h1 polynomial (h·B1 + t), h2 FNV-1a style
 * ((h ^ t)·M2, whose high bits mix well: the index keys on them). A hit is always verified token
 * by token, so a collision costs time, never correctness. (A second hash modulo a prime cost a
 * floating-point remainder per token: most of a large trajectory's build time.)
 */

const B1 = 0x01000193; // FNV prime, odd
const M2 = 0x5bd1e995; // MurmurHash2's multiplier, odd
const LEN_SPACE = 2 ** 27; // prefix lengths up to 134M tokens

export interface HashState {
  len: number;
  h1: number;
  h2: number;
}

export const EMPTY_HASH: HashState = { len: 0, h1: 0, h2: 0 };

/** Prefix hashes of `ids`: entry L is the hash of ids[0..L). */
export interface PrefixHashes {
  h1: Uint32Array;
  h2: Uint32Array;
}

export function prefixHashes(ids: readonly number[]): PrefixHashes {
  const n = ids.length;
  const h1 = new Uint32Array(n + 1);
  const h2 = new Uint32Array(n + 1);
  let a = 0;
  let b = 0;
  for (let i = 0; i < n; i++) {
    const t = (ids[i] as number) + 1;
    a = (Math.imul(a, B1) + t) >>> 0;
    b = Math.imul(b ^ t, M2) >>> 0;
    h1[i + 1] = a;
    h2[i + 1] = b;
  }
  return { h1, h2 };
}

/**
 * The hash states of ids[0..L) for each L of `lengths` (ascending, each ≤ ids.length) and of the
 * whole of ids, in one pass and without an array per token: what finding a chain tip needs.
 */
export function statesAt(ids: readonly number[], lengths: readonly number[]): { at: HashState[]; whole: HashState } {
  const at: HashState[] = [];
  let a = 0;
  let b = 0;
  let i = 0;
  for (const len of lengths) {
    for (; i < len; i++) {
      const t = (ids[i] as number) + 1;
      a = (Math.imul(a, B1) + t) >>> 0;
      b = Math.imul(b ^ t, M2) >>> 0;
    }
    at.push({ len, h1: a, h2: b });
  }
  for (const n = ids.length; i < n; i++) {
    const t = (ids[i] as number) + 1;
    a = (Math.imul(a, B1) + t) >>> 0;
    b = Math.imul(b ^ t, M2) >>> 0;
  }
  return { at, whole: { len: ids.length, h1: a, h2: b } };
}

export function stateAt(hashes: PrefixHashes, len: number): HashState {
  return { len, h1: hashes.h1[len] as number, h2: hashes.h2[len] as number };
}

/** The hash of `state`'s sequence followed by ids[from..to); `visit` sees every intermediate state. */
export function extendHash(
  state: HashState,
  ids: readonly number[],
  from = 0,
  to = ids.length,
  visit?: (s: HashState) => void,
): HashState {
  let a = state.h1;
  let b = state.h2;
  let len = state.len;
  for (let i = from; i < to; i++) {
    const t = (ids[i] as number) + 1;
    a = (Math.imul(a, B1) + t) >>> 0;
    b = Math.imul(b ^ t, M2) >>> 0;
    len++;
    if (visit) visit({ len, h1: a, h2: b });
  }
  return { len, h1: a, h2: b };
}

/** (length, the high 26 bits of h2) as one exact double: a Map key without a string. */
function key(len: number, h2: number): number {
  return (h2 >>> 6) * LEN_SPACE + len;
}

/** Values indexed by the (length, hash) of a token sequence. Lookups return candidates, unverified. */
export class HashIndex<V> {
  private readonly map = new Map<number, { h1: number; value: V }[]>();
  private readonly lengths = new Map<number, number>();

  add(s: HashState, value: V): void {
    const k = key(s.len, s.h2);
    const bucket = this.map.get(k);
    if (bucket) bucket.push({ h1: s.h1, value });
    else this.map.set(k, [{ h1: s.h1, value }]);
    this.lengths.set(s.len, (this.lengths.get(s.len) ?? 0) + 1);
  }

  /** Add unless some value is already stored under this exact hash. */
  addFirst(s: HashState, value: V): void {
    const bucket = this.map.get(key(s.len, s.h2));
    if (bucket?.some((e) => e.h1 === s.h1)) return;
    this.add(s, value);
  }

  /** Whether any sequence of this length is indexed (a cheap filter before hashing lookups). */
  hasLength(len: number): boolean {
    return this.lengths.has(len);
  }

  /** The lengths of the indexed sequences up to `max`, ascending. */
  lengthsUpTo(max: number): number[] {
    const out: number[] = [];
    for (const len of this.lengths.keys()) if (len <= max) out.push(len);
    return out.sort((x, y) => x - y);
  }

  get(len: number, h1: number, h2: number): V[] {
    const bucket = this.map.get(key(len, h2));
    if (!bucket) return [];
    const out: V[] = [];
    for (const e of bucket) if (e.h1 === h1) out.push(e.value);
    return out;
  }

  remove(s: HashState, match: (v: V) => boolean): void {
    const k = key(s.len, s.h2);
    const bucket = this.map.get(k);
    if (!bucket) return;
    const i = bucket.findIndex((e) => e.h1 === s.h1 && match(e.value));
    if (i < 0) return;
    bucket.splice(i, 1);
    if (bucket.length === 0) this.map.delete(k);
    const c = (this.lengths.get(s.len) ?? 1) - 1;
    if (c === 0) this.lengths.delete(s.len);
    else this.lengths.set(s.len, c);
  }
}

/** Length of the longest common prefix of a and b. */
export function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** Whether seq[0..len) equals ids[0..len). */
export function samePrefix(ids: readonly number[], seq: readonly number[], len: number): boolean {
  if (ids.length < len || seq.length < len) return false;
  for (let i = 0; i < len; i++) if (ids[i] !== seq[i]) return false;
  return true;
}
