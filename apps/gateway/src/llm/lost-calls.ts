import type { LostCall, Session } from "@rollgate/protocol";
import type { SessionStore } from "@rollgate/store";
import type { Logger } from "pino";
import { EngineError } from "../engines/errors.js";

/**
 * An agent call is "lost" when it failed for a reason outside the policy: the rollout it belongs
 * to must not be scored (the worker retries it or fails it as infrastructure). Refusals that are
 * the policy's own doing (session limits, bad requests, an engine 400 such as a context too long)
 * are outcomes, not lost calls.
 */

/** Engine refusals that say nothing about the policy: the engine refuses the gateway, lacks the model or route, or is overloaded. */
const ENGINE_INFRASTRUCTURE_4XX = new Set([401, 403, 404, 408, 429]);

/** What the agent was told: the status and machine kind of its error answer. */
export interface AgentFailure {
  status: number;
  kind: string;
  message: string;
}

/**
 * The lost call an agent-facing failure stands for, or null when the failure is the policy's own
 * doing. `failure` is what the agent is answered; the cause keeps the real message of an internal
 * error (the agent only sees "internal error") and the engine's address (the agent is not told it).
 */
export function lostCallOf(err: unknown, failure: AgentFailure, now: Date): LostCall | null {
  const infrastructure = failure.status >= 500 || (err instanceof EngineError && ENGINE_INFRASTRUCTURE_4XX.has(err.status));
  if (!infrastructure) return null;
  // The mark keeps the whole cause: an internal error's real message, an engine's address.
  const message = (failure.status >= 500 || err instanceof EngineError) && err instanceof Error && err.message ? err.message : failure.message;
  return { at: now.toISOString(), kind: failure.kind, status: failure.status, message: message.slice(0, 2_000) };
}

/**
 * The agent went away while its call was held at the pause gate (a weight sync took longer than
 * its SDK waits): the infrastructure kept it waiting, so the call is lost, not the agent's doing,
 * and the rollout, whose agent now fails for that reason, is not scored.
 */
export class LeftWhileHeld extends Error {
  constructor(readonly heldMs: number) {
    super(`the agent went away after its call was held ${heldMs} ms by a pause of inference`);
  }

  lostCall(now: Date): LostCall {
    return { at: now.toISOString(), kind: "left_during_pause", status: 0, message: this.message };
  }
}

interface Held {
  sid: string;
  count: number;
  first: LostCall;
  /** The token the call presented (see note): the mark counts only if it is the session's. */
  presentedTokenHash: string | null;
}

/**
 * Writes lost-call marks onto sessions. A mark that cannot be written (Redis away) is held in this
 * replica and written once Redis answers again (retried every `retryMs`); reads and closes of the
 * session on this replica see held marks, and a close writes them first. A replica that stops
 * before Redis comes back logs the marks it could not write.
 */
export class LostCallLedger {
  private readonly held = new Map<string, Held>();
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> = Promise.resolve();

  constructor(
    private readonly sessions: SessionStore,
    private readonly log: Logger,
    private readonly opts: {
      retryMs?: number;
      onNoted?: (call: LostCall) => void;
      /** Whether Redis is connected now: when it is not, a mark is held at once instead of waiting for the write to fail. */
      storeReady?: () => boolean;
    } = {},
  ) {}

  /**
   * Marks session `sid` as having lost a call. `presentedTokenHash`: the hash of the token the call
   * presented, and the mark is written only while it is the session's (a session deleted since, or
   * made again under its id, is not charged); null for marks the session's own steps make (close).
   */
  async note(sid: string, call: LostCall, presentedTokenHash: string | null): Promise<void> {
    this.opts.onNoted?.(call);
    this.log.warn({ session_id: sid, lost_call: call }, "lost LLM call: this rollout will not be scored");
    const key = heldKey(sid, presentedTokenHash);
    const pending = this.held.get(key);
    if (pending) {
      // Earlier marks are still waiting: add to them so the first cause stays the first.
      pending.count++;
      return;
    }
    try {
      if (this.opts.storeReady?.() === false) throw new Error("Redis is not connected");
      await this.sessions.noteLostCalls(sid, { count: 1, first: call }, presentedTokenHash);
    } catch (err) {
      this.log.warn({ session_id: sid, err: (err as Error).message }, "cannot store a lost-call mark now: held until Redis answers");
      this.held.set(key, { sid, count: 1, first: call, presentedTokenHash });
      this.schedule();
    }
  }

  /** The session as stored plus the marks this replica still holds for it (only those made with its own token). */
  withHeld(session: Session, tokenHash: string): Session {
    let { count, first } = session.lost_calls;
    for (const h of this.held.values()) {
      if (h.sid !== session.id || (h.presentedTokenHash !== null && h.presentedTokenHash !== tokenHash)) continue;
      count += h.count;
      if (!first || h.first.at < first.at) first = h.first;
    }
    return { ...session, lost_calls: { count, first } };
  }

  /** Writes the held marks (of one session, or all); throws when Redis still does not answer. */
  flush(sid?: string): Promise<void> {
    // One flush at a time: two at once would write the same held mark twice.
    const run = this.flushing.then(() => this.flushNow(sid));
    this.flushing = run.catch(() => undefined);
    return run;
  }

  private async flushNow(sid: string | undefined): Promise<void> {
    for (const [key, h] of [...this.held]) {
      if (sid !== undefined && h.sid !== sid) continue;
      const count = h.count;
      await this.sessions.noteLostCalls(h.sid, { count, first: h.first }, h.presentedTokenHash);
      // Marks added while the write was under way stay held for the next round.
      h.count -= count;
      if (h.count === 0) this.held.delete(key);
    }
    if (this.held.size === 0) this.unschedule();
  }

  /** Stops retrying; one last write, and a log line naming every mark that is lost with this replica. */
  async close(): Promise<void> {
    this.unschedule();
    try {
      await this.flush();
    } catch {
      const sessions = [...this.held.values()].map((h) => ({ session_id: h.sid, count: h.count, first: h.first }));
      this.log.error({ sessions }, "stopping with lost-call marks Redis never took: these sessions' rollouts may be scored");
    }
  }

  private schedule(): void {
    if (this.timer) return;
    this.timer = setInterval(() => {
      this.flush().catch(() => undefined /* still away: the next round tries again */);
    }, this.opts.retryMs ?? 1_000);
    this.timer.unref();
  }

  private unschedule(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}

function heldKey(sid: string, presentedTokenHash: string | null): string {
  return `${sid}\n${presentedTokenHash ?? ""}`;
}
