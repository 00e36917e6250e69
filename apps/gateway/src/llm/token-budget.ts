/**
 * A session's `max_total_tokens` as a budget no call can overshoot (SECURITY.md "Limits on the
 * gateway's side"). A call may use at most what its session has left: its engine `max_tokens` is
 * capped so that its prompt plus its answer fit. Calls of one session in flight together, on any
 * gateway replica, share what is left: each holds its worst case in Redis until its record is
 * stored (store token-holds.ts, which runs `fitCall` in Lua).
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

/**
 * Tells a session's calls waiting for budget on this gateway when one of its calls here released
 * its hold (store token-holds.ts HOLDS: the holds themselves live in Redis, shared by every
 * replica). A release on another replica is not told here: a waiting call also looks again after
 * a short while.
 */
export class HoldReleases {
  private readonly waiting = new Map<string, Set<() => void>>();

  /** A call of the session released its hold: its waiting calls look again. */
  released(sid: string): void {
    const waiters = this.waiting.get(sid);
    if (!waiters) return;
    this.waiting.delete(sid);
    for (const wake of waiters) wake();
  }

  /** Resolves at the session's next release here, after `maxWaitMs`, or when `signal` aborts. */
  next(sid: string, signal: AbortSignal, maxWaitMs: number): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      let waiters = this.waiting.get(sid);
      if (!waiters) this.waiting.set(sid, (waiters = new Set()));
      const set = waiters;
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        set.delete(done);
        if (set.size === 0 && this.waiting.get(sid) === set) this.waiting.delete(sid);
        resolve();
      };
      const timer = setTimeout(done, maxWaitMs);
      signal.addEventListener("abort", done, { once: true });
      set.add(done);
    });
  }
}
