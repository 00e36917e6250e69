import { setTimeout as sleep } from "node:timers/promises";
import { contextHash, extendContextHash, topLogprobs } from "./logprobs.js";
import type { TokenLogprob } from "./logprobs.js";
import type { Rank } from "./ranks.js";
import type { SimState } from "./state.js";

/**
 * The engine loop shared by every route flavour: admits a request on a rank (load counters, prefix
 * cache), then releases the planned token ids one at a time with the latency model (TTFT before the
 * first token, TPOT between tokens), each with its deterministic logprob under the weight version
 * current at that moment.
 */

export interface GenJob {
  rank: Rank;
  promptIds: readonly number[];
  /** The ids to release (already cut by the request's stopping rules). */
  ids: readonly number[];
  /** How many top logprobs to compute per token (0: just the sampled one). */
  topN: number;
  cacheSalt?: string | undefined;
}

export interface GenToken {
  index: number;
  id: number;
  logprob: number;
  /** Sampled token first, then alternatives (length = topN, or 0). */
  top: TokenLogprob[];
}

/** Admission: the cached prefix length on the rank; the prompt's blocks are cached from now on. */
export function admit(job: GenJob): number {
  const cached = job.rank.cache.lookup(job.promptIds, job.cacheSalt);
  job.rank.cache.insert(job.promptIds, job.cacheSalt);
  return cached;
}

export async function* generate(sim: SimState, job: GenJob, signal?: AbortSignal): AsyncGenerator<GenToken> {
  const rank = job.rank;
  rank.running++;
  let done = 0;
  try {
    let version = sim.weightVersion;
    let h = contextHash(version, job.promptIds);
    for (let i = 0; i < job.ids.length; i++) {
      const delay = i === 0 ? sim.opts.ttftMs : sim.opts.tpotMs;
      if (delay > 0) await sleep(delay, undefined, signal ? { signal } : undefined);
      if (signal?.aborted) return;
      if (sim.weightVersion !== version) {
        // Weights changed mid-sequence: later tokens are scored by the new version.
        version = sim.weightVersion;
        h = contextHash(version, [...job.promptIds, ...job.ids.slice(0, i)]);
      }
      const id = job.ids[i]!;
      const top = topLogprobs(h, id, Math.max(1, job.topN));
      yield { index: i, id, logprob: top[0]!.logprob, top: job.topN > 0 ? top : [] };
      done = i + 1;
      h = extendContextHash(h, id);
    }
  } finally {
    rank.running--;
    rank.served++;
    rank.cache.insert([...job.promptIds, ...job.ids.slice(0, done)], job.cacheSalt);
  }
}
