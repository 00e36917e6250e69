import type { LostCall } from "@rollgate/protocol";
import type { SessionStore } from "@rollgate/store";
import type { Logger } from "pino";
import type { LostCallLedger } from "./lost-calls.js";

/** How often a reader looks again at a session's pending calls while it waits for them. */
const POLL_MS = 5;
/**
 * How long a call waits for the session's earlier calls to be stored when it echoes a turn no
 * record answers: a record reaches Redis within a millisecond or two, and an earlier call still
 * running (the session's calls overlap) must not hold this one up long.
 */
const ECHO_WAIT_MS = 250;

/**
 * The calls whose record is still being written. An agent is answered as soon as the engine's
 * answer is complete; its record (and its task event) is stored after. Every call's number is in
 * its session's pending set in Redis from when it is taken until its record is stored or the call
 * ends without one (store PENDING), so whoever must see every record waits for that set to empty,
 * on any replica: close, the trajectory and records of a closed session. The appends this process
 * has started are also kept here, so a reader on this replica (and the session's next call, which
 * restores its echoed turns from the records) waits for them without asking Redis.
 *
 * An append that fails is logged, counted and marks its session as having lost a call, as a call
 * whose gateway died does; a call still pending when its session's close has waited `waitMs`
 * (its gateway stopped, or it was still running) is marked lost at close.
 */
export class PendingCalls {
  private readonly inProcess = new Map<string, Set<Promise<void>>>();
  /** Calls whose record this process is writing: never settled as having none. */
  private readonly recording = new Set<string>();

  constructor(
    private readonly deps: {
      sessions: SessionStore;
      log: Logger;
      /** Where a call whose record was never written is marked (the session's rollout is not scored). */
      lostCalls?: LostCallLedger;
      countError?: (what: string) => void;
      /** How long close waits for the session's pending calls before it marks them lost. */
      waitMs: number;
    },
  ) {}

  /** Tracks the write of call `seq`'s record; a failed write is logged, counted and makes the call lost. */
  track(sid: string, seq: number, write: Promise<unknown>): void {
    const key = `${sid}\n${seq}`;
    this.recording.add(key);
    const done = write.finally(() => this.recording.delete(key)).then(
      () => undefined,
      async (err: unknown) => {
        this.deps.countError?.("record_append");
        this.deps.log.error({ session_id: sid, seq, err: (err as Error).message }, "the record of an answered call could not be stored: the call is lost");
        const lost: LostCall = { at: new Date().toISOString(), kind: "record_not_written", status: 200, message: `call ${seq} was answered but its record could not be stored: ${(err as Error).message}`.slice(0, 2_000) };
        try {
          // The ledger holds the mark while Redis is away; the call then stops being pending, so a close does not count it twice.
          await this.deps.lostCalls?.note(sid, lost, null);
          await this.deps.sessions.settleCall(sid, seq);
        } catch {
          // Still pending: its session's close marks it lost again (over-counted, never missed).
        }
      },
    );
    this.add(sid, done);
  }

  /**
   * Call `seq` ended without a record (refused, failed, abandoned): it is no longer pending. Not
   * awaited by the call. `tokenHash`: the token the call was authorised with; then only while the
   * session still has it (a session made again under its id has its own call `seq`).
   */
  settle(sid: string, seq: number, tokenHash?: string): void {
    if (this.recording.has(`${sid}\n${seq}`)) return;
    const settling = tokenHash === undefined ? this.deps.sessions.settleCall(sid, seq) : this.deps.sessions.settleOwnCall(sid, seq, tokenHash);
    const done = settling.catch((err: Error) => {
      // Left pending, the call is marked lost when its session closes: a rollout over-counted, never one missing a record.
      this.deps.countError?.("pending_settle");
      this.deps.log.warn({ session_id: sid, seq, err: err.message }, "cannot clear a call that ended without a record from its session's pending calls");
    });
    this.add(sid, done);
  }

  /**
   * Call `seq` never was one (its body failed before the engine was asked anything): no longer
   * pending, and its number is taken again by the session's next call if no later one was taken
   * since (store giveBackCall). Resolves once Redis has it, so the agent's next call sees it.
   */
  async giveBack(sid: string, seq: number, tokenHash: string): Promise<void> {
    const done = this.deps.sessions.giveBackCall(sid, seq, tokenHash).then(
      () => undefined,
      (err: Error) => {
        // Left pending, the call is marked lost when its session closes: over-counted, never missed.
        this.deps.countError?.("pending_settle");
        this.deps.log.warn({ session_id: sid, seq, err: err.message }, "cannot give back the number of a call whose body failed");
      },
    );
    this.add(sid, done);
    await done;
  }

  /** Resolves once this process's writes for the session are done; null when there are none (no tick spent). */
  local(sid: string): Promise<void> | null {
    const set = this.inProcess.get(sid);
    return set ? Promise.all(set).then(() => undefined) : null;
  }

  /** Every write this process started (graceful shutdown). */
  async drain(): Promise<void> {
    while (this.inProcess.size > 0) await Promise.all([...this.inProcess.values()].flatMap((s) => [...s]));
  }

  /**
   * Waits until no call of the session is pending on any replica, at most `timeoutMs` (default
   * waitMs); returns the numbers still pending then. `below`: only calls numbered below it count.
   */
  async settled(sid: string, { timeoutMs = this.deps.waitMs, below }: { timeoutMs?: number; below?: number } = {}): Promise<number[]> {
    await this.local(sid);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      let pending = await this.deps.sessions.pendingCalls(sid);
      if (below !== undefined) pending = pending.filter((s) => s < below);
      if (pending.length === 0 || Date.now() >= deadline) return pending;
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  /**
   * Waits until no call of the session numbered below `seq` is pending on any replica, at most
   * ECHO_WAIT_MS (an earlier call still running must not hold this one up long): its record, if it
   * has one, is then stored. Returns the numbers of those still running.
   */
  async earlierSettled(sid: string, seq: number): Promise<number[]> {
    return this.settled(sid, { below: seq, timeoutMs: Math.min(this.deps.waitMs, ECHO_WAIT_MS) });
  }

  /**
   * At close (the session takes no new calls; `pendingAtClose` of its calls were pending as it
   * closed): waits for them; each one still pending after waitMs is marked lost and cleared. True
   * when any was pending (the session's counts may have changed since the close read them).
   */
  async atClose(sid: string, pendingAtClose: number): Promise<boolean> {
    if (pendingAtClose === 0) return false;
    const left = await this.settled(sid);
    if (left.length > 0) {
      const lost: LostCall = {
        at: new Date().toISOString(),
        kind: "record_missing",
        status: 0,
        message: `call${left.length > 1 ? "s" : ""} ${left.join(", ")} had no record ${this.deps.waitMs} ms after the session closed (the gateway serving ${left.length > 1 ? "them" : "it"} stopped, or ${left.length > 1 ? "they were" : "it was"} still running)`,
      };
      this.deps.log.warn({ session_id: sid, seqs: left }, "calls without a record at close: the rollout will not be scored");
      for (let i = 0; i < left.length; i++) await this.deps.lostCalls?.note(sid, lost, null);
      await this.deps.sessions.settleCall(sid, ...left);
    }
    return true;
  }

  private add(sid: string, done: Promise<void>): void {
    let set = this.inProcess.get(sid);
    if (!set) this.inProcess.set(sid, (set = new Set()));
    set.add(done);
    const forget = () => {
      set.delete(done);
      if (set.size === 0 && this.inProcess.get(sid) === set) this.inProcess.delete(sid);
    };
    done.then(forget, forget);
  }
}
