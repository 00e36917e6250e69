import { z } from "zod";
import type { RedisClient } from "./client.js";
import { keys, type Keys } from "./keys.js";
import { scriptCommands, type LuaScript } from "./scripts.js";

export const PauseState = z.object({
  mode: z.enum(["drain", "abort"]),
  since: z.string(),
  /** Which pause this is: replicas ignore a resume for an older pause. */
  id: z.string(),
});
export type PauseState = z.infer<typeof PauseState>;

/** What replicas tell each other over the admin channel. */
export const AdminMessage = z.discriminatedUnion("type", [
  z.object({ type: z.literal("pause"), state: PauseState }),
  z.object({ type: z.literal("resume"), id: z.string() }),
  z.object({ type: z.literal("weights"), version: z.string() }),
  /** A replica's health probes marked a rank down (or up): the others stop routing to it at once. */
  z.object({ type: z.literal("rank"), member: z.string(), down: z.boolean() }),
]);
export type AdminMessage = z.infer<typeof AdminMessage>;

/** Which engines reported `version` as their own when a load of it succeeded. */
export const LoadedEngines = z.object({ version: z.string(), engines: z.array(z.number().int().nonnegative()) });
export type LoadedEngines = z.infer<typeof LoadedEngines>;

/** A weight load under way: which version, since when, and the token of the route running it. */
export const WeightLoadMark = z.object({ version: z.string(), since: z.string(), token: z.string() });
export type WeightLoadMark = z.infer<typeof WeightLoadMark>;

// Expires or deletes the weight-load mark only when it is still the caller's. KEYS: the mark.
// ARGV: token, "expire" or "del", TTL in seconds.
const IF_OWNER = `
local raw = redis.call('GET', KEYS[1])
if not raw or cjson.decode(raw).token ~= ARGV[1] then return 0 end
if ARGV[2] == 'del' then return redis.call('DEL', KEYS[1]) end
return redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
`;

const INFLIGHT_TTL_S = 15;

// A replica's in-flight report, in one command (it is written every few ms under load; a MULTI of
// the same two writes costs four). KEYS: replicas set, the replica's report. ARGV: replica, report
// JSON, TTL in seconds.
const REPORT_INFLIGHT_SCRIPT: LuaScript = {
  name: "rollgateReportInflight",
  numberOfKeys: 2,
  lua: `
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1
`,
};

/** What a replica reports of its in-flight engine calls. */
const InflightReport = z.object({ n: z.number().int().nonnegative(), ranks: z.record(z.string(), z.number().int().nonnegative()) });

const adminScripts = (redis: RedisClient) => scriptCommands(redis, { reportInflight: REPORT_INFLIGHT_SCRIPT });

/**
 * The admin key family: pause state (a key, so a replica that starts while paused is paused, plus
 * pub/sub so running replicas hear it at once) and each replica's in-flight engine calls (a key
 * per replica with a TTL, so a dead replica stops counting).
 */
export class AdminStore {
  private readonly k: Keys;
  private readonly scripts: ReturnType<typeof adminScripts>;
  constructor(
    private readonly redis: RedisClient,
    prefix: string,
  ) {
    this.k = keys(prefix);
    this.scripts = adminScripts(redis);
  }

  channel(): string {
    return this.k.adminChannel();
  }

  async pauseState(): Promise<PauseState | null> {
    const raw = await this.redis.get(this.k.pause());
    if (!raw) return null;
    const parsed = PauseState.safeParse(JSON.parse(raw));
    return parsed.success ? parsed.data : null;
  }

  async pause(state: PauseState): Promise<void> {
    await this.redis.set(this.k.pause(), JSON.stringify(state));
    await this.publish({ type: "pause", state });
  }

  async resume(): Promise<PauseState | null> {
    const state = await this.pauseState();
    await this.redis.del(this.k.pause());
    if (state) await this.publish({ type: "resume", id: state.id });
    return state;
  }

  /**
   * Which ranks run weights the policy version does not name (a load some ranks took and others
   * did not), as a sentence; null when every rank runs the policy version's weights. Resume is
   * refused while it is set: those ranks' tokens would be stamped with the wrong version.
   */
  async mixedWeights(): Promise<string | null> {
    return this.redis.get(this.k.mixedWeights());
  }

  async setMixedWeights(description: string | null): Promise<void> {
    if (description === null) await this.redis.del(this.k.mixedWeights());
    else await this.redis.set(this.k.mixedWeights(), description);
  }

  /**
   * Marks a weight load as running (one at a time on every replica): false when another runs.
   * The mark lives `ttlS` unless refreshed, so a replica that dies mid-load does not hold it.
   */
  async beginWeightLoad(load: WeightLoadMark, ttlS: number): Promise<boolean> {
    return (await this.redis.set(this.k.weightLoad(), JSON.stringify(load), "EX", ttlS, "NX")) === "OK";
  }

  async refreshWeightLoad(token: string, ttlS: number): Promise<void> {
    await this.redis.eval(IF_OWNER, 1, this.k.weightLoad(), token, "expire", String(ttlS));
  }

  async endWeightLoad(token: string): Promise<void> {
    await this.redis.eval(IF_OWNER, 1, this.k.weightLoad(), token, "del", "");
  }

  /** The weight load running now, if any. */
  async weightLoad(): Promise<WeightLoadMark | null> {
    const raw = await this.redis.get(this.k.weightLoad());
    if (!raw) return null;
    try {
      const parsed = WeightLoadMark.safeParse(JSON.parse(raw));
      return parsed.success ? parsed.data : null;
    } catch {
      return null;
    }
  }

  /**
   * The engines the last successful load confirmed by their own reported version (`version`): such
   * an engine reporting another one later restarted on its old weights. Null after a version set
   * without a load (the engines' own versions then say nothing).
   */
  async loadedEngines(): Promise<LoadedEngines | null> {
    const raw = await this.redis.get(this.k.loadedEngines());
    if (!raw) return null;
    try {
      const parsed = LoadedEngines.safeParse(JSON.parse(raw));
      return parsed.success ? parsed.data : null;
    } catch {
      return null;
    }
  }

  async setLoadedEngines(loaded: LoadedEngines | null): Promise<void> {
    if (loaded === null) await this.redis.del(this.k.loadedEngines());
    else await this.redis.set(this.k.loadedEngines(), JSON.stringify(loaded));
  }

  async publish(msg: AdminMessage): Promise<void> {
    await this.redis.publish(this.k.adminChannel(), JSON.stringify(msg));
  }

  /**
   * Reports this replica's in-flight engine calls, in all and per rank member (refreshed
   * periodically and on every call start and end; expires if the replica dies).
   */
  async reportInflight(replica: string, count: number, perRank: Record<string, number> = {}): Promise<void> {
    await this.scripts.reportInflight(this.k.replicas(), this.k.replicaInflight(replica), replica, JSON.stringify({ n: count, ranks: perRank }), String(INFLIGHT_TTL_S));
  }

  /** Every live replica's report (dead replicas are forgotten on the way). */
  private async replicaReports(): Promise<z.infer<typeof InflightReport>[]> {
    const replicas = await this.redis.smembers(this.k.replicas());
    if (replicas.length === 0) return [];
    const raw = await this.redis.mget(...replicas.map((r) => this.k.replicaInflight(r)));
    const dead = replicas.filter((_, i) => raw[i] === null);
    if (dead.length > 0) await this.redis.srem(this.k.replicas(), ...dead);
    return raw.flatMap((r) => {
      if (r === null) return [];
      try {
        const parsed = InflightReport.safeParse(JSON.parse(r));
        return parsed.success ? [parsed.data] : [];
      } catch {
        return [];
      }
    });
  }

  /** In-flight engine calls summed over live replicas. */
  async inflight(): Promise<number> {
    return (await this.replicaReports()).reduce((n, r) => n + r.n, 0);
  }

  /** In-flight engine calls per rank member, summed over live replicas. */
  async inflightByRank(): Promise<Record<string, number>> {
    const out: Record<string, number> = {};
    for (const r of await this.replicaReports()) for (const [m, n] of Object.entries(r.ranks)) out[m] = (out[m] ?? 0) + n;
    return out;
  }

  async forgetReplica(replica: string): Promise<void> {
    await this.redis.multi().srem(this.k.replicas(), replica).del(this.k.replicaInflight(replica)).exec();
  }
}

export function parseAdminMessage(raw: string): AdminMessage | null {
  try {
    const parsed = AdminMessage.safeParse(JSON.parse(raw));
    return parsed.success ? parsed.data : null;
  } catch {
    return null;
  }
}
