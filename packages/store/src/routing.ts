import type { RedisClient } from "./client.js";
import { keys, type Keys } from "./keys.js";

/** A routing target: one data-parallel rank of one engine, as `"<engine index>:<rank>"`. */
export function rankMember(engine: number, dpRank: number): string {
  return `${engine}:${dpRank}`;
}

export function parseRankMember(member: string): { engine: number; dpRank: number } {
  const [e, r] = member.split(":");
  return { engine: Number(e), dpRank: Number(r) };
}

// Picks the least-loaded of the configured ranks (or the one an affinity key already holds) and
// counts the new session on it, atomically so concurrent session opens spread evenly.
// KEYS: load zset, affinity key. ARGV: affinity ttl seconds (0 = no affinity), members...
const ASSIGN_SCRIPT = `
local ttl = tonumber(ARGV[1])
local valid = {}
for i = 2, #ARGV do valid[ARGV[i]] = true; redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[i]) end
if ttl > 0 then
  local held = redis.call('GET', KEYS[2])
  if held and valid[held] then
    redis.call('EXPIRE', KEYS[2], ttl)
    redis.call('ZINCRBY', KEYS[1], 1, held)
    return held
  end
end
local ranked = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, m in ipairs(ranked) do
  if valid[m] then
    redis.call('ZINCRBY', KEYS[1], 1, m)
    if ttl > 0 then redis.call('SET', KEYS[2], m, 'EX', ttl) end
    return m
  end
end
return false
`;

// Round robin: the next configured rank in turn, counted like the others.
// KEYS: load zset, counter. ARGV: members...
const ROUND_ROBIN_SCRIPT = `
local n = redis.call('INCR', KEYS[2])
local m = ARGV[((n - 1) % #ARGV) + 1]
redis.call('ZINCRBY', KEYS[1], 1, m)
return m
`;

/**
 * How a new session picks its rank: `affinity` (default) keeps sessions that share an affinity
 * key (a GRPO group) on one rank and sends the rest to the least-loaded one; `least_loaded`
 * ignores affinity keys; `round_robin` takes ranks in turn.
 */
export type RoutingPolicy = "affinity" | "least_loaded" | "round_robin";

/** The routing key family: open sessions per rank, and affinity key → rank. */
export class RankRouter {
  private readonly k: Keys;
  constructor(
    private readonly redis: RedisClient,
    prefix: string,
    private readonly affinityTtlSeconds = 24 * 3600,
  ) {
    this.k = keys(prefix);
  }

  /** Assigns a session to a rank among `members`; null when there is none. */
  async assign(members: string[], affinityKey: string | undefined, policy: RoutingPolicy = "affinity"): Promise<string | null> {
    if (members.length === 0) return null;
    if (policy === "round_robin") {
      const res = await this.redis.eval(ROUND_ROBIN_SCRIPT, 2, this.k.rankLoad(), this.k.roundRobin(), ...members);
      return typeof res === "string" ? res : null;
    }
    const ttl = affinityKey && policy === "affinity" ? this.affinityTtlSeconds : 0;
    const res = await this.redis.eval(
      ASSIGN_SCRIPT,
      2,
      this.k.rankLoad(),
      this.k.affinity(affinityKey ?? "-"),
      String(ttl),
      ...members,
    );
    return typeof res === "string" ? res : null;
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
