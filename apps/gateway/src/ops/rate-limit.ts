import type { RedisClient } from "@rollgate/store";
import type { FastifyReply, FastifyRequest } from "fastify";
import { CallRejected } from "../llm/chat-call.js";

/**
 * Per-session call rate (ROLLGATE_SESSION_RATE calls/second, bucket ROLLGATE_SESSION_BURST): a
 * token bucket in Redis, so every gateway replica draws from the same bucket. The clock is
 * Redis's own (TIME), so replicas with skewed clocks agree. Owns the key family
 * `<prefix>:{s:<sid>}:rate` (same hash slot as the session; expires once the bucket is full again).
 */

// KEYS: bucket. ARGV: rate (tokens/s), burst. Returns {allowed 0|1, wait_ms}.
const TAKE = `
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
`;

/** A call refused by the session rate limit: 429, rendered in the caller's protocol, with `retry-after`. */
export class RateLimited extends CallRejected {
  constructor(
    readonly retryAfterS: number,
    rate: number,
  ) {
    super(`session call rate exceeded (${rate} calls/s); retry after ${retryAfterS}s`, 429, "rate_limit_exceeded");
  }
}

const kRetryAfter = Symbol("rollgate.retryAfter");
type MarkedRequest = FastifyRequest & { [kRetryAfter]?: number };

export class SessionRateLimiter {
  constructor(
    private readonly redis: RedisClient,
    private readonly prefix: string,
    /** Calls per second; 0 turns the limiter off. */
    readonly rate: number,
    /** Calls a session may make at once after being idle (the bucket size). */
    readonly burst: number,
  ) {}

  get enabled(): boolean {
    return this.rate > 0;
  }

  key(sid: string): string {
    return `${this.prefix}:{s:${sid}}:rate`;
  }

  /** Takes one call from the session's bucket; resolves to 0 when allowed, else the milliseconds to wait. */
  async take(sid: string): Promise<number> {
    if (!this.enabled) return 0;
    const [allowed, wait] = (await this.redis.eval(TAKE, 1, this.key(sid), String(this.rate), String(this.burst))) as [number, number];
    return allowed === 1 ? 0 : Math.max(1, Number(wait));
  }

  /** Throws RateLimited (and marks the request so the answer carries `retry-after`) when the session is over its rate. */
  async check(req: FastifyRequest, sid: string): Promise<void> {
    const waitMs = await this.take(sid);
    if (waitMs === 0) return;
    const retryAfterS = Math.max(1, Math.ceil(waitMs / 1000));
    (req as MarkedRequest)[kRetryAfter] = retryAfterS;
    throw new RateLimited(retryAfterS, this.rate);
  }
}

/** onSend hook: a rate-limited answer (in whatever protocol's error shape) carries `retry-after`. */
export async function retryAfterHeader(req: FastifyRequest, reply: FastifyReply, payload: unknown): Promise<unknown> {
  const s = (req as MarkedRequest)[kRetryAfter];
  if (s !== undefined && reply.statusCode === 429) void reply.header("retry-after", String(s));
  return payload;
}
