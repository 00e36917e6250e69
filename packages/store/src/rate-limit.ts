import type { RedisClient } from "./client.js";
import { keys, type Keys } from "./keys.js";
import { scriptCommands, type LuaScript } from "./scripts.js";

// KEYS: bucket. ARGV: rate (tokens/s), burst. Returns {allowed 0|1, wait_ms}.
const TAKE_SCRIPT: LuaScript = {
  name: "rollgateRateTake",
  numberOfKeys: 1,
  lua: `
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(h[1])
local ts = tonumber(h[2])
if tokens == nil or ts == nil then tokens = burst; ts = now end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local allowed = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, wait}
`,
};

const rateScripts = (redis: RedisClient) => scriptCommands(redis, { take: TAKE_SCRIPT });

/**
 * The per-session call-rate key family (`sessionRate`): one token bucket per session, in Redis so
 * every gateway replica draws from the same bucket. The clock is Redis's own (TIME), so replicas
 * with skewed clocks agree. A bucket shares its session's hash slot and expires once full again.
 */
export class RateBuckets {
  private readonly k: Keys;
  private readonly scripts: ReturnType<typeof rateScripts>;
  constructor(redis: RedisClient, prefix: string) {
    this.k = keys(prefix);
    this.scripts = rateScripts(redis);
  }

  /** Takes one call from the session's bucket (`rate` calls/s, `burst` at most); 0 when allowed, else the milliseconds to wait. */
  async take(sid: string, rate: number, burst: number): Promise<number> {
    const [allowed, wait] = (await this.scripts.take(this.k.sessionRate(sid), String(rate), String(burst))) as [number, number];
    return allowed === 1 ? 0 : Math.max(1, Number(wait));
  }
}
