import {
  BranchAccepted,
  CreateSessionResponse,
  DecodedTrajectory,
  Session,
  TaskAccepted,
  TaskEvent,
  TaskRecord,
  Trajectory,
  isTerminalStatus,
  type BranchRequest,
  type CompletionRecord,
  type CreateSessionRequest,
  type LostCalls,
  type TaskInput,
  type TaskResult,
  type TaskStatus,
  type TrajectoryBuilderName,
} from "@rollgate/protocol";
import { toTrainerFormat, type TrainerFormat, type TrainerFormatMap } from "@rollgate/trajectory";
import type { z } from "zod";
import { RollgateError } from "./errors.js";
import { BatchAccepted, CancelAnswer, CompletionsAnswer, TaskPageSchema, type CreateSessionRequestInput } from "./schemas.js";
import { SseParser } from "./sse.js";

/** What `branch()` takes (defaults filled by the gateway). */
export type BranchRequestInput = z.input<typeof BranchRequest>;

export interface RollgateClientOptions {
  /** The gateway, e.g. `http://127.0.0.1:8080` (a trailing slash is fine). */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>` (the gateway's ROLLGATE_API_KEY). */
  apiKey?: string;
  /** Per-request timeout for ordinary calls (not event streams). Default 30 s. */
  timeoutMs?: number;
  /** A fetch implementation (tests); default the global one. */
  fetch?: typeof fetch;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
}

export interface GroupRequest {
  group_id: string;
  n: number;
  task: TaskInput;
  group_callback?: { url: string; secret: string };
}

export interface ListTasksOptions {
  status?: TaskStatus;
  group_id?: string;
  /** Page size (1..1000, default 100). */
  limit?: number;
  cursor?: string;
}

export interface TaskPage {
  tasks: TaskRecord[];
  next_cursor: string | null;
}

export interface WaitOptions {
  /** Poll period; default 1000 ms. */
  intervalMs?: number;
  /** Give up (RollgateError type "timeout") after this long; default: wait forever. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /**
   * How long polls ride out a gateway that does not answer (or answers 502/503/504: a restart, a
   * deploy) before the wait ends with that error; default 120 000 ms. Other errors end it at once.
   */
  outageMs?: number;
}

export interface StreamEventsOptions {
  /** Resume after this event id (as `Last-Event-ID`). */
  lastEventId?: string;
  signal?: AbortSignal;
  /**
   * Reconnections allowed after a dropped stream before giving up. Default: reconnect as long as
   * the gateway has been unreachable (or dropping the stream) for less than `outageMs`.
   */
  maxReconnects?: number;
  /** With no `maxReconnects`: how long a gateway outage is ridden out; default 120 000 ms. */
  outageMs?: number;
  /** Called before each reconnection, with what ended the stream (so a caller can say it is waiting). */
  onReconnect?: (cause: unknown, attempt: number) => void;
}

export interface TrajectoryOptions<F extends TrainerFormat = "rollgate"> {
  builder?: TrajectoryBuilderName;
  /** `rollgate` (default: traces + stats), `verl`, `slime` or `prime-rl`. */
  format?: F;
}

/**
 * A trajectory in a trainer's format, as `GET /v1/sessions/:id/trajectory?format=<name>` answers
 * it (and the Python client returns it): one sample per trace, with the session's lost calls.
 */
export interface TrainerSamples<F extends TrainerFormat = TrainerFormat> {
  builder: TrajectoryBuilderName;
  format: F;
  samples: TrainerFormatMap[F];
  /**
   * The session's calls lost to infrastructure: a lost call's tokens may be missing from the
   * samples (read as masked glue), so samples with any are not a whole rollout.
   */
  lost_calls: LostCalls;
}

/** What `getTrajectory` answers for each format: the trajectory itself, or a trainer's samples in their envelope. */
export type TrajectoryAnswerMap = { rollgate: Trajectory } & { [K in Exclude<TrainerFormat, "rollgate">]: TrainerSamples<K> };

export interface PauseOptions {
  /** What to do with in-flight engine calls: let them finish (`drain`) or abort them. */
  mode?: "drain" | "abort";
}

/** Whether a task in this status has ended (the protocol's definition). */
export const isTerminal = (status: TaskStatus): boolean => isTerminalStatus(status);

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(new RollgateError("aborted", 0, "aborted"));
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(new RollgateError("aborted", 0, "aborted"));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

const DEFAULT_OUTAGE_MS = 120_000;

/** What a gateway restart or deploy looks like from here: nothing answers, or a proxy's 502/503/504. */
export function isOutage(err: unknown): boolean {
  return err instanceof RollgateError && (err.type === "unreachable" || err.status === 502 || err.status === 503 || err.status === 504);
}

/** Times an outage: since when calls have been failing, reset by a call that succeeds. */
class OutageClock {
  private since: number | null = null;
  constructor(private readonly limitMs: number) {}
  ok(): void {
    this.since = null;
  }
  /** Records a failure; true while it may be ridden out (an outage within the limit). */
  rideOut(err: unknown): boolean {
    if (!isOutage(err)) return false;
    this.since ??= Date.now();
    return Date.now() - this.since < this.limitMs;
  }
}

/**
 * A request body's values that JSON cannot carry unchanged: a BigInt (JSON.stringify throws), NaN
 * and ±Infinity (sent as null). Names the first one's field, so the caller knows what to fix.
 */
function unsendable(value: unknown, path = ""): string | null {
  if (typeof value === "bigint") return `${path || "the body"} = ${value}n is a BigInt, which JSON cannot carry: send it as a string`;
  if (typeof value === "number" && !Number.isFinite(value)) return `${path || "the body"} = ${value} is not a JSON number (it would be sent as null)`;
  if (value === null || typeof value !== "object") return null;
  if (typeof (value as { toJSON?: unknown }).toJSON === "function") return null;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = unsendable(value[i], `${path}[${i}]`);
      if (found) return found;
    }
    return null;
  }
  for (const [k, v] of Object.entries(value)) {
    const found = unsendable(v, path ? `${path}.${k}` : k);
    if (found) return found;
  }
  return null;
}

function describeNetworkError(err: unknown, url: URL): string {
  const e = err as { cause?: { code?: string; message?: string }; message?: string; name?: string };
  if (e?.name === "TimeoutError") return "timed out";
  // fetch refuses some ports outright (the WHATWG "bad ports": 6000, 6665-6669, 10080, …), whether
  // or not a gateway listens there: say so, it is not a network problem.
  if (e?.cause?.message === "bad port") return `fetch never connects to port ${url.port} (a WHATWG "bad port"): run the gateway on another port`;
  return e?.cause?.code ?? e?.cause?.message ?? e?.message ?? String(err);
}

/** What engines load: a checkpoint folder every engine can read, or a LoRA adapter (loaded or replaced under `name`). */
export type WeightLoad = { path: string } | { lora: { name: string; path: string } };

/**
 * The typed SDK for rollgate's trainer and admin API (docs/http-api.md). Every method validates the
 * gateway's answer with the protocol's zod schemas and throws `RollgateError` on any failure.
 */
export class RollgateClient {
  readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;
  private readonly extraHeaders: Record<string, string>;

  constructor(opts: RollgateClientOptions) {
    if (!opts?.baseUrl) throw new TypeError("RollgateClient needs a baseUrl, e.g. http://127.0.0.1:8080");
    try {
      new URL(opts.baseUrl);
    } catch {
      throw new TypeError(`RollgateClient: baseUrl ${JSON.stringify(opts.baseUrl)} is not a URL`);
    }
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.apiKey = opts.apiKey || undefined;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.fetchImpl = opts.fetch ?? globalThis.fetch;
    this.extraHeaders = opts.headers ?? {};
  }

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return {
      ...this.extraHeaders,
      ...(this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {}),
      ...extra,
    };
  }

  /** One request; the raw Response when it is 2xx, else a RollgateError. */
  private async send(
    method: string,
    path: string,
    init: { body?: unknown; query?: Record<string, string | number | undefined>; signal?: AbortSignal; timeoutMs?: number | null; headers?: Record<string, string>; notFoundHint?: string } = {},
  ): Promise<Response> {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(init.query ?? {})) if (v !== undefined && v !== "") url.searchParams.set(k, String(v));
    const label = `${method} ${url.pathname}`;
    // Checked before sending: such a value would otherwise read as "cannot reach the gateway" (a
    // BigInt) or reach the gateway silently changed (NaN, Infinity).
    const bad = init.body === undefined ? null : unsendable(init.body);
    if (bad) throw new RollgateError(`${label}: ${bad}`, 0, "invalid_request", undefined, label);
    const signals = [init.signal, init.timeoutMs === null ? undefined : AbortSignal.timeout(init.timeoutMs ?? this.timeoutMs)].filter(
      (s): s is AbortSignal => s !== undefined,
    );
    let res: Response;
    try {
      res = await this.fetchImpl(url, {
        method,
        headers: this.headers({ ...(init.body !== undefined ? { "content-type": "application/json" } : {}), ...init.headers }),
        ...(init.body !== undefined ? { body: JSON.stringify(init.body) } : {}),
        ...(signals.length ? { signal: signals.length === 1 ? signals[0] : AbortSignal.any(signals) } : {}),
      });
    } catch (err) {
      if (init.signal?.aborted) throw new RollgateError(`${label}: aborted`, 0, "aborted", undefined, label, { cause: err });
      throw new RollgateError(
        `cannot reach the rollgate gateway at ${this.baseUrl} (${describeNetworkError(err, url)})`,
        0,
        "unreachable",
        undefined,
        label,
        { cause: err },
      );
    }
    if (!res.ok) {
      const text = await res.text().catch(() => "");
      throw RollgateError.fromResponse(res.status, text, label, res.status === 404 ? init.notFoundHint : undefined);
    }
    return res;
  }

  private async json<S extends z.ZodType>(schema: S, method: string, path: string, init: Parameters<RollgateClient["send"]>[2] = {}): Promise<z.infer<S>> {
    const res = await this.send(method, path, init);
    const text = await res.text();
    let body: unknown;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      throw new RollgateError(`${method} ${path} answered non-JSON: ${text.slice(0, 200)}`, res.status, "invalid_response");
    }
    const parsed = schema.safeParse(body);
    if (!parsed.success) {
      throw new RollgateError(`${method} ${path}: unexpected answer: ${parsed.error.message.slice(0, 500)}`, res.status, "invalid_response", body);
    }
    return parsed.data;
  }

  private async anyJson(method: string, path: string, init: Parameters<RollgateClient["send"]>[2] = {}): Promise<unknown> {
    const res = await this.send(method, path, init);
    const text = await res.text();
    try {
      return text ? JSON.parse(text) : null;
    } catch {
      // Not the gateway's answer (every route answers JSON): another server at this URL, say.
      throw new RollgateError(
        `${method} ${path} answered non-JSON (${res.headers.get("content-type") ?? "no content type"}): ${text.slice(0, 200)}`,
        res.status,
        "invalid_response",
      );
    }
  }

  // ── tasks ──────────────────────────────────────────────────────────────────────────────

  /** `POST /v1/tasks`: validate and enqueue one task (idempotent on `task.id`). */
  submitTask(task: TaskInput, opts: { signal?: AbortSignal } = {}): Promise<TaskAccepted> {
    return this.json(TaskAccepted, "POST", "/v1/tasks", { body: task, ...opts });
  }

  /** `POST /v1/tasks/batch {tasks}`: several tasks at once. */
  async submitBatch(tasks: TaskInput[], opts: { groupCallback?: { url: string; secret: string }; signal?: AbortSignal } = {}): Promise<TaskAccepted[]> {
    const body = { tasks, ...(opts.groupCallback ? { group_callback: opts.groupCallback } : {}) };
    const res = await this.json(BatchAccepted, "POST", "/v1/tasks/batch", { body, ...(opts.signal ? { signal: opts.signal } : {}) });
    return res.tasks;
  }

  /** `POST /v1/tasks/batch {group_id, n, task}`: a GRPO group of `n` rollouts with ids `<group_id>-<k>`. */
  async submitGroup(group: GroupRequest, opts: { signal?: AbortSignal } = {}): Promise<TaskAccepted[]> {
    const res = await this.json(BatchAccepted, "POST", "/v1/tasks/batch", { body: group, ...opts });
    return res.tasks;
  }

  /**
   * `POST /v1/tasks/:id/branches`: `n` runs that replay the finished task's first `at_call` LLM
   * calls from its records, then sample (docs/data-model.md#branches). `callback` is the group's.
   */
  branch(taskId: string, req: BranchRequestInput, opts: { signal?: AbortSignal } = {}): Promise<BranchAccepted> {
    return this.json(BranchAccepted, "POST", `/v1/tasks/${encodeURIComponent(taskId)}/branches`, { body: req, ...opts });
  }

  /** `GET /v1/tasks/:id`: status, timings, callback state, and the result once terminal. */
  getTask(id: string, opts: { signal?: AbortSignal } = {}): Promise<TaskRecord> {
    return this.json(TaskRecord, "GET", `/v1/tasks/${encodeURIComponent(id)}`, opts);
  }

  /** One page of `GET /v1/tasks` (newest first). */
  listTasksPage(opts: ListTasksOptions = {}): Promise<TaskPage> {
    return this.json(TaskPageSchema, "GET", "/v1/tasks", {
      query: { status: opts.status, group_id: opts.group_id, limit: opts.limit, cursor: opts.cursor },
    });
  }

  /** Every task matching the filters, newest first, fetching pages as you iterate. */
  async *listTasks(opts: Omit<ListTasksOptions, "cursor"> & { max?: number } = {}): AsyncGenerator<TaskRecord> {
    let cursor: string | undefined;
    let yielded = 0;
    do {
      const page = await this.listTasksPage({ ...opts, ...(cursor ? { cursor } : {}) });
      for (const t of page.tasks) {
        if (opts.max !== undefined && yielded >= opts.max) return;
        yielded++;
        yield t;
      }
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  /** `DELETE /v1/tasks/:id`: `cancelled` at once when it had not started, `cancelling` while its sandbox is killed. */
  cancelTask(id: string): Promise<{ id: string; status: string }> {
    return this.json(CancelAnswer, "DELETE", `/v1/tasks/${encodeURIComponent(id)}`);
  }

  /** `GET /v1/tasks/:id/logs`: the agent's output (bounded, newest kept). */
  async getLogs(id: string): Promise<string> {
    const res = await this.send("GET", `/v1/tasks/${encodeURIComponent(id)}/logs`);
    return res.text();
  }

  /** Polls `GET /v1/tasks/:id` until the task ends; resolves to its result. A gateway outage is ridden out (`outageMs`). */
  async waitForResult(id: string, opts: WaitOptions = {}): Promise<TaskResult> {
    const [result] = await this.waitForResults([id], opts);
    return result!;
  }

  /** Waits for several tasks (polling each until it ends); results in the order of `ids`. A gateway outage is ridden out (`outageMs`). */
  async waitForResults(ids: string[], opts: WaitOptions & { onResult?: (r: TaskResult) => void } = {}): Promise<TaskResult[]> {
    const results = new Map<string, TaskResult>();
    const deadline = opts.timeoutMs !== undefined ? Date.now() + opts.timeoutMs : Infinity;
    const outage = new OutageClock(opts.outageMs ?? DEFAULT_OUTAGE_MS);
    let lastStatus = "queued";
    let lastFailure: RollgateError | null = null;
    while (results.size < ids.length) {
      const pending = ids.filter((id) => !results.has(id));
      for (const id of pending) {
        let record: TaskRecord;
        try {
          record = await this.getTask(id, opts.signal ? { signal: opts.signal } : {});
          outage.ok();
          lastFailure = null;
        } catch (err) {
          if (opts.signal?.aborted || !outage.rideOut(err)) throw err;
          lastFailure = err as RollgateError;
          break; // the gateway is down: wait, then poll again
        }
        lastStatus = record.status;
        if (record.result) {
          results.set(id, record.result);
          opts.onResult?.(record.result);
        }
      }
      if (results.size === ids.length) break;
      if (Date.now() >= deadline) {
        const what = ids.length === 1 ? `task ${ids[0]} is still ${lastStatus}` : `${ids.length - results.size} of ${ids.length} tasks still running`;
        const why = lastFailure ? ` (the last poll got no answer: ${lastFailure.message})` : "";
        throw new RollgateError(`${what} after ${opts.timeoutMs} ms${why}`, 0, "timeout");
      }
      await sleep(Math.min(opts.intervalMs ?? 1000, Math.max(0, deadline - Date.now())), opts.signal);
    }
    return ids.map((id) => results.get(id)!);
  }

  /**
   * `GET /v1/tasks/:id/events` as an async iterator of events, ending after the `terminal` event.
   * A dropped stream is resumed with `Last-Event-ID`, so no event is lost or repeated.
   */
  async *streamEvents(id: string, opts: StreamEventsOptions = {}): AsyncGenerator<TaskEvent> {
    let lastId = opts.lastEventId ?? null;
    let reconnects = 0;
    // A count when asked for; otherwise as long as an outage lasts less than outageMs.
    const max = opts.maxReconnects ?? Infinity;
    const outage = new OutageClock(opts.outageMs ?? DEFAULT_OUTAGE_MS);
    let cause: unknown = null;
    for (;;) {
      let ended = false;
      try {
        const res = await this.send("GET", `/v1/tasks/${encodeURIComponent(id)}/events`, {
          timeoutMs: null,
          headers: { accept: "text/event-stream", ...(lastId ? { "last-event-id": lastId } : {}) },
          ...(opts.signal ? { signal: opts.signal } : {}),
        });
        if (!res.body) throw new RollgateError(`event stream of ${id} has no body`, res.status, "invalid_response");
        const parser = new SseParser();
        const decoder = new TextDecoder();
        const reader = res.body.getReader();
        try {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            for (const msg of parser.push(decoder.decode(value, { stream: true }))) {
              let data: unknown;
              try {
                data = JSON.parse(msg.data);
              } catch {
                continue;
              }
              const event = TaskEvent.safeParse(data);
              if (!event.success) continue;
              lastId = event.data.id;
              reconnects = 0;
              outage.ok();
              yield event.data;
              if (event.data.type === "terminal") {
                ended = true;
                return;
              }
            }
          }
        } finally {
          if (!ended) await reader.cancel().catch(() => undefined);
        }
      } catch (err) {
        if (opts.signal?.aborted) return;
        // A 4xx is final; a dropped connection or a 5xx is retried below.
        if (err instanceof RollgateError && err.status >= 400 && err.status < 500) throw err;
        // A dropped connection mid-stream (not a RollgateError) and any 5xx are retried like an outage.
        const failure = err instanceof RollgateError && err.status < 500 ? err : new RollgateError(`event stream of task ${id} dropped`, 0, "unreachable", undefined, undefined, { cause: err });
        if (reconnects >= max || !outage.rideOut(failure)) throw err;
        cause = err;
      }
      if (opts.signal?.aborted) return;
      if (reconnects >= max || !outage.rideOut(new RollgateError("", 0, "unreachable"))) {
        throw new RollgateError(`event stream of task ${id} kept closing before the task ended`, 0, "stream_closed");
      }
      reconnects++;
      opts.onReconnect?.(cause ?? new RollgateError(`event stream of task ${id} closed before the task ended`, 0, "stream_closed"), reconnects);
      cause = null;
      await sleep(Math.min(200 * 2 ** reconnects, 5_000), opts.signal).catch(() => undefined);
    }
  }

  // ── sessions and trajectories ──────────────────────────────────────────────────────────

  /** `POST /v1/sessions`: a session for agents you run yourself; its URLs take its token. */
  createSession(body: z.input<typeof CreateSessionRequestInput> = {}): Promise<CreateSessionResponse> {
    return this.json(CreateSessionResponse, "POST", "/v1/sessions", { body });
  }

  getSession(id: string): Promise<Session> {
    return this.json(Session, "GET", `/v1/sessions/${encodeURIComponent(id)}`);
  }

  closeSession(id: string): Promise<Session> {
    return this.json(Session, "POST", `/v1/sessions/${encodeURIComponent(id)}/close`);
  }

  async deleteSession(id: string): Promise<void> {
    await this.send("DELETE", `/v1/sessions/${encodeURIComponent(id)}`);
  }

  async getCompletions(sessionId: string): Promise<CompletionRecord[]> {
    const res = await this.json(CompletionsAnswer, "GET", `/v1/sessions/${encodeURIComponent(sessionId)}/completions`);
    return res.completions;
  }

  /**
   * A session's trajectory, built by `builder` (default prefix_merging), as the trajectory route
   * answers it: for `rollgate` (the default) the trajectory itself (traces + stats, with
   * `stats.lost_calls`); for `verl`, `slime` or `prime-rl` `{builder, format, samples, lost_calls}`
   * (one sample per trace, and the session's lost calls: samples with any are not a whole rollout).
   */
  async getTrajectory<F extends TrainerFormat = "rollgate">(sessionId: string, opts: TrajectoryOptions<F> = {}): Promise<TrajectoryAnswerMap[F]> {
    const trajectory = await this.json(Trajectory, "GET", `/v1/sessions/${encodeURIComponent(sessionId)}/trajectory`, {
      query: { builder: opts.builder },
    });
    const format = opts.format ?? "rollgate";
    if (format === "rollgate") return trajectory as TrajectoryAnswerMap[F];
    // Converted here with the same adapters the gateway's `?format=` uses, so any gateway version
    // works; the lost calls are the session's, which the gateway puts in the trajectory's stats.
    const answer: TrainerSamples = { builder: trajectory.builder, format, samples: toTrainerFormat(trajectory, format), lost_calls: trajectory.stats.lost_calls };
    return answer as TrajectoryAnswerMap[F];
  }

  /**
   * `GET /v1/sessions/:id/trajectory/decoded`: each trace as text, decoded by the engine that
   * produced the tokens (its own tokenizer), the response in runs of trainable / masked tokens.
   */
  getDecodedTrajectory(sessionId: string, opts: { builder?: TrajectoryBuilderName } = {}): Promise<DecodedTrajectory> {
    return this.json(DecodedTrajectory, "GET", `/v1/sessions/${encodeURIComponent(sessionId)}/trajectory/decoded`, { query: { builder: opts.builder } });
  }

  /** The trajectory of a task's session (the task must have started), by the task's own builder unless `opts.builder` says another. */
  async getTaskTrajectory<F extends TrainerFormat = "rollgate">(taskId: string, opts: TrajectoryOptions<F> = {}): Promise<TrajectoryAnswerMap[F]> {
    const task = await this.getTask(taskId);
    const sessionId = task.session_id ?? task.result?.session_id;
    if (!sessionId) throw new RollgateError(`task ${taskId} has no session yet (it is ${task.status})`, 409, "no_session");
    return this.getTrajectory(sessionId, { ...opts, builder: opts.builder ?? task.task.trajectory.builder });
  }

  // ── admin ──────────────────────────────────────────────────────────────────────────────

  /** `POST /admin/inference/pause`: hold new engine calls on every replica (weight sync). */
  pause(opts: PauseOptions = {}): Promise<unknown> {
    return this.anyJson("POST", "/admin/inference/pause", { body: opts, notFoundHint: adminHint("POST /admin/inference/pause") });
  }

  /** `POST /admin/inference/resume`. */
  resume(): Promise<unknown> {
    return this.anyJson("POST", "/admin/inference/resume", { body: {}, notFoundHint: adminHint("POST /admin/inference/resume") });
  }

  /** `POST /admin/weights {version}`: the policy version stamped on every completion from now on. */
  setWeightVersion(version: string): Promise<unknown> {
    return this.anyJson("POST", "/admin/weights", { body: { version }, notFoundHint: adminHint("POST /admin/weights") });
  }

  /**
   * `POST /admin/inference/weights {version, load}`: every engine loads the weights through its own
   * route (a checkpoint folder, or a LoRA adapter under `name`), then the version moves. Inference
   * must be paused (409 otherwise); a rank that fails to load is a 502 naming it, and the version stays.
   */
  loadWeights(version: string, load: WeightLoad): Promise<unknown> {
    return this.anyJson("POST", "/admin/inference/weights", { body: { version, load }, notFoundHint: adminHint("POST /admin/inference/weights") });
  }

  /** `GET /admin/engines`: ranks, health, load, sessions. */
  engines(): Promise<unknown> {
    return this.anyJson("GET", "/admin/engines", { notFoundHint: adminHint("GET /admin/engines") });
  }

  /** `GET /readyz`: true when the gateway can serve (Redis answers; every engine has a rank that answers and a known model). */
  async ready(): Promise<boolean> {
    try {
      await this.send("GET", "/readyz", { timeoutMs: 5_000 });
      return true;
    } catch (err) {
      if (err instanceof RollgateError && err.status === 503) return false;
      throw err;
    }
  }
}

function adminHint(route: string): string {
  return `this gateway has no ${route} route: it is older than the admin API; upgrade the gateway`;
}

export type { CreateSessionRequest };
