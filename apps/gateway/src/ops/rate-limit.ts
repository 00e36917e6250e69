import { RateBuckets, type RedisClient } from "@rollgate/store";
import type { FastifyReply, FastifyRequest } from "fastify";
import { CallRejected } from "../llm/chat-call.js";

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

/**
 * Per-session call rate (ROLLGATE_SESSION_RATE calls/second, bucket ROLLGATE_SESSION_BURST): the
 * store's token buckets, shared by every gateway replica.
 */
export class SessionRateLimiter {
  private readonly buckets: RateBuckets;
  constructor(
    redis: RedisClient,
    prefix: string,
    /** Calls per second; 0 turns the limiter off. */
    readonly rate: number,
    /** Calls a session may make at once after being idle (the bucket size). */
    readonly burst: number,
  ) {
    this.buckets = new RateBuckets(redis, prefix);
  }

  get enabled(): boolean {
    return this.rate > 0;
  }

  /** Takes one call from the session's bucket; resolves to 0 when allowed, else the milliseconds to wait. */
  async take(sid: string): Promise<number> {
    return this.enabled ? this.buckets.take(sid, this.rate, this.burst) : 0;
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

/** For the onSend hook (app.ts): a rate-limited answer (in whatever protocol's error shape) carries `retry-after`. */
export function retryAfterHeader(req: FastifyRequest, reply: FastifyReply): void {
  const s = (req as MarkedRequest)[kRetryAfter];
  if (s !== undefined && reply.statusCode === 429) void reply.header("retry-after", String(s));
}
