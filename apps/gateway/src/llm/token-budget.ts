/**
 * A session's `max_total_tokens` as a budget no call can overshoot (SECURITY.md "Limits on the
 * gateway's side"). A call may use at most what its session has left: its engine `max_tokens` is
 * capped so that its prompt plus its answer fit. Calls of one session in flight together on this
 * gateway share what is left: each holds its worst case until its record is stored.
 */

/** What the budget decides for one call. */
export type BudgetFit =
  /** The call goes: `maxTokens` is what the engine is sent (the asked value when nothing is capped); `hold` its worst case. */
  | { fits: true; maxTokens: number | undefined; hold: number }
  /** The call's prompt must be known to fit it (the engine renders it, and it may not fit whole). */
  | { fits: false; why: "prompt_unknown" }
  /** Its prompt alone (plus one answer token) does not fit in what is left. */
  | { fits: false; why: "over" };

/**
 * Fits a call into `left` tokens. `promptLength`: the call's prompt in tokens when the gateway
 * knows it (token-in calls, or a render); `asked`: the max_tokens the agent (or the session's
 * sampling) asked, if any; `maxModelLen`: the engine's context length when known. The engine
 * bounds every call's prompt plus answer by its context length, so a call whose prompt is unknown
 * needs no cap while that length fits in what is left.
 */
export function fitCall(left: number, promptLength: number | null, asked: number | undefined, maxModelLen: number | null): BudgetFit {
  if (promptLength === null) {
    if (maxModelLen !== null && maxModelLen <= left) return { fits: true, maxTokens: asked, hold: maxModelLen };
    return { fits: false, why: "prompt_unknown" };
  }
  const room = left - promptLength;
  if (room < 1) return { fits: false, why: "over" };
  // What the engine would allow without a cap: the asked value, else the rest of its context.
  const allowed = asked ?? (maxModelLen !== null ? maxModelLen - promptLength : undefined);
  if (allowed !== undefined && allowed <= room) return { fits: true, maxTokens: asked, hold: promptLength + allowed };
  return { fits: true, maxTokens: room, hold: promptLength + room };
}

/** One session's calls in flight here: what each holds, what was released so far, how many are being fitted. */
interface SessionHolds {
  calls: Map<number, number>;
  released: number;
  fitting: number;
  waiting: Set<() => void>;
}

/**
 * The worst cases held by each session's calls in flight on this gateway, from when a call is
 * fitted until its record is stored (its tokens are then in the session's counts) or it ends
 * without one. A call that does not fit while others hold part of the budget waits for them.
 * A call being fitted reads the session's counts, which may or may not include a call released
 * meanwhile: what was released since its read is counted as still held (never under-counted).
 */
export class TokenHolds {
  private readonly sessions = new Map<string, SessionHolds>();

  private of(sid: string): SessionHolds {
    let s = this.sessions.get(sid);
    if (!s) this.sessions.set(sid, (s = { calls: new Map(), released: 0, fitting: 0, waiting: new Set() }));
    return s;
  }

  private forget(sid: string, s: SessionHolds): void {
    if (s.calls.size === 0 && s.fitting === 0 && s.waiting.size === 0) this.sessions.delete(sid);
  }

  /** A call of the session starts being fitted: `released()` tells what was released since; `done()` when it is fitted or refused. */
  fitting(sid: string): { released: () => number; since: () => void; done: () => void } {
    const s = this.of(sid);
    s.fitting++;
    let mark = s.released;
    return {
      released: () => s.released - mark,
      since: () => (mark = s.released),
      done: () => {
        s.fitting--;
        this.forget(sid, s);
      },
    };
  }

  /** What the session's other calls in flight hold. */
  heldByOthers(sid: string, seq: number): number {
    let sum = 0;
    for (const [s, tokens] of this.sessions.get(sid)?.calls ?? []) if (s !== seq) sum += tokens;
    return sum;
  }

  /** Whether another call of the session holds part of its budget. */
  othersHold(sid: string, seq: number): boolean {
    const calls = this.sessions.get(sid)?.calls;
    return !!calls && (calls.size > 1 || (calls.size === 1 && !calls.has(seq)));
  }

  hold(sid: string, seq: number, tokens: number): void {
    this.of(sid).calls.set(seq, tokens);
  }

  /** The call's tokens are counted (or it ended without any): its hold goes, and waiting calls look again. */
  release(sid: string, seq: number): void {
    const s = this.sessions.get(sid);
    const tokens = s?.calls.get(seq);
    if (!s || tokens === undefined) return;
    s.calls.delete(seq);
    s.released += tokens;
    const waiters = [...s.waiting];
    s.waiting.clear();
    for (const wake of waiters) wake();
    this.forget(sid, s);
  }

  /** Resolves at the session's next release, or when `signal` aborts. */
  nextRelease(sid: string, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const s = this.of(sid);
      const wake = () => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      };
      const onAbort = () => {
        s.waiting.delete(wake);
        resolve();
      };
      s.waiting.add(wake);
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }
}
