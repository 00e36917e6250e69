import { setTimeout as sleep } from "node:timers/promises";
import { failsAt } from "./faults.js";
import { contextHash, extendContextHash, topLogprobs } from "./logprobs.js";
import type { TokenLogprob } from "./logprobs.js";
import type { Rank, Ranks } from "./ranks.js";

/**
 * The engine loop shared by every route flavour. A request is admitted (pause gate, rank choice,
 * faults, prefix cache, per-rank batch slot), then its planned token ids are released one at a time
 * with the latency model (TTFT before the first, TPOT between the others, plus a `slow` fault's
 * delay), each with its deterministic logprob under the weight version current at that moment.
 *
 * Pause modes (vLLM `/pause?mode=`, SGLang `/pause_generation {mode}`): every mode holds new
 * requests at the gate until resume. In flight: `abort` ends them now (outcome "abort", partial
 * tokens kept); `wait` lets them finish; `keep` / `in_place` freeze them between two tokens;
 * `retract` freezes them too but moves them from running to waiting (SGLang's retraction, counted
 * in `total_retractions`). Frozen requests continue after resume under the then-current weights.
 */

export type PauseMode = "abort" | "wait" | "keep" | "in_place" | "retract";
/**
 * finished: all planned tokens out; abort: ended by a pause or abort route (or by a `finish` fault,
 * whose reason the generation's `finishAs` holds); client: the client left; disconnect: a fault cut it.
 */
export type Outcome = "finished" | "abort" | "client" | "disconnect";

export interface GenToken {
  index: number;
  id: number;
  logprob: number;
  /** Sampled token first, then alternatives (length = topN, or 0). */
  top: TokenLogprob[];
  /** The weight version the token was sampled under. */
  version: string;
}

export interface GenRequest {
  promptIds: readonly number[];
  /** The ids to release (already cut by the request's stopping rules). */
  ids: readonly number[];
  /** How many top logprobs to compute per token (0: just the sampled one). */
  topN: number;
  cacheSalt?: string | undefined;
  /** A rank the request is pinned to (validated by the route); otherwise the least loaded live rank. */
  rank?: number | undefined;
  /** Aborted when the client goes away. */
  signal?: AbortSignal | undefined;
}

/** Admission refused: the route answers `status` in its server's envelope. */
export class EngineError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export interface EngineConfig {
  ttftMs: number;
  tpotMs: number;
  /** Per-rank batch limit (running requests); beyond it requests wait. 0 = unlimited. */
  maxRunning: number;
  /** The tokenizer's ordinary ids (0 … regularVocab-1), from which top-logprob alternatives are drawn. */
  regularVocab: number;
}

/** One request's life on the engine. */
export class Generation {
  rank!: Rank;
  cached = 0;
  retractions = 0;
  outcome: Outcome | null = null;
  /** The finish reason an "abort" outcome is told with: "abort" unless a `finish` fault ended it. */
  finishAs = "abort";
  readonly tokens: GenToken[] = [];
  readonly startedAt = performance.now();
  /** Set when the pause/abort machinery ends the request; wakes any sleep. */
  readonly stopper = new AbortController();
  queued = false;
  frozen = false;
  /** The weight version the prompt was read (prefilled) under; set when the generation starts. */
  promptVersion: string | null = null;
  constructor(readonly req: GenRequest) {}

  get signal(): AbortSignal {
    return this.req.signal ? AbortSignal.any([this.req.signal, this.stopper.signal]) : this.stopper.signal;
  }
}

export class Engine {
  pauseMode: PauseMode | null = null;
  private resumeWaiters: (() => void)[] = [];
  private idleWaiters: (() => void)[] = [];
  private readonly slotWaiters = new Map<Rank, (() => void)[]>();
  /** Admitted and not yet done (queued, running or frozen). */
  readonly active = new Set<Generation>();

  constructor(
    private readonly ranks: Ranks,
    private readonly cfg: EngineConfig,
    /** The weight version now (read at every token). */
    private readonly weightVersion: () => string,
  ) {}

  get paused(): boolean {
    return this.pauseMode !== null;
  }

  /**
   * Pauses. Resolves when the pause has taken effect: for `wait`, once every in-flight request has
   * finished (vLLM's `/pause?mode=wait` returns then); for the others at once.
   */
  async pause(mode: PauseMode): Promise<void> {
    this.pauseMode = mode;
    if (mode === "abort") for (const g of [...this.active]) this.stop(g, "abort");
    if (mode === "wait" && this.active.size > 0) await new Promise<void>((r) => this.idleWaiters.push(r));
  }

  resume(): void {
    this.pauseMode = null;
    for (const w of this.resumeWaiters.splice(0)) w();
  }

  /** Ends one request (pause abort, abort routes). */
  stop(g: Generation, outcome: Outcome): void {
    if (g.outcome) return;
    g.outcome = outcome;
    g.stopper.abort();
  }

  private async untilResumed(signal: AbortSignal): Promise<void> {
    while (this.paused && !signal.aborted) {
      await new Promise<void>((resolve) => {
        const done = () => {
          signal.removeEventListener("abort", done);
          resolve();
        };
        this.resumeWaiters.push(done);
        signal.addEventListener("abort", done, { once: true });
      });
    }
  }

  /**
   * Admission. Waits while paused, picks the rank, applies the rank's down / error faults (throws
   * EngineError), reads and fills the prefix cache, and waits for a batch slot. The returned
   * generation may already be over (outcome set) if it was aborted or the client left meanwhile.
   */
  async admit(req: GenRequest): Promise<Generation> {
    const g = new Generation(req);
    await this.untilResumed(g.signal);
    if (req.signal?.aborted) {
      g.outcome = "client";
      return g;
    }
    const rank = req.rank !== undefined ? this.ranks.ranks[req.rank]! : this.ranks.pick();
    if (!rank || rank.down) throw new EngineError(503, rank ? `engine-sim: DP rank ${rank.index} is down (fault injection).` : "engine-sim: every DP rank is down (fault injection).");
    rank.routed++;
    if (failsAt(rank.fault, rank.index, rank.routed)) throw new EngineError(500, `engine-sim: injected error on DP rank ${rank.index}.`);
    g.rank = rank;
    g.cached = rank.cache.lookup(req.promptIds, req.cacheSalt);
    rank.cache.insert(req.promptIds, req.cacheSalt);
    this.active.add(g);
    if (this.cfg.maxRunning > 0 && rank.running >= this.cfg.maxRunning) {
      g.queued = true;
      rank.waiting++;
      await new Promise<void>((resolve) => {
        const q = this.slotWaiters.get(rank) ?? [];
        this.slotWaiters.set(rank, q);
        const done = () => {
          g.signal.removeEventListener("abort", done);
          const i = q.indexOf(done);
          if (i >= 0) q.splice(i, 1);
          resolve();
        };
        q.push(done);
        g.signal.addEventListener("abort", done, { once: true });
      });
      rank.waiting--;
      g.queued = false;
    }
    if (g.signal.aborted) {
      g.outcome ??= "client";
      this.finish(g, false);
      return g;
    }
    rank.running++;
    return g;
  }

  private finish(g: Generation, wasRunning: boolean): void {
    if (!this.active.delete(g)) return;
    const rank = g.rank;
    if (g.outcome === "client") rank.clientClosed++;
    if (wasRunning) {
      rank.running--;
      rank.served++;
      rank.cache.insert([...g.req.promptIds, ...g.tokens.map((t) => t.id)], g.req.cacheSalt);
      // Hand the slot to the next queued request on this rank.
      this.slotWaiters.get(rank)?.shift()?.();
    }
    if (this.active.size === 0) for (const w of this.idleWaiters.splice(0)) w();
  }

  /** Releases the tokens of an admitted generation; `g.outcome` says how it ended. */
  async *run(g: Generation): AsyncGenerator<GenToken> {
    if (g.outcome) {
      // Ended before its first token (e.g. a pause abort): still release its slot.
      this.finish(g, true);
      return;
    }
    const { req, rank } = g;
    const signal = g.signal;
    try {
      let version = this.weightVersion();
      g.promptVersion = version;
      let h = contextHash(version, req.promptIds);
      for (let i = 0; i < req.ids.length; i++) {
        if (rank.fault.mode === "finish" && i >= rank.fault.afterTokens) {
          g.outcome = "abort";
          g.finishAs = rank.fault.finishReason;
          return;
        }
        if (rank.fault.mode === "disconnect" && i >= rank.fault.afterTokens) {
          g.outcome = "disconnect";
          return;
        }
        const delay = (i === 0 ? this.cfg.ttftMs : this.cfg.tpotMs) + rank.fault.delayMs;
        if (delay > 0) await sleep(delay, undefined, { signal }).catch(() => undefined);
        if (this.pauseMode === "keep" || this.pauseMode === "in_place" || this.pauseMode === "retract") await this.freeze(g);
        if (signal.aborted) {
          g.outcome ??= "client";
          return;
        }
        if (this.weightVersion() !== version) {
          // Weights changed mid-sequence: later tokens are scored by the new version.
          version = this.weightVersion();
          h = contextHash(version, [...req.promptIds, ...req.ids.slice(0, i)]);
        }
        const id = req.ids[i]!;
        const top = topLogprobs(h, id, Math.max(1, req.topN), this.cfg.regularVocab);
        const t: GenToken = { index: i, id, logprob: top[0]!.logprob, top: req.topN > 0 ? top : [], version };
        g.tokens.push(t);
        yield t;
        h = extendContextHash(h, id);
      }
      g.outcome = "finished";
    } finally {
      g.outcome ??= "client";
      this.finish(g, true);
    }
  }

  private async freeze(g: Generation): Promise<void> {
    const retract = this.pauseMode === "retract";
    g.frozen = true;
    if (retract) {
      g.retractions++;
      g.rank.running--;
      g.rank.waiting++;
    }
    await this.untilResumed(g.signal);
    if (retract) {
      g.rank.waiting--;
      g.rank.running++;
    }
    g.frozen = false;
  }

  /** Requests admitted and not finished (SGLang's flush_cache refuses while there are any). */
  get busy(): boolean {
    return this.active.size > 0;
  }
}
