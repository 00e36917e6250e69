import type { RedisClient } from "./client.js";
import { keys, type Keys } from "./keys.js";
import { scriptCommands, type LuaScript } from "./scripts.js";

/** A routing target: one data-parallel rank of one engine, as `"<engine index>:<rank>"`. */
export function rankMember(engine: number, dpRank: number): string {
  return `${engine}:${dpRank}`;
}

export function parseRankMember(member: string): { engine: number; dpRank: number } {
  const [e, r] = member.split(":");
  return { engine: Number(e), dpRank: Number(r) };
}

// Picks the least-loaded of the configured ranks (or the one an affinity key already holds, unless
// it carries `max skew` or more sessions than the least-loaded one: then the key moves to the
// least-loaded rank, and the rest of its group follows) and counts the new session on it,
// atomically so concurrent session opens spread evenly.
// KEYS: load zset, affinity key. ARGV: affinity ttl seconds (0 = no affinity), max skew, members...
const ASSIGN_SCRIPT: LuaScript = {
  name: "rollgateRankAssign",
  numberOfKeys: 2,
  lua: `
local ttl = tonumber(ARGV[1])
local skew = tonumber(ARGV[2])
local valid = {}
for i = 3, #ARGV do valid[ARGV[i]] = true; redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[i]) end
local least = nil
local leastLoad = nil
local ranked = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #ranked, 2 do
  if valid[ranked[i]] then least = ranked[i]; leastLoad = tonumber(ranked[i + 1]); break end
end
if not least then return false end
if ttl > 0 then
  local held = redis.call('GET', KEYS[2])
  if held and valid[held] then
    local load = tonumber(redis.call('ZSCORE', KEYS[1], held))
    if load - leastLoad < skew then
      redis.call('EXPIRE', KEYS[2], ttl)
      redis.call('ZINCRBY', KEYS[1], 1, held)
      return held
    end
  end
end
redis.call('ZINCRBY', KEYS[1], 1, least)
if ttl > 0 then redis.call('SET', KEYS[2], least, 'EX', ttl) end
return least
`,
};

// Round robin: the next configured rank in turn, counted like the others.
// KEYS: load zset, counter. ARGV: members...
const ROUND_ROBIN_SCRIPT: LuaScript = {
  name: "rollgateRankRoundRobin",
  numberOfKeys: 2,
  lua: `
local n = redis.call('INCR', KEYS[2])
local m = ARGV[((n - 1) % #ARGV) + 1]
redis.call('ZINCRBY', KEYS[1], 1, m)
return m
`,
};

const routingScripts = (redis: RedisClient) => scriptCommands(redis, { assign: ASSIGN_SCRIPT, roundRobin: ROUND_ROBIN_SCRIPT });

/**
 * How a new session picks its rank: `least_loaded` (default) takes the rank with the fewest open
 * sessions; `affinity` keeps sessions that share an affinity key (a GRPO group) on one rank while
 * it is healthy and not overloaded, for the prefix cache, and sends the rest to the least-loaded
 * one; `round_robin` takes ranks in turn.
 */
export type RoutingPolicy = "affinity" | "least_loaded" | "round_robin";

/** The routing key family: open sessions per rank, and affinity key → rank. */
export class RankRouter {
  private readonly k: Keys;
  private readonly affinityTtlSeconds: number;
  private readonly maxSkew: number;
  private readonly scripts: ReturnType<typeof routingScripts>;

  /**
   * `maxSkew`: an affinity rank that has this many more open sessions than the least-loaded rank
   * counts as overloaded, and its key moves. `affinityTtlSeconds`: how long an idle key is kept.
   */
  constructor(
    private readonly redis: RedisClient,
    prefix: string,
    options: { maxSkew?: number; affinityTtlSeconds?: number } = {},
  ) {
    this.k = keys(prefix);
    this.scripts = routingScripts(redis);
    this.maxSkew = options.maxSkew ?? 16;
    this.affinityTtlSeconds = options.affinityTtlSeconds ?? 24 * 3600;
  }

  /** Assigns a session to a rank among `members`; null when there is none. */
  async assign(members: string[], affinityKey: string | undefined, policy: RoutingPolicy = "affinity"): Promise<string | null> {
    if (members.length === 0) return null;
    if (policy === "round_robin") {
      const res = await this.scripts.roundRobin(this.k.rankLoad(), this.k.roundRobin(), ...members);
      return typeof res === "string" ? res : null;
    }
    const ttl = affinityKey && policy === "affinity" ? this.affinityTtlSeconds : 0;
    const res = await this.scripts.assign(
      this.k.rankLoad(),
      this.k.affinity(affinityKey ?? "-"),
      String(ttl),
      String(this.maxSkew),
      ...members,
    );
    return typeof res === "string" ? res : null;
  }

  /**
   * Sessions under `affinityKey` start on `member` unless the key already holds a rank (then
   * `assign` with the affinity policy keeps them there, or moves the key when the rank is down or
   * overloaded).
   */
  async prefer(affinityKey: string, member: string): Promise<void> {
    await this.redis.set(this.k.affinity(affinityKey), member, "EX", this.affinityTtlSeconds, "NX");
  }

  /** Marks a rank down (no new sessions; its sessions move on their next call) or up again. */
  async setDown(member: string, down: boolean): Promise<void> {
    if (down) await this.redis.sadd(this.k.downRanks(), member);
    else await this.redis.srem(this.k.downRanks(), member);
  }

  async downRanks(): Promise<Set<string>> {
    return new Set(await this.redis.smembers(this.k.downRanks()));
  }

  /** Gives back one session's slot on a rank (its session moved to another rank). */
  async release(member: string): Promise<void> {
    await this.redis.zincrby(this.k.rankLoad(), -1, member);
  }

  async loads(): Promise<Record<string, number>> {
    const flat = await this.redis.zrange(this.k.rankLoad(), "0", "-1", "WITHSCORES");
    const out: Record<string, number> = {};
    for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]!] = Number(flat[i + 1]);
    return out;
  }
}
