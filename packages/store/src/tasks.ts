import { randomUUID } from "node:crypto";
import {
  CallbackState,
  Task,
  TaskResult,
  TaskStatus,
  TerminalStatus,
  type AcceptedTask,
  type GroupBranch,
  type TaskEvent,
  type TaskEventType,
  type TaskRecord,
} from "@rollgate/protocol";
import type { RedisClient } from "./client.js";
import { parseStored } from "./json.js";
import { keys, type Keys } from "./keys.js";
import { scriptCommands, type LuaScript } from "./scripts.js";

const MAX_EVENTS = 2_000;
/**
 * How much longer than the result TTL a task stays in the task index after its creation: a task's
 * record expires the TTL after it ended, so only a task that took longer than this from creation
 * to its end can drop out of the index while its record is still there (it stays readable by id).
 */
const INDEX_MARGIN_MS = 24 * 3600 * 1000;
const MAX_LOG_BYTES = 256 * 1024;

// Lua: `terminal[s]` is true for the statuses a task ends in (the protocol's list, not a copy).
const TERMINAL_LUA = `local terminal = {${TerminalStatus.options.map((s) => `['${s}'] = true`).join(", ")}}`;

// Writes a terminal result unless the task already has one, and appends the terminal event, in
// one step: a cancel racing a finishing worker produces exactly one result. A pending callback
// state is written in the same step, so a worker that dies right after cannot leave a result
// whose callback nobody will send (the next run of the job queues it).
// An event that precedes the terminal one (or "") is appended first, whether or not the result is
// stored, as a command of its own would have been.
// With an attempt's session (ARGV[9]), nothing is written unless the task is still running that
// attempt: an attempt whose job lock lapsed while it ran (its worker stalled, not dead) goes on
// after another attempt took the task over (put it back to queued, closed its session, opened its
// own), and its result, taken on a session closed under it, must not become the task's (-2).
// KEYS: task, events. ARGV: status, finished_at, result json, ttl, event json, maxlen, callback json
// or "", preceding event json or "", the attempt's session id or "".
const FINISH_SCRIPT: LuaScript = {
  name: "rollgateTaskFinish",
  numberOfKeys: 2,
  lua: `
${TERMINAL_LUA}
local s = redis.call('HGET', KEYS[1], 'status')
if ARGV[9] ~= '' and not terminal[s] and (s ~= 'running' or redis.call('HGET', KEYS[1], 'session_id') ~= ARGV[9]) then return -2 end
if ARGV[8] ~= '' then redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[8]) end
if terminal[s] then return 0 end
if not redis.call('HGET', KEYS[1], 'task') then return -1 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'finished_at', ARGV[2], 'result', ARGV[3])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'callback', ARGV[7]) end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
`,
};

// Creates the task unless one with its id exists: its fields and its `queued` event in one step.
// KEYS: task, events. ARGV: task json, created_at, callback json, group id, event json, maxlen.
const CREATE_SCRIPT: LuaScript = {
  name: "rollgateTaskCreate",
  numberOfKeys: 2,
  lua: `
if redis.call('HSETNX', KEYS[1], 'task', ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'created_at', ARGV[2], 'attempts', '0', 'callback', ARGV[3], 'group_id', ARGV[4])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5])
return 1
`,
};

// The group's keys live as long as its members' results: each member's end sets their expiry to
// the result TTL (the last one to end decides), so a group's keys (its cached body holds every
// member's result) do not outlive its tasks, and a group id used again after they expired starts
// afresh. KEYS: group hash, group's finished-task set, group's task index. ARGV: task id, group
// id, ttl (seconds).
const GROUP_FINISHED_SCRIPT: LuaScript = {
  name: "rollgateGroupTaskFinished",
  numberOfKeys: 3,
  lua: `
for i = 1, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('EXPIRE', KEYS[i], ARGV[3]) end
end
local size = redis.call('HGET', KEYS[1], 'size')
local cb = redis.call('HGET', KEYS[1], 'callback')
if not size or not cb or cb == '' then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if redis.call('SCARD', KEYS[2]) >= tonumber(size) then
  return redis.call('HGET', KEYS[1], 'delivery') or ('group-' .. ARGV[2])
end
return 0
`,
};

// Marks the task running and appends its `started` event in one step (one round trip instead of
// two). Never revives a task that ended, nor takes one another attempt is running: a task found
// running is taken back first (requeue, fenced on that attempt's session), so only an attempt
// that stalled before it got this far (its job lock lapsed and another took the task) arrives
// here to find it running, and it must not displace the live one.
// KEYS: task, events. ARGV: started_at, worker, attempt, session id, event json, maxlen.
const MARK_RUNNING_SCRIPT: LuaScript = {
  name: "rollgateTaskMarkRunning",
  numberOfKeys: 2,
  lua: `
${TERMINAL_LUA}
local s = redis.call('HGET', KEYS[1], 'status')
if not s or terminal[s] or s == 'running' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[1], 'worker', ARGV[2], 'attempts', ARGV[3], 'session_id', ARGV[4])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5])
return 1
`,
};

// KEYS: task. ARGV: the attempt's session id. Puts a running task back to queued (an attempt given
// up for a retry); never an ended one, nor one another attempt has taken over since.
const REQUEUE_SCRIPT: LuaScript = {
  name: "rollgateTaskRequeue",
  numberOfKeys: 1,
  lua: `
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'session_id') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued')
return 1
`,
};

// What an attempt writes while it runs (its progress events, its agent's output), fenced as its
// result is: only while the task is running that attempt's session. An attempt whose job lock
// lapsed goes on after another took the task over (or after the task ended); its writes would
// read as the live attempt's (events) or replace its output (logs).
// KEYS: task, events. ARGV: the attempt's session id, "event" or "logs", event json or log text, maxlen.
const ATTEMPT_WRITE_SCRIPT: LuaScript = {
  name: "rollgateTaskAttemptWrite",
  numberOfKeys: 2,
  lua: `
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'session_id') ~= ARGV[1] then return 0 end
if ARGV[2] == 'logs' then
  redis.call('HSET', KEYS[1], 'logs', ARGV[3])
else
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'e', ARGV[3])
end
return 1
`,
};

const taskScripts = (redis: RedisClient) =>
  scriptCommands(redis, {
    create: CREATE_SCRIPT,
    finish: FINISH_SCRIPT,
    groupFinished: GROUP_FINISHED_SCRIPT,
    markRunning: MARK_RUNNING_SCRIPT,
    requeue: REQUEUE_SCRIPT,
    attemptWrite: ATTEMPT_WRITE_SCRIPT,
  });

/** A task event as its stream entry stores it. */
function eventJson(type: TaskEventType, data: Record<string, unknown>, at: string): string {
  return JSON.stringify({ type, at, data });
}

function readCallback(raw: string | null): CallbackState | null {
  if (!raw) return null;
  try {
    const parsed = CallbackState.safeParse(JSON.parse(raw));
    return parsed.success ? parsed.data : null;
  } catch {
    return null;
  }
}

export interface TaskPage {
  tasks: TaskRecord[];
  next_cursor: string | null;
}

/** A branch group's shared part, stored when the group is defined. */
export type GroupBranchSpec = Omit<GroupBranch, "rewards">;

/**
 * The task key family: one hash per task (one field per concern, so the worker writing a result
 * and the callback worker writing delivery state never overwrite each other), its event stream,
 * the creation-time index and per-group indexes.
 */
export class TaskStore {
  private readonly k: Keys;
  private readonly scripts: ReturnType<typeof taskScripts>;
  constructor(
    private readonly redis: RedisClient,
    prefix: string,
  ) {
    this.k = keys(prefix);
    this.scripts = taskScripts(redis);
  }

  /** Creates the task unless one with the same id exists; returns whether it was created. */
  async create(task: AcceptedTask, now: Date): Promise<boolean> {
    const key = this.k.task(task.id);
    const callback: CallbackState = {
      state: task.callback ? "pending" : "none",
      delivery_id: null,
      attempts: 0,
      last_error: null,
      delivered_at: null,
    };
    const at = now.toISOString();
    const created = await this.scripts.create(key, this.k.taskEvents(task.id), JSON.stringify(task), at, JSON.stringify(callback), task.group_id ?? "", eventJson("queued", {}, at), String(MAX_EVENTS));
    if (created !== 1) return false;
    await this.index(task.id, task.group_id ?? null, now.getTime());
    return true;
  }

  /**
   * Puts a new task in the task index and its group's. Separate commands: the task, the index and
   * the group live in different cluster slots (a replica killed before them leaves the task out of
   * the lists until the submit sweep indexes it again: the same scores, so doing it twice is harmless).
   */
  private async index(id: string, groupId: string | null, createdMs: number): Promise<void> {
    await this.redis.zadd(this.k.taskIndex(), createdMs, id);
    if (groupId) {
      // A new task has not ended: should its id have ended in an earlier group of the same id
      // (whose tasks expired), it no longer counts as finished there, and that group's cached
      // body (its results) is not this group's.
      await this.redis.multi().zadd(this.k.groupTasks(groupId), createdMs, id).srem(this.k.groupFinished(groupId), id).hdel(this.k.group(groupId), "body").exec();
    }
  }

  /**
   * Notes that the submission of these tasks begins: storing a task and queueing its job are
   * writes to different slots, and a replica killed between them would leave the task queued with
   * no job, for good. The note stays until `submitted`; the submit sweep finishes what a note
   * older than its grace period stands for.
   */
  async submitting(ids: string[], now: Date): Promise<void> {
    if (ids.length === 0) return;
    await this.redis.zadd(this.k.submitting(), ...ids.flatMap((id) => [now.getTime(), id]));
  }

  /** These tasks' submissions are through (each stored and, while queued, its job added). */
  async submitted(ids: string[]): Promise<void> {
    if (ids.length === 0) return;
    await this.redis.zrem(this.k.submitting(), ...ids);
  }

  /** The oldest `limit` submissions begun before `before` and never noted through. */
  async unfinishedSubmits(before: Date, limit: number): Promise<string[]> {
    return this.redis.zrangebyscore(this.k.submitting(), "-inf", `(${before.getTime()}`, "LIMIT", 0, limit);
  }

  /**
   * A still-queued task's index entries written again, as its creation wrote them (its replica may
   * have been killed before it wrote them). False when the task is gone or no longer queued.
   */
  async reindexQueued(id: string): Promise<boolean> {
    const [status, createdAt, groupId] = await this.redis.hmget(this.k.task(id), "status", "created_at", "group_id");
    if (status !== "queued" || !createdAt) return false;
    await this.index(id, groupId || null, Date.parse(createdAt));
    return true;
  }

  /**
   * One replica at a time runs the submit sweep: true when this caller may (for `ttlMs`, or until
   * `sweepDone`). Two sweeps at once would only repeat each other's idempotent adds.
   */
  async claimSubmitSweep(owner: string, ttlMs: number): Promise<boolean> {
    return (await this.redis.set(this.k.submitSweep(), owner, "PX", ttlMs, "NX")) === "OK";
  }

  async sweepDone(owner: string): Promise<void> {
    if ((await this.redis.get(this.k.submitSweep())) === owner) await this.redis.del(this.k.submitSweep());
  }

  async get(id: string): Promise<TaskRecord | null> {
    const h = await this.redis.hgetall(this.k.task(id));
    return h.task ? this.fromHash(id, h) : null;
  }

  /**
   * The task and its cancel request (the reason, or null), in one read: what a worker needs to
   * know before it starts a rollout.
   */
  async getForRun(id: string): Promise<{ record: TaskRecord; cancelRequested: string | null } | null> {
    const h = await this.redis.hgetall(this.k.task(id));
    return h.task ? { record: this.fromHash(id, h), cancelRequested: h.cancel_requested ?? null } : null;
  }

  private fromHash(id: string, h: Record<string, string>): TaskRecord {
    const task = parseStored(Task, h.task!, `task ${id}`) as AcceptedTask;
    return {
      id,
      group_id: task.group_id ?? null,
      status: TaskStatus.parse(h.status ?? "queued"),
      task,
      created_at: h.created_at ?? new Date(0).toISOString(),
      started_at: h.started_at || null,
      finished_at: h.finished_at || null,
      attempts: Number(h.attempts ?? 0),
      worker: h.worker || null,
      session_id: h.session_id || null,
      callback: h.callback
        ? parseStored(CallbackState, h.callback, `callback state of ${id}`)
        : { state: "none", delivery_id: null, attempts: 0, last_error: null, delivered_at: null },
      result: h.result ? parseStored(TaskResult, h.result, `result of ${id}`) : null,
    };
  }

  async status(id: string): Promise<TaskStatus | null> {
    const s = await this.redis.hget(this.k.task(id), "status");
    return s ? TaskStatus.parse(s) : null;
  }

  /**
   * Marks the task running, unless it already ended (a cancel that won the race against the
   * worker picking it up) or another attempt is running it: then nothing changes and it returns
   * false.
   */
  async markRunning(id: string, fields: { worker: string; attempt: number; sessionId: string; now: Date }): Promise<boolean> {
    const at = fields.now.toISOString();
    const res = await this.scripts.markRunning(
      this.k.task(id),
      this.k.taskEvents(id),
      at,
      fields.worker,
      String(fields.attempt),
      fields.sessionId,
      eventJson("started", { worker: fields.worker, attempt: fields.attempt, session_id: fields.sessionId }, at),
      String(MAX_EVENTS),
    );
    return res === 1;
  }

  /**
   * A running task goes back to `queued` for another attempt (its attempts, worker and last
   * session stay on record), with a `retrying` event carrying `data`. False when it is not running
   * (it ended meanwhile, e.g. cancelled) or no longer on `sessionId` (another attempt took it over).
   */
  async requeue(id: string, sessionId: string, data: Record<string, unknown>, now = new Date()): Promise<boolean> {
    const res = await this.scripts.requeue(this.k.task(id), sessionId);
    if (res !== 1) return false;
    await this.appendEvent(id, "retrying", data, now);
    return true;
  }

  /**
   * Stores the one terminal result (false: the task already had one); `callback`: its delivery
   * state, set in the same step; `before`: an event appended just before, in the same step.
   * `attemptSession`: the session of the attempt that produced the result; then nothing is stored
   * (false) unless the task is still running that attempt (not one that took it over since).
   */
  async finish(
    id: string,
    result: TaskResult,
    now: Date,
    ttlSeconds: number,
    callback: CallbackState | null = null,
    before: { type: TaskEventType; data: Record<string, unknown> } | null = null,
    attemptSession: string | null = null,
  ): Promise<boolean> {
    const event = JSON.stringify({ type: "terminal", at: now.toISOString(), data: { status: result.status, reward: result.reward, error: result.error } });
    const res = await this.scripts.finish(
      this.k.task(id),
      this.k.taskEvents(id),
      result.status satisfies TerminalStatus,
      now.toISOString(),
      JSON.stringify(result),
      String(ttlSeconds),
      event,
      String(MAX_EVENTS),
      callback ? JSON.stringify(callback) : "",
      before ? eventJson(before.type, before.data, now.toISOString()) : "",
      attemptSession ?? "",
    );
    return res === 1;
  }

  /**
   * Records expire, their task index entries do not: removes the entries of tasks created longer
   * ago than the result TTL (and a margin), whose records are gone. Workers call it as they store
   * results (they know the TTL).
   */
  async pruneIndex(ttlSeconds: number, now = new Date()): Promise<number> {
    return this.redis.zremrangebyscore(this.k.taskIndex(), "-inf", `(${now.getTime() - ttlSeconds * 1000 - INDEX_MARGIN_MS}`);
  }

  async rawResult(id: string): Promise<string | null> {
    return this.redis.hget(this.k.task(id), "result");
  }

  async setCallback(id: string, state: CallbackState): Promise<void> {
    await this.redis.hset(this.k.task(id), "callback", JSON.stringify(state));
  }

  /** Marks a cancel request (read by the worker when it starts or runs the task) and tells workers. */
  async requestCancel(id: string, reason: string, now: Date): Promise<void> {
    await this.redis.hset(this.k.task(id), "cancel_requested", reason);
    await this.appendEvent(id, "cancel_requested", { reason }, now);
    await this.redis.publish(this.k.cancelChannel(), id);
  }

  async cancelRequested(id: string): Promise<string | null> {
    return this.redis.hget(this.k.task(id), "cancel_requested");
  }

  cancelChannel(): string {
    return this.k.cancelChannel();
  }

  /**
   * The agent's output so far (bounded; the newest bytes are kept), written by the attempt on
   * `sessionId`: false (nothing written) unless the task is running that attempt.
   */
  async setLogs(id: string, text: string, sessionId: string): Promise<boolean> {
    const bounded = text.length > MAX_LOG_BYTES ? text.slice(-MAX_LOG_BYTES) : text;
    return (await this.scripts.attemptWrite(this.k.task(id), this.k.taskEvents(id), sessionId, "logs", bounded, "")) === 1;
  }

  /**
   * An event of the attempt on `sessionId` (its progress: `llm_call`, `evaluating`): false
   * (nothing written) unless the task is running that attempt.
   */
  async appendAttemptEvent(id: string, sessionId: string, type: TaskEventType, data: Record<string, unknown>, now = new Date()): Promise<boolean> {
    const res = await this.scripts.attemptWrite(this.k.task(id), this.k.taskEvents(id), sessionId, "event", eventJson(type, data, now.toISOString()), String(MAX_EVENTS));
    return res === 1;
  }

  async logs(id: string): Promise<string | null> {
    return this.redis.hget(this.k.task(id), "logs");
  }

  async appendEvent(id: string, type: TaskEventType, data: Record<string, unknown>, now = new Date()): Promise<void> {
    await this.redis.xadd(this.k.taskEvents(id), "MAXLEN", "~", MAX_EVENTS, "*", "e", eventJson(type, data, now.toISOString()));
  }

  /** Events after `afterId` (exclusive; all when null), oldest first. */
  async events(id: string, afterId: string | null, count = 500): Promise<TaskEvent[]> {
    const start = afterId ? `(${afterId}` : "-";
    const rows = await this.redis.xrange(this.k.taskEvents(id), start, "+", "COUNT", count);
    return rows.map(([eventId, fields]) => {
      const raw = fields[1] ?? "{}";
      const e = JSON.parse(raw) as Omit<TaskEvent, "id">;
      return { id: eventId, type: e.type, at: e.at, data: e.data ?? {} };
    });
  }

  /**
   * The status and callback delivery state of the newest `limit` tasks of the task index, and how
   * many tasks the index holds (for metrics). Two hash fields per task, by concurrent commands, not
   * a pipeline (on a Redis Cluster each task has its own slot). Tasks whose record expired (result
   * TTL) are left out; an unreadable callback state reads as null.
   */
  async recentStates(limit: number): Promise<{ indexed: number; tasks: { status: TaskStatus; callback: CallbackState | null }[] }> {
    const [ids, indexed] = await Promise.all([this.redis.zrevrange(this.k.taskIndex(), 0, limit - 1), this.redis.zcard(this.k.taskIndex())]);
    const rows = await Promise.all(ids.map((id) => this.redis.hmget(this.k.task(id), "status", "callback")));
    const tasks = rows.flatMap(([status, callback]) => {
      const s = TaskStatus.safeParse(status);
      return s.success ? [{ status: s.data, callback: readCallback(callback ?? null) }] : [];
    });
    return { indexed, tasks };
  }

  /**
   * Tasks newest first, optionally of one group and/or status. The cursor is opaque
   * ("<created ms>:<id>" of the last task returned).
   */
  async list(opts: { status?: TaskStatus; groupId?: string; limit: number; cursor?: string }): Promise<TaskPage> {
    const index = opts.groupId ? this.k.groupTasks(opts.groupId) : this.k.taskIndex();
    let max = "+inf";
    let skipUntil: string | null = null;
    if (opts.cursor) {
      const [ms, ...rest] = opts.cursor.split(":");
      max = ms ?? "+inf";
      skipUntil = rest.join(":");
    }
    const out: TaskRecord[] = [];
    let lastCursor: string | null = null;
    let exhausted = false;
    const batch = Math.max(opts.limit * 2, 50);
    let offset = 0;
    while (out.length < opts.limit) {
      const flat = await this.redis.zrevrangebyscore(index, max, "-inf", "WITHSCORES", "LIMIT", offset, batch);
      if (flat.length === 0) {
        exhausted = true;
        break;
      }
      offset += flat.length / 2;
      const ids: [string, string][] = [];
      for (let i = 0; i + 1 < flat.length; i += 2) ids.push([flat[i]!, flat[i + 1]!]);
      // One slot per task: concurrent commands, not a pipeline (a cluster pipeline must stay in one slot).
      const hashes = await Promise.all(ids.map(([id]) => this.redis.hgetall(this.k.task(id))));
      for (let i = 0; i < ids.length && out.length < opts.limit; i++) {
        const [id, score] = ids[i]!;
        if (skipUntil !== null) {
          // Ties on the creation ms: skip up to and including the cursor's id.
          if (score === max && id !== skipUntil) continue;
          if (id === skipUntil) {
            skipUntil = null;
            continue;
          }
          skipUntil = null;
        }
        const h = hashes[i];
        if (!h?.task) continue; // expired
        lastCursor = `${score}:${id}`;
        if (opts.status && h.status !== opts.status) continue;
        out.push(this.fromHash(id, h));
      }
      if (flat.length / 2 < batch) {
        exhausted = true;
        break;
      }
    }
    return { tasks: out, next_cursor: exhausted && out.length < opts.limit ? null : lastCursor };
  }

  /** Records a group's size and optional group callback (batch submission). */
  async defineGroup(groupId: string, size: number, callback: { url: string; secret: string } | null, branch: GroupBranchSpec | null = null): Promise<void> {
    // The group delivery's id is fixed when the group is defined: every run that sees the group
    // complete queues the same job id, and a later group reusing the name gets a new one.
    await this.redis.hset(this.k.group(groupId), {
      size: String(size),
      callback: callback ? JSON.stringify(callback) : "",
      delivery: `group-${randomUUID()}`,
      ...(branch ? { branch: JSON.stringify(branch) } : {}),
    });
  }

  /** A defined group's size and, for a group of branches, what it shares; null when no group has the id. */
  async groupDefinition(groupId: string): Promise<{ size: number; branch: GroupBranchSpec | null } | null> {
    const [size, branch] = await this.redis.hmget(this.k.group(groupId), "size", "branch");
    if (size === null) return null;
    return { size: Number(size), branch: branch ? (JSON.parse(branch) as GroupBranchSpec) : null };
  }

  /** What a group of branches shares (its rewards are added when its callback is built); null for any other group. */
  async groupBranch(groupId: string): Promise<GroupBranchSpec | null> {
    const raw = await this.redis.hget(this.k.group(groupId), "branch");
    return raw ? (JSON.parse(raw) as GroupBranchSpec) : null;
  }

  /**
   * Counts a terminal task of a group (idempotent: a task counts once however often it is told),
   * and makes the group's keys expire `ttlSeconds` from now (the members' result TTL).
   * When every task of the group has ended and the group has a callback to send, returns the
   * group delivery's id, else null. Told again after that (a job re-run after its worker died),
   * it returns the same id: the delivery's job id is fixed, so the queue drops the repeat.
   */
  async groupTaskFinished(groupId: string, taskId: string, ttlSeconds: number): Promise<string | null> {
    const res = await this.scripts.groupFinished(this.k.group(groupId), this.k.groupFinished(groupId), this.k.groupTasks(groupId), taskId, groupId, String(ttlSeconds));
    return typeof res === "string" ? res : null;
  }

  async groupCallback(groupId: string): Promise<{ url: string; secret: string } | null> {
    const cb = await this.redis.hget(this.k.group(groupId), "callback");
    return cb ? (JSON.parse(cb) as { url: string; secret: string }) : null;
  }

  /**
   * The group callback body, built once by `build` and kept, so every retry sends (and signs)
   * the same bytes.
   */
  async groupBody(groupId: string, build: () => Promise<string>): Promise<string> {
    const key = this.k.group(groupId);
    const existing = await this.redis.hget(key, "body");
    if (existing) return existing;
    await this.redis.hsetnx(key, "body", await build());
    return (await this.redis.hget(key, "body"))!;
  }

  async setGroupCallbackState(groupId: string, state: CallbackState): Promise<void> {
    await this.redis.hset(this.k.group(groupId), "callback_state", JSON.stringify(state));
  }

  /**
   * A group's task ids in member order: `<group>-0`, `<group>-1`, …, `<group>-10` by number (a
   * group's members are created in one millisecond, and the index breaks such ties in string
   * order), then any others in creation order. The group callback's `tasks` and a branch group's
   * `rewards` follow it.
   */
  async groupTaskIds(groupId: string): Promise<string[]> {
    const created = await this.redis.zrange(this.k.groupTasks(groupId), "0", "-1");
    const prefix = `${groupId}-`;
    const member = (id: string): number => (id.startsWith(prefix) && /^\d+$/.test(id.slice(prefix.length)) ? Number(id.slice(prefix.length)) : Infinity);
    return created
      .map((id, at) => ({ id, at, k: member(id) }))
      .sort((a, b) => (a.k === b.k ? a.at - b.at : a.k < b.k ? -1 : 1))
      .map((x) => x.id);
  }
}
