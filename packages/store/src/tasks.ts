import {
  CallbackState,
  Task,
  TaskResult,
  TaskStatus,
  type AcceptedTask,
  type TaskRecord,
  type TerminalStatus,
} from "@rollgate/protocol";
import type { Redis } from "ioredis";
import { parseStored } from "./json.js";
import { keys, type Keys } from "./keys.js";

/**
 * The task key family: one Redis hash per task, one field per concern, so the worker writing a
 * result and the callback worker writing delivery state never overwrite each other.
 */
export class TaskStore {
  private readonly k: Keys;
  constructor(
    private readonly redis: Redis,
    prefix: string,
  ) {
    this.k = keys(prefix);
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
    const created = await this.redis.hsetnx(key, "task", JSON.stringify(task));
    if (created === 0) return false;
    await this.redis
      .multi()
      .hset(key, {
        status: "queued",
        created_at: now.toISOString(),
        attempts: "0",
        callback: JSON.stringify(callback),
        group_id: task.group_id ?? "",
      })
      .zadd(this.k.taskIndex(), now.getTime(), task.id)
      .exec();
    return true;
  }

  async get(id: string): Promise<TaskRecord | null> {
    const h = await this.redis.hgetall(this.k.task(id));
    if (!h.task) return null;
    const task = parseStored(Task, h.task, `task ${id}`) as AcceptedTask;
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

  async markRunning(id: string, fields: { worker: string; attempt: number; sessionId: string; now: Date }): Promise<void> {
    await this.redis.hset(this.k.task(id), {
      status: "running",
      started_at: fields.now.toISOString(),
      worker: fields.worker,
      attempts: String(fields.attempt),
      session_id: fields.sessionId,
    });
  }

  /** Stores the terminal result. The raw JSON is kept so a callback can sign exactly these bytes. */
  async finish(id: string, result: TaskResult, now: Date, ttlSeconds: number): Promise<string> {
    const raw = JSON.stringify(result);
    const key = this.k.task(id);
    await this.redis
      .multi()
      .hset(key, { status: result.status satisfies TerminalStatus, finished_at: now.toISOString(), result: raw })
      .expire(key, ttlSeconds)
      .exec();
    return raw;
  }

  async rawResult(id: string): Promise<string | null> {
    return this.redis.hget(this.k.task(id), "result");
  }

  async setCallback(id: string, state: CallbackState): Promise<void> {
    await this.redis.hset(this.k.task(id), "callback", JSON.stringify(state));
  }
}
