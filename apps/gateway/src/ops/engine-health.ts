import type { EngineReadiness } from "@rollgate/protocol";
import { parseRankMember, type RankRouter } from "@rollgate/store";
import type { Logger } from "pino";
import type { EngineRegistry } from "../engines/registry.js";
import { probeRank } from "./engine-control.js";

/** How many recent calls per rank the latency figures are taken over. */
const RECENT_CALLS = 100;
/** While some engine is not ready, how often its ranks are probed (whatever the health interval). */
const READINESS_PROBE_MS = 1_000;
/** At most one probe per rank this often on calls that found it unreachable (they may come by the hundred). */
const CALL_PROBE_MS = 1_000;

/**
 * How a health round tells that an engine restarted (the wire carries no start time on either
 * kind): a rank it could not reach at all answers again, or the engine's release differs from the
 * one seen before. What was probed of it once (capabilities.ts) is then forgotten, so it is probed
 * again before the next call uses it; its weights are checked by the same round (`staleWeights`).
 */
export interface RestartWatch {
  /** The engine's release as it reports it now (vLLM `/version`, SGLang `/server_info`), or null. */
  engineVersion?: (engine: number) => Promise<string | null>;
  /** Told of an engine that restarted, and why the round thinks so. */
  restarted?: (engine: number, why: string) => void;
}

export interface RankHealth {
  member: string;
  healthy: boolean;
  consecutiveFailures: number;
  lastLatencyMs: number | null;
  lastCheck: string | null;
  detail: string;
}

/**
 * Probes every rank periodically. A rank that fails `failures` probes in a row is marked down in
 * Redis (no new sessions; its sessions move on their next call); one good probe brings it back.
 * Every replica probes, and they agree through the shared down set.
 */
export class EngineHealth {
  private readonly state = new Map<string, RankHealth>();
  private timer: NodeJS.Timeout | null = null;
  private running = false;
  /** This replica's latest call latencies per rank (ms), oldest first, at most RECENT_CALLS. */
  private readonly recent = new Map<string, number[]>();
  /** Ranks down fleet-wide (the shared Redis set, refreshed every round). */
  private down = new Set<string>();
  /** Down marks made here whose write to the shared set has not finished yet. */
  private readonly unwritten = new Map<string, boolean>();
  /** While a round reads the shared set: the marks made meanwhile, applied over what it read. */
  private marksDuringRead: Array<[string, boolean]> | null = null;
  /** Ranks that have answered a probe since start: until then a rank cannot make its engine ready. */
  private readonly answered = new Set<string>();
  /** Each engine's served model once read, or why it could not be. */
  private readonly models = new Map<number, { model: string | null; error: string | null }>();
  private readinessTimer: NodeJS.Timeout | null = null;
  /** Engines a rank of which could not be reached at all since it last answered (down, or restarting). */
  private readonly unreached = new Set<number>();
  /** Each engine's release as last read. */
  private readonly releases = new Map<number, string>();
  /** When a failed call last had its rank probed (or is having it probed: not again until it ends), per rank. */
  private readonly callProbes = new Map<string, number>();
  /** Only with periodic rounds: they alone bring a drained rank of a ready engine back. */
  private drainsOnCalls = false;

  constructor(
    private readonly registry: EngineRegistry,
    private readonly router: RankRouter,
    private readonly failures: number,
    private readonly log: Logger,
    /** Tells the other replicas at once (they also re-read the shared set every round). */
    private readonly announce: (member: string, down: boolean) => Promise<void> = async () => undefined,
    /**
     * Whether inference is paused: probes are real one-token generations, which a paused engine
     * holds until resume, so a weight update longer than the probe timeout would drain every rank.
     */
    private readonly paused: () => boolean = () => false,
    /**
     * Why an engine's weights are not the policy version's it loaded (it restarted on its old
     * ones), or null: such an engine's ranks are drained at once, or its tokens would be stamped
     * with a version that did not sample them.
     */
    private readonly staleWeights: (engine: number) => Promise<string | null> = async () => null,
    private readonly restarts: RestartWatch = {},
  ) {
    for (const m of registry.members()) {
      this.state.set(m, { member: m, healthy: true, consecutiveFailures: 0, lastLatencyMs: null, lastCheck: null, detail: "not probed yet" });
    }
  }

  /**
   * Periodic probes every `intervalS` (0: none), which drain failing ranks; and, whatever the
   * interval, readiness probes every second while some engine is not ready (they never drain: a
   * rank that has not answered yet is not a rank that failed).
   */
  start(intervalS: number): void {
    // A round that fails (Redis unreachable) is logged and the next one tries again: an unhandled
    // rejection here would take the whole gateway down during a Redis restart.
    const round = (drain: boolean, only?: string[]) =>
      this.checkAll({ drain, ...(only ? { only } : {}) }).catch((err: Error) => this.log.warn({ err: err.message }, "engine health round failed"));
    this.drainsOnCalls = intervalS > 0;
    if (intervalS > 0) {
      this.timer = setInterval(() => void round(true), intervalS * 1000);
      this.timer.unref();
    }
    void round(false);
    this.readinessTimer = setInterval(() => {
      const targets = this.readinessTargets();
      if (targets.length > 0) void round(false, targets);
    }, READINESS_PROBE_MS);
    this.readinessTimer.unref();
  }

  /** Ranks a readiness probe is for: those that never answered, and every rank of an engine that is not ready. */
  private readinessTargets(): string[] {
    const notReady = new Set(this.readiness().filter((e) => !e.ready).map((e) => e.engine));
    return this.registry.members().filter((m) => !this.answered.has(m) || notReady.has(parseRankMember(m).engine));
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    if (this.readinessTimer) clearInterval(this.readinessTimer);
  }

  /**
   * Each engine's readiness: at least one rank that answered a probe and is not drained (here or
   * fleet-wide), and its served model known.
   */
  readiness(): EngineReadiness[] {
    return this.registry.engines.map((cfg, engine) => {
      const members = this.registry.members().filter((m) => parseRankMember(m).engine === engine);
      const healthy = members.filter((m) => this.answered.has(m) && this.state.get(m)?.healthy !== false && !this.down.has(m));
      const known = cfg.model ? { model: cfg.model, error: null } : (this.models.get(engine) ?? { model: null, error: null });
      const reasons: string[] = [];
      if (healthy.length === 0) {
        const details = members.map((m) => `rank ${parseRankMember(m).dpRank}: ${this.rankProblem(m)}`);
        reasons.push(`no rank answers (${details.join("; ")})`);
      }
      if (!known.model) reasons.push(known.error ? `model unknown: ${known.error}` : "model not read yet");
      return {
        engine,
        kind: cfg.kind,
        url: cfg.url,
        ready: reasons.length === 0,
        model: known.model,
        ranks: members.length,
        healthy_ranks: healthy.length,
        reason: reasons.length ? reasons.join("; ") : null,
      };
    });
  }

  private rankProblem(member: string): string {
    const h = this.state.get(member);
    if (this.down.has(member) || h?.healthy === false) return `drained (${h?.detail ?? "marked down"})`;
    return h?.lastCheck ? h.detail : "not probed yet";
  }

  isDown(member: string): boolean {
    return this.down.has(member);
  }

  /** Another replica marked a rank down or up. */
  heard(member: string, down: boolean): void {
    this.mark(member, down);
  }

  /** Marks a rank down or up here at once; `refreshDown` keeps the mark over an older read of the shared set. */
  private mark(member: string, down: boolean): boolean {
    const changed = down ? !this.down.has(member) : this.down.has(member);
    if (down) this.down.add(member);
    else this.down.delete(member);
    this.marksDuringRead?.push([member, down]);
    return changed;
  }

  /** Marks a rank down or up here, tells the other replicas, and writes the shared set. */
  private async markShared(member: string, down: boolean): Promise<void> {
    const changed = this.mark(member, down);
    this.unwritten.set(member, down);
    try {
      // Announced first, so a replica has heard it by the time the shared set shows it.
      if (down) await this.announce(member, true);
      await this.router.setDown(member, down);
      if (!down && changed) await this.announce(member, false);
    } finally {
      if (this.unwritten.get(member) === down) this.unwritten.delete(member);
    }
  }

  /**
   * Reads the shared down set. A mark made here or heard while the read runs, or made before it
   * but not yet written, is newer than what the read may return, so it is kept over it: a rank a
   * failed call had just drained would otherwise be routed to again until the next round.
   */
  private async refreshDown(): Promise<void> {
    const marks: Array<[string, boolean]> = [...this.unwritten];
    this.marksDuringRead = marks;
    try {
      const fleet = await this.router.downRanks();
      for (const [member, down] of marks) {
        if (down) fleet.add(member);
        else fleet.delete(member);
      }
      this.down = fleet;
    } finally {
      this.marksDuringRead = null;
    }
  }

  snapshot(): RankHealth[] {
    return [...this.state.values()];
  }

  /** Notes how long a call on a rank took (this replica's view). */
  recordCall(member: string, latencyMs: number): void {
    let ring = this.recent.get(member);
    if (!ring) this.recent.set(member, (ring = []));
    ring.push(latencyMs);
    if (ring.length > RECENT_CALLS) ring.shift();
  }

  /** p50 / p95 of the rank's recent call latencies on this replica, or null before its first call. */
  recentLatency(member: string): { calls: number; p50_ms: number; p95_ms: number } | null {
    const ring = this.recent.get(member);
    if (!ring || ring.length === 0) return null;
    const sorted = [...ring].sort((a, b) => a - b);
    const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
    return { calls: sorted.length, p50_ms: at(0.5), p95_ms: at(0.95) };
  }

  /** Reads each engine's release: one that differs from the release read before is a restart. */
  private async watchReleases(engines: number[]): Promise<void> {
    const read = this.restarts.engineVersion;
    if (!read) return;
    await Promise.all(
      engines.map(async (engine) => {
        const release = await read(engine).catch(() => null);
        if (release === null) return;
        const before = this.releases.get(engine);
        this.releases.set(engine, release);
        if (before !== undefined && before !== release) this.restarted(engine, `its release changed from ${before} to ${release}`);
      }),
    );
  }

  private restarted(engine: number, why: string): void {
    this.log.warn({ engine, url: this.registry.engines[engine]?.url, why }, "engine restarted: what was probed of it is probed again before its next call");
    this.restarts.restarted?.(engine, why);
  }

  /**
   * An answer of the engine named other weights than the ones it was loaded with: checked again
   * against Redis and the engine itself (`staleWeights`), since a replica that missed a weights
   * message would blame a sound engine, and the engine's ranks are drained at once if it holds.
   */
  async checkStale(engine: number): Promise<void> {
    const why = await this.staleWeights(engine).catch(() => null);
    if (why !== null) await this.drainEngine(engine, why);
  }

  /**
   * Drains every rank of an engine at once: its probes keep it drained while `staleWeights` still
   * finds it so, and bring it back once its weights are loaded again.
   */
  async drainEngine(engine: number, why: string): Promise<void> {
    const members = this.registry.members().filter((m) => parseRankMember(m).engine === engine);
    for (const member of members) {
      const h = this.state.get(member)!;
      h.detail = why;
      h.lastCheck = new Date().toISOString();
      if (h.healthy) this.log.warn({ rank: member, detail: why }, "engine rank drained");
      h.healthy = false;
      await this.markShared(member, true);
    }
  }

  /**
   * A call found its rank unreachable: the rank is probed now, not at the next round
   * (ROLLGATE_HEALTH_INTERVAL_S), during which every call of its sessions would fail as a lost
   * call. A probe that confirms it drains the rank (the call counts as one failure), so its
   * sessions move to healthy ranks on their next call (Rerouter). One probe per rank at a time and
   * at most one a second; none while paused (a paused engine holds probes), none for a rank
   * already drained (the rounds bring it back), and none without periodic rounds
   * (ROLLGATE_HEALTH_INTERVAL_S=0: nothing would bring the rank back).
   */
  async callFailed(member: string): Promise<void> {
    const last = this.callProbes.get(member);
    if (!this.drainsOnCalls || !this.state.has(member) || this.down.has(member) || this.paused() || (last !== undefined && Date.now() - last < CALL_PROBE_MS)) return;
    this.callProbes.set(member, Number.POSITIVE_INFINITY);
    try {
      await this.probeOne(member, true, (engine) => this.staleWeights(engine).catch(() => null), true);
    } finally {
      this.callProbes.set(member, Date.now());
    }
  }

  /**
   * Probes one rank and notes what it found. `callFailed`: a call just found the rank unreachable,
   * which counts as a failure of its own, so a probe that confirms it drains the rank at once with
   * the default ROLLGATE_HEALTH_FAILURES (2).
   */
  private async probeOne(member: string, drain: boolean, staleOf: (engine: number) => Promise<string | null>, callFailed = false): Promise<void> {
      const { engine, dpRank } = parseRankMember(member);
      const cfg = this.registry.engines[engine]!;
      const model = await this.registry.servedModel(engine).then(
        (m) => {
          this.models.set(engine, { model: m, error: null });
          return m;
        },
        (err: Error) => {
          if (!this.models.get(engine)?.model) this.models.set(engine, { model: null, error: err.message });
          return cfg.model ?? "";
        },
      );
      const probe = await probeRank(this.registry.dispatcher, cfg, model, dpRank);
      if (!probe.reachable && this.answered.has(member)) this.unreached.add(engine);
      else if (probe.ok && this.unreached.delete(engine)) this.restarted(engine, "it answers again after it could not be reached");
      const staleWhy = probe.ok ? await staleOf(engine) : null;
      if (staleWhy !== null) Object.assign(probe, { ok: false, detail: staleWhy });
      const h = this.state.get(member)!;
      h.lastCheck = new Date().toISOString();
      h.lastLatencyMs = probe.latencyMs;
      h.detail = probe.detail;
      if (probe.ok) {
        if (!this.answered.has(member)) this.log.info({ rank: member, model }, "engine rank answers");
        this.answered.add(member);
        if (!h.healthy) this.log.warn({ rank: member }, "engine rank healthy again");
        h.consecutiveFailures = 0;
        h.healthy = true;
        await this.markShared(member, false);
      } else if (drain) {
        h.consecutiveFailures += callFailed ? 2 : 1;
        // Stale weights are not a passing fault: drained at the first probe that sees them.
        if ((h.consecutiveFailures >= this.failures || staleWhy !== null) && h.healthy) {
          h.healthy = false;
          this.log.warn({ rank: member, detail: probe.detail }, "engine rank failing health checks: drained");
          await this.markShared(member, true);
        }
      }
  }

  /**
   * One round of probes (also callable directly, e.g. from tests), of every rank or of `only`.
   * `drain: false` (readiness probes) only notes ranks that answer; failures count towards
   * draining only in periodic rounds.
   */
  async checkAll({ drain = true, only }: { drain?: boolean; only?: string[] } = {}): Promise<void> {
    if (this.running || this.paused()) return;
    this.running = true;
    try {
      const stale = new Map<number, Promise<string | null>>();
      const staleOf = (engine: number) => {
        if (!stale.has(engine)) stale.set(engine, this.staleWeights(engine).catch(() => null));
        return stale.get(engine)!;
      };
      const members = only ?? this.registry.members();
      // Read alongside the probes: a hung engine holds the round for one timeout, not two.
      const releases = this.watchReleases([...new Set(members.map((m) => parseRankMember(m).engine))]);
      await Promise.all([
        releases,
        ...members.map((member) => this.probeOne(member, drain, staleOf)),
      ]);
      await this.refreshDown();
    } finally {
      this.running = false;
    }
  }
}

