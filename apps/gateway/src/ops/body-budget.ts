import type { IncomingHttpHeaders } from "node:http";
import type { FastifyReply, FastifyRequest } from "fastify";

/**
 * The bytes of agent request bodies this gateway holds at once, over every sandbox it serves.
 *
 * One body may be 64 MiB and one sandbox may have 32 calls in flight (its relay's cap): a policy
 * that learned to send huge bodies, running in every sandbox at once as RL runs it, would have the
 * gateway read and parse gigabytes together until the process died, taking every rollout's calls
 * with it (lost calls: rollouts left unscored, which is an escape from a bad score too). Past the
 * budget a call waits, its body unread in its socket (TCP holds the sender back), and is read when
 * earlier bodies are done with: a call is delayed, never refused. First come, first served, so a
 * large body is not starved by small ones.
 *
 * A body is held from the moment it may be read until its answer ends (the parsed request lives
 * as long as the call). Its size is its `content-length`; a chunked body, whose size is unknown
 * until it ends, holds the largest a body may be until it has arrived, then its own size.
 *
 * A body that is granted its bytes must then arrive within `bodyTimeoutMs` and a second more per
 * MiB (a large body on a busy machine takes a while): a sandbox that sends its bodies a byte at a
 * time would otherwise hold the budget for ever. Past it the connection is closed (a call the agent
 * never finished sending: no call was made, nothing is recorded).
 */
export class BodyBudget {
  private used = 0;
  private readonly waiting: { bytes: number; grant: () => void }[] = [];
  /** Requests holding bytes whose body may still be arriving, with the time it must have arrived by. */
  private readonly reading = new Map<FastifyRequest, number>();
  /** What each request holding bytes holds now (a chunked body's largest size until it has arrived). */
  private readonly holding = new WeakMap<FastifyRequest, { bytes: number }>();
  private sweep: NodeJS.Timeout | null = null;

  constructor(
    /** The bytes of bodies held at once (at least `maxBody`). */
    readonly total: number,
    /** The largest body an agent route takes (larger ones are refused with a 413 before they are read). */
    readonly maxBody: number,
    readonly bodyTimeoutMs: number,
    /** Told of each connection closed because its body did not arrive in time (metrics). */
    private readonly onTimedOut: () => void = noop,
  ) {
    if (total < maxBody) throw new Error(`the body budget (${total} bytes) is below the largest body (${maxBody} bytes)`);
  }

  /** Bytes held by bodies being read or in calls. */
  get inUse(): number {
    return this.used;
  }

  /** Calls waiting for bytes, their bodies not read yet. */
  get queued(): number {
    return this.waiting.length;
  }

  /**
   * Calls `grant` once `bytes` are held for the caller: at once when they fit and nobody waits
   * before, else when enough is released. Returns how to leave the queue before being granted.
   */
  reserve(bytes: number, grant: () => void): () => void {
    if (this.waiting.length === 0 && this.used + bytes <= this.total) {
      this.used += bytes;
      grant();
      return noop;
    }
    const waiter = { bytes, grant };
    this.waiting.push(waiter);
    return () => {
      const i = this.waiting.indexOf(waiter);
      if (i < 0) return;
      this.waiting.splice(i, 1);
      // The head may have been the one holding the others back.
      if (i === 0) this.wake();
    };
  }

  release(bytes: number): void {
    this.used -= bytes;
    this.wake();
  }

  private wake(): void {
    while (this.waiting.length > 0 && this.used + this.waiting[0]!.bytes <= this.total) {
      const next = this.waiting.shift()!;
      this.used += next.bytes;
      next.grant();
    }
  }

  /**
   * onRequest for the agent routes (callback style: no promise per call): a request with a body
   * takes its bytes before Fastify reads it, and gives them back when its answer ends or its
   * connection closes.
   */
  readonly hook = (req: FastifyRequest, reply: FastifyReply, done: () => void): void => {
    const bytes = bodyBytes(req.headers, this.maxBody);
    if (bytes === 0) return done();
    let held = false;
    let gone = false;
    const holds = { bytes };
    const leave = this.reserve(bytes, () => {
      held = true;
      this.holding.set(req, holds);
      if (!req.raw.complete) this.watch(req, bytes);
      done();
    });
    // The answer's end, or its connection's: an answer queued behind an earlier one on its
    // connection (HTTP/1.1 pipelining) is given no "close" of its own when the connection goes.
    const socket = req.raw.socket;
    const ended = () => {
      if (gone) return;
      gone = true;
      reply.raw.off("close", ended);
      socket.off("close", ended);
      this.reading.delete(req);
      // The agent went away while its call waited: it leaves the queue, and the request goes no
      // further (its connection is closed; nothing was read, nothing is answered).
      if (held) this.release(holds.bytes);
      else leave();
    };
    reply.raw.once("close", ended);
    socket.once("close", ended);
  };

  /**
   * The request's body has arrived whole, `bytes` long: a chunked body, held at the largest a body
   * may be, holds its own size from now on (held at the largest for its whole call, a few small
   * chunked calls held every other agent call back until they were answered).
   */
  bodyRead(req: FastifyRequest, bytes: number): void {
    const holds = this.holding.get(req);
    if (!holds || bytes >= holds.bytes) return;
    const extra = holds.bytes - bytes;
    holds.bytes = bytes;
    this.release(extra);
  }

  private watch(req: FastifyRequest, bytes: number): void {
    this.reading.set(req, Date.now() + this.bodyTimeoutMs + Math.floor((bytes / MiB) * 1000));
    this.sweep ??= setInterval(() => this.closeLate(), Math.min(1_000, this.bodyTimeoutMs)).unref();
  }

  /** Closes the connections whose body has not arrived within the timeout (one timer for all). */
  private closeLate(): void {
    const now = Date.now();
    for (const [req, deadline] of this.reading) {
      if (req.raw.complete) this.reading.delete(req);
      else if (now > deadline) {
        this.reading.delete(req);
        this.onTimedOut();
        req.log.warn({ body_bytes: Number(req.headers["content-length"]) || null }, "an agent request's body did not arrive in time: its connection is closed");
        req.raw.socket.destroy();
      }
    }
    if (this.reading.size === 0 && this.sweep) {
      clearInterval(this.sweep);
      this.sweep = null;
    }
  }

  close(): void {
    if (this.sweep) clearInterval(this.sweep);
    this.sweep = null;
  }
}

const noop = (): void => undefined;
const MiB = 2 ** 20;

/**
 * The bytes a request's body will take: its `content-length`, or `maxBody` for a chunked one; 0
 * for no body and for one over `maxBody` (Fastify refuses that with a 413 without reading it).
 */
export function bodyBytes(headers: IncomingHttpHeaders, maxBody: number): number {
  const declared = headers["content-length"];
  if (declared !== undefined) {
    const n = Number(declared);
    return Number.isSafeInteger(n) && n > 0 && n <= maxBody ? n : 0;
  }
  return headers["transfer-encoding"] !== undefined ? maxBody : 0;
}
