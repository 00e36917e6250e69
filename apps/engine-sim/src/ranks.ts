import { NO_FAULT } from "./faults.js";
import type { Fault } from "./faults.js";
import { fnv1a, mix32 } from "./hash.js";

/**
 * Data-parallel ranks behind one port. Each rank has its own load counters and its own prefix
 * cache: a set of chained hashes of full 16-token blocks (vLLM's block size), LRU-bounded.
 */

export const BLOCK_SIZE = 16;
const MAX_BLOCKS_PER_RANK = 200_000;

export class PrefixCache {
  /** Insertion-ordered, so the first key is the least recently used. */
  private readonly blocks = new Map<number, true>();

  private chain(ids: readonly number[], nBlocks: number, salt: string | undefined): number[] {
    const out: number[] = [];
    let h = fnv1a(`salt:${salt ?? ""}`);
    for (let b = 0; b < nBlocks; b++) {
      for (let i = b * BLOCK_SIZE; i < (b + 1) * BLOCK_SIZE; i++) h = mix32(h, ids[i]!);
      out.push(h);
    }
    return out;
  }

  /**
   * Cached prefix length of a prompt (whole blocks). Like vLLM, at least one prompt token is always
   * recomputed, so only blocks within the first `len - 1` tokens can hit.
   */
  lookup(promptIds: readonly number[], salt?: string): number {
    const hashes = this.chain(promptIds, Math.floor(Math.max(0, promptIds.length - 1) / BLOCK_SIZE), salt);
    let hit = 0;
    for (const h of hashes) {
      if (!this.blocks.has(h)) break;
      this.blocks.delete(h);
      this.blocks.set(h, true);
      hit++;
    }
    return hit * BLOCK_SIZE;
  }

  /** Caches every full block of a sequence (prompt + generated, as vLLM does when blocks fill). */
  insert(ids: readonly number[], salt?: string): void {
    for (const h of this.chain(ids, Math.floor(ids.length / BLOCK_SIZE), salt)) {
      this.blocks.delete(h);
      this.blocks.set(h, true);
    }
    while (this.blocks.size > MAX_BLOCKS_PER_RANK) this.blocks.delete(this.blocks.keys().next().value!);
  }

  clear(): void {
    this.blocks.clear();
  }

  get size(): number {
    return this.blocks.size;
  }
}

export class Rank {
  served = 0;
  /** Admitted generations that ended because their client went away (closed its stream or request). */
  clientClosed = 0;
  running = 0;
  /** Requests admitted to the rank but waiting for a batch slot (or retracted by a pause). */
  waiting = 0;
  /** Generation requests routed here (the error fault's draw counter). */
  routed = 0;
  fault: Fault = NO_FAULT;
  readonly cache = new PrefixCache();
  constructor(readonly index: number) {}

  get down(): boolean {
    return this.fault.mode === "down";
  }

  /** vLLM's DP load-balancing score (DPLBAsyncMPClient): waiting * 4 + running. */
  get score(): number {
    return this.waiting * 4 + this.running;
  }
}

export class Ranks {
  readonly ranks: Rank[];
  constructor(dpSize: number) {
    this.ranks = Array.from({ length: dpSize }, (_, i) => new Rank(i));
  }

  get size(): number {
    return this.ranks.length;
  }

  /** The least-loaded rank that is not down (lowest index on ties); undefined when all are down. */
  pick(): Rank | undefined {
    let best: Rank | undefined;
    for (const r of this.ranks) if (!r.down && (!best || r.score < best.score)) best = r;
    return best;
  }
}

export type RankHeader = { kind: "none" } | { kind: "rank"; rank: number } | { kind: "out_of_range"; rank: number };

/**
 * `X-data-parallel-rank` as vLLM reads it: a value Python's int() rejects is ignored; an int outside
 * [0, n) is an error (400).
 */
export function parseRankHeader(value: string | string[] | undefined, dpSize: number): RankHeader {
  const v = Array.isArray(value) ? value[0] : value;
  if (v === undefined || !/^\s*[+-]?\d+(_\d+)*\s*$/.test(v)) return { kind: "none" };
  const rank = Number(v.trim().replace(/_/g, ""));
  if (rank < 0 || rank >= dpSize) return { kind: "out_of_range", rank };
  return { kind: "rank", rank };
}

/**
 * SGLang's rank choice: `routed_dp_rank` (older `data_parallel_rank`, PR #6884 → renamed in PR
 * #19268) in the body, else (OpenAI routes only) the `X-Data-Parallel-Rank` header. A rank outside
 * [0, n) falls back to load balancing (PR #19762) instead of failing.
 */
export function sglangRank(bodyRank: number | null | undefined, header: string | string[] | undefined, dpSize: number): number | undefined {
  if (bodyRank !== null && bodyRank !== undefined) return Number.isInteger(bodyRank) && bodyRank >= 0 && bodyRank < dpSize ? bodyRank : undefined;
  const h = parseRankHeader(header, dpSize);
  return h.kind === "rank" ? h.rank : undefined;
}
