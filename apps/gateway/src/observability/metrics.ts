import { TaskStatus, type CompletionRecord } from "@rollgate/protocol";
import { parseRankMember, type RankRouter, type TaskStore } from "@rollgate/store";
import type { Queue } from "bullmq";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import type { PreparedCall } from "../llm/chat-call.js";

/**
 * The gateway's Prometheus metrics (`GET /metrics`), one registry per app instance so several
 * gateways in one process (tests) never collide.
 *
 * Two kinds:
 * - event metrics, updated as things happen: LLM calls, tokens and engine latency (through
 *   ChatCaller's `observe` hook, once per recorded completion), gateway overhead and HTTP
 *   requests (request hooks, see request-hooks.ts);
 * - state metrics, read from Redis and this replica when Prometheus scrapes (`refresh`): queue
 *   depths and ages, tasks by status, callback delivery state, open sessions, rank health, pause
 *   state and weight version. Every replica reports the same fleet-wide values for these (they
 *   live in Redis), except `rollgate_inference_paused` / `rollgate_inflight_calls`, which are
 *   this replica's view.
 */

/** Per-request scratch the observe hook writes into: the engine time spent on this request. */
export interface RequestScope {
  engineMs: number;
  protocol: string | null;
}
/**
 * The scope of the agent request an engine call serves, found by the call's client signal (one
 * signal per agent request: routes/agent-common.ts clientAbortSignal). Not an AsyncLocalStorage:
 * that turns on promise hooks for every promise the process makes, a few % of its CPU under load.
 */
const scopes = new WeakMap<AbortSignal, RequestScope>();
export function bindRequestScope(signal: AbortSignal, scope: RequestScope): void {
  scopes.set(signal, scope);
}

export interface MetricSources {
  tasks: TaskStore;
  router: RankRouter;
  members: () => string[];
  paused: () => boolean;
  inflight: () => number;
  /** Agent body bytes held and calls waiting for them (ops/body-budget.ts). */
  bodyBudget: () => { inUse: number; queued: number };
  weightVersion: () => Promise<string | null>;
  queues: Queue[];
}

const CALLBACK_STATES = ["pending", "retrying", "delivered", "failed"] as const;
const JOB_STATES = ["waiting", "active", "delayed", "prioritized", "waiting-children", "completed", "failed"] as const;

export interface GatewayMetricsOptions {
  /** How many of the newest tasks of the task index `rollgate_tasks` looks at on each scrape. */
  taskScan?: number;
  /** Node process metrics (CPU, memory, event loop lag, GC), prefixed `rollgate_gateway_`. */
  processMetrics?: boolean;
}

export class GatewayMetrics {
  readonly registry = new Registry();
  private readonly taskScan: number;

  private readonly llmCalls: Counter<"protocol" | "engine" | "dp_rank">;
  private readonly llmTokens: Counter<"protocol" | "engine" | "dp_rank" | "kind">;
  private readonly engineLatency: Histogram<"protocol" | "engine" | "dp_rank">;
  private readonly overhead: Histogram<"protocol">;
  /**
   * The per-call counters are summed here, per series, and handed to prom-client when it is read
   * (a scrape: the counters' `collect`). A prom-client child (`labels()`) is only its labels bound:
   * each inc validated and hashed the label set again, five times per recorded call.
   */
  private readonly requestSeries = new Map<string, { labels: { method: string; route: string; status_code: string }; n: number }>();
  private readonly overheadSeries = new Map<string, Histogram.Internal<"protocol">>();
  private readonly callSeries = new Map<
    string,
    { labels: { protocol: string; engine: string; dp_rank: string }; calls: number; prompt: number; completion: number; cached: number; latency: Histogram.Internal<"protocol" | "engine" | "dp_rank"> }
  >();
  private readonly pauseCuts: Counter<"engine" | "dp_rank">;
  private readonly retriedCalls: Counter<"engine" | "dp_rank" | "reason">;
  private readonly replayedCalls: Counter<"protocol">;
  private readonly httpRequests: Counter<"method" | "route" | "status_code">;
  private readonly refreshErrors: Counter<"source">;
  private readonly lostCalls: Counter<"kind">;
  private readonly storeErrors: Counter<"what">;
  private readonly backgroundErrors: Counter<"operation">;

  private readonly queueJobs: Gauge<"queue" | "state">;
  private readonly queueOldest: Gauge<"queue">;
  private readonly tasks: Gauge<"status">;
  private readonly tasksScanned: Gauge;
  private readonly tasksIndexed: Gauge;
  private readonly callbacks: Gauge<"state">;
  private readonly sessionsOpen: Gauge;
  private readonly rankSessions: Gauge<"engine" | "dp_rank">;
  private readonly rankUp: Gauge<"engine" | "dp_rank">;
  private readonly paused: Gauge;
  private readonly inflight: Gauge;
  private readonly bodyBytes: Gauge;
  private readonly bodyWaiting: Gauge;
  private readonly bodyTimeouts: Counter;
  private readonly weightVersion: Gauge<"version">;

  constructor(opts: GatewayMetricsOptions = {}) {
    this.taskScan = opts.taskScan ?? 1000;
    const registers = [this.registry];
    if (opts.processMetrics) collectDefaultMetrics({ register: this.registry, prefix: "rollgate_gateway_" });

    // Either counter read first hands over the sums of both (they are read together on a scrape).
    const flushCalls = () => this.flushCallSums();
    this.llmCalls = new Counter({
      name: "rollgate_llm_calls_total",
      help: "Recorded LLM calls (one per completion record), by client protocol and engine rank.",
      labelNames: ["protocol", "engine", "dp_rank"],
      registers,
      collect: flushCalls,
    });
    this.pauseCuts = new Counter({
      name: "rollgate_pause_cuts_total",
      help: "Times an abort-mode pause cut a call that was then continued token-in from its tokens, by rank.",
      labelNames: ["engine", "dp_rank"],
      registers,
    });
    this.retriedCalls = new Counter({
      name: "rollgate_engine_calls_retried_total",
      help: "Calls whose rank failed before the engine answered anything (unreachable, down, or its stream broken off before the first token), made again on another rank; by the rank that failed and why.",
      labelNames: ["engine", "dp_rank", "reason"],
      registers,
    });
    this.replayedCalls = new Counter({
      name: "rollgate_replayed_calls_total",
      help: "A branch's calls answered from its source's records, by client protocol (no engine call: not in rollgate_llm_calls_total nor its tokens).",
      labelNames: ["protocol"],
      registers,
    });
    this.llmTokens = new Counter({
      name: "rollgate_llm_tokens_total",
      help: "Tokens of recorded LLM calls by kind (prompt, completion, cached = prompt tokens served from the prefix cache).",
      labelNames: ["protocol", "engine", "dp_rank", "kind"],
      registers,
      collect: flushCalls,
    });
    this.engineLatency = new Histogram({
      name: "rollgate_engine_latency_seconds",
      help: "Engine time of a recorded call (the record's latency_ms: from dispatch, pause waits included, to the engine's last token).",
      labelNames: ["protocol", "engine", "dp_rank"],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900],
      registers,
    });
    this.overhead = new Histogram({
      name: "rollgate_gateway_overhead_seconds",
      help: "Agent request time spent in the gateway: total request time minus the engine time of the calls it recorded.",
      labelNames: ["protocol"],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    });
    this.httpRequests = new Counter({
      name: "rollgate_http_requests_total",
      help: "HTTP requests answered, by method, route pattern and status code.",
      labelNames: ["method", "route", "status_code"],
      registers,
      collect: () => {
        for (const series of this.requestSeries.values()) {
          if (series.n === 0) continue;
          this.httpRequests.inc(series.labels, series.n);
          series.n = 0;
        }
      },
    });
    this.refreshErrors = new Counter({
      name: "rollgate_metrics_refresh_errors_total",
      help: "Scrapes where a state metric could not be read (its previous value is kept).",
      labelNames: ["source"],
      registers,
    });

    this.lostCalls = new Counter({
      name: "rollgate_lost_calls_total",
      help: "Agent calls lost to infrastructure (engine unreachable or 5xx, Redis away, gateway errors), by failure kind: their rollouts are not scored.",
      labelNames: ["kind"],
      registers,
    });
    this.storeErrors = new Counter({
      name: "rollgate_store_errors_total",
      help: "Writes to Redis that failed and were given up (logged with their context), by what was being written.",
      labelNames: ["what"],
      registers,
    });
    this.backgroundErrors = new Counter({
      name: "rollgate_background_errors_total",
      help: "Background writes that failed (e.g. report_inflight: this replica's in-flight count for the pause route), each also logged.",
      labelNames: ["operation"],
      registers,
    });

    this.queueJobs = new Gauge({ name: "rollgate_queue_jobs", help: "BullMQ jobs by queue and state.", labelNames: ["queue", "state"], registers });
    this.queueOldest = new Gauge({
      name: "rollgate_queue_oldest_waiting_age_seconds",
      help: "Age of the oldest waiting job of a queue (0 when none waits).",
      labelNames: ["queue"],
      registers,
    });
    this.tasks = new Gauge({
      name: "rollgate_tasks",
      help: "Tasks by status among the newest rollgate_tasks_scanned tasks of the task index (an approximation on large histories).",
      labelNames: ["status"],
      registers,
    });
    this.tasksScanned = new Gauge({ name: "rollgate_tasks_scanned", help: "How many tasks rollgate_tasks and rollgate_callbacks looked at.", registers });
    this.tasksIndexed = new Gauge({ name: "rollgate_tasks_indexed", help: "Tasks in the task index (including ones whose record expired).", registers });
    this.callbacks = new Gauge({
      name: "rollgate_callbacks",
      help: "Task callback deliveries by state among the scanned tasks (retrying = pending after at least one failed attempt).",
      labelNames: ["state"],
      registers,
    });
    this.sessionsOpen = new Gauge({ name: "rollgate_sessions_open", help: "Open sessions (the sum of the rank loads).", registers });
    this.rankSessions = new Gauge({ name: "rollgate_rank_sessions", help: "Open sessions assigned to an engine rank.", labelNames: ["engine", "dp_rank"], registers });
    this.rankUp = new Gauge({ name: "rollgate_engine_rank_up", help: "1 when an engine rank is healthy, 0 when health checks marked it down.", labelNames: ["engine", "dp_rank"], registers });
    this.paused = new Gauge({ name: "rollgate_inference_paused", help: "1 while inference is paused (POST /admin/inference/pause), as this replica sees it.", registers });
    this.inflight = new Gauge({ name: "rollgate_inflight_calls", help: "Engine calls in flight on this replica.", registers });
    this.bodyBytes = new Gauge({ name: "rollgate_agent_body_bytes", help: "Bytes of agent request bodies this replica holds (ROLLGATE_AGENT_BODY_BUDGET_MB caps them).", registers });
    this.bodyWaiting = new Gauge({ name: "rollgate_agent_calls_waiting_for_body_budget", help: "Agent calls waiting, their bodies unread, for earlier bodies to be done with.", registers });
    this.bodyTimeouts = new Counter({
      name: "rollgate_agent_body_timeouts_total",
      help: "Agent connections closed because a body did not arrive within ROLLGATE_AGENT_BODY_TIMEOUT_S.",
      registers,
    });
    this.weightVersion = new Gauge({
      name: "rollgate_weight_version_info",
      help: "The policy weight version stamped on new completions (value 1, the version is the label; absent when none is set).",
      labelNames: ["version"],
      registers,
    });
  }

  /** ChatCaller's `observe` hook: one recorded completion. */
  readonly observeCall = (record: CompletionRecord, call: PreparedCall): void => {
    // A branch's replayed answer was generated by its source's call (counted then): the engine did
    // nothing for it, and its time was the gateway's.
    if (record.replayed_from !== undefined) {
      this.replayedCalls.inc({ protocol: record.protocol });
      const scope = scopes.get(call.engineCall.signal);
      if (scope) scope.protocol = record.protocol;
      return;
    }
    const engine = String(call.target.engineIndex);
    const dpRank = String(record.dp_rank);
    const key = `${record.protocol}\u0000${engine}\u0000${dpRank}`;
    let series = this.callSeries.get(key);
    if (!series) {
      const labels = { protocol: record.protocol, engine, dp_rank: dpRank };
      series = { labels, calls: 0, prompt: 0, completion: 0, cached: 0, latency: this.engineLatency.labels(labels) };
      this.callSeries.set(key, series);
    }
    series.calls += 1;
    series.prompt += record.usage.prompt_tokens;
    series.completion += record.usage.completion_tokens;
    series.cached += record.usage.cached_tokens;
    series.latency.observe(record.latency_ms / 1000);
    if (record.continued_after_pause) this.pauseCuts.inc({ engine, dp_rank: dpRank }, record.continued_after_pause);
    const scope = scopes.get(call.engineCall.signal);
    if (scope) {
      scope.engineMs += record.latency_ms;
      scope.protocol = record.protocol;
    }
  };

  /** Hands the recorded calls' summed counts to prom-client (on a scrape). */
  private flushCallSums(): void {
    for (const s of this.callSeries.values()) {
      if (s.calls === 0) continue;
      this.llmCalls.inc(s.labels, s.calls);
      this.llmTokens.inc({ ...s.labels, kind: "prompt" }, s.prompt);
      this.llmTokens.inc({ ...s.labels, kind: "completion" }, s.completion);
      this.llmTokens.inc({ ...s.labels, kind: "cached" }, s.cached);
      s.calls = s.prompt = s.completion = s.cached = 0;
    }
  }

  /** A call made again on another rank after `engine`/`dpRank` failed it before answering anything. */
  retriedCall(engine: number, dpRank: number, reason: string): void {
    this.retriedCalls.inc({ engine: String(engine), dp_rank: String(dpRank), reason });
  }

  /** An agent call lost to infrastructure (its session is marked). */
  lostCall(kind: string): void {
    this.lostCalls.inc({ kind });
  }

  /** A Redis write that failed and was given up. */
  storeError(what: string): void {
    this.storeErrors.inc({ what });
  }

  /** An agent connection closed because its body did not arrive in time (ops/body-budget.ts). */
  bodyTimedOut(): void {
    this.bodyTimeouts.inc();
  }

  /** A background write failed (the caller logged it). */
  backgroundError(operation: string): void {
    this.backgroundErrors.inc({ operation });
  }

  /** One answered HTTP request; for an agent request that recorded calls, its gateway overhead too. */
  observeRequest(method: string, route: string, statusCode: number, totalMs: number, scope: RequestScope | undefined): void {
    // Looked up once per series, as callSeries (routes are templates: the series are few).
    const key = `${method}\u0000${route}\u0000${statusCode}`;
    let requests = this.requestSeries.get(key);
    if (!requests) this.requestSeries.set(key, (requests = { labels: { method, route, status_code: String(statusCode) }, n: 0 }));
    requests.n += 1;
    if (scope?.protocol) {
      let overhead = this.overheadSeries.get(scope.protocol);
      if (!overhead) this.overheadSeries.set(scope.protocol, (overhead = this.overhead.labels({ protocol: scope.protocol })));
      overhead.observe(Math.max(0, totalMs - scope.engineMs) / 1000);
    }
  }

  /** Reads every state metric (one scrape). A source that fails keeps its last values and counts an error. */
  async refresh(src: MetricSources): Promise<void> {
    const guard = (source: string, p: Promise<void>) =>
      p.catch(() => {
        this.refreshErrors.inc({ source });
      });
    this.paused.set(src.paused() ? 1 : 0);
    this.inflight.set(src.inflight());
    const body = src.bodyBudget();
    this.bodyBytes.set(body.inUse);
    this.bodyWaiting.set(body.queued);
    await Promise.all([
      guard("queues", this.refreshQueues(src.queues)),
      guard("tasks", this.refreshTasks(src.tasks)),
      guard("routing", this.refreshRouting(src)),
      guard("weights", this.refreshWeights(src)),
    ]);
  }

  private async refreshQueues(queues: Queue[]): Promise<void> {
    const now = Date.now();
    await Promise.all(
      queues.map(async (q) => {
        const [counts, oldest] = await Promise.all([q.getJobCounts(...JOB_STATES), q.getWaiting(0, 0)]);
        for (const state of JOB_STATES) this.queueJobs.set({ queue: q.name, state }, counts[state] ?? 0);
        const ts = oldest[0]?.timestamp;
        this.queueOldest.set({ queue: q.name }, ts ? Math.max(0, (now - ts) / 1000) : 0);
      }),
    );
  }

  /**
   * Tasks by status and callback state: the newest `taskScan` tasks of the task index (read by
   * the task store). Older tasks are not counted, and tasks whose record expired (result TTL) drop
   * out; `rollgate_tasks_indexed` says how many the index holds.
   */
  private async refreshTasks(store: TaskStore): Promise<void> {
    const { indexed, tasks } = await store.recentStates(this.taskScan);
    const byStatus: Record<string, number> = Object.fromEntries(TaskStatus.options.map((s) => [s, 0]));
    const byCallback: Record<string, number> = Object.fromEntries(CALLBACK_STATES.map((s) => [s, 0]));
    for (const { status, callback: cb } of tasks) {
      byStatus[status] = (byStatus[status] ?? 0) + 1;
      if (!cb || cb.state === "none") continue;
      const state = cb.state === "pending" && cb.attempts > 0 ? "retrying" : cb.state;
      byCallback[state] = (byCallback[state] ?? 0) + 1;
    }
    for (const [status, n] of Object.entries(byStatus)) this.tasks.set({ status }, n);
    for (const [state, n] of Object.entries(byCallback)) this.callbacks.set({ state }, n);
    this.tasksScanned.set(tasks.length);
    this.tasksIndexed.set(indexed);
  }

  private async refreshRouting(src: MetricSources): Promise<void> {
    const [loads, down] = await Promise.all([src.router.loads(), src.router.downRanks()]);
    this.rankSessions.reset();
    this.rankUp.reset();
    for (const member of src.members()) {
      const { engine, dpRank } = parseRankMember(member);
      const labels = { engine: String(engine), dp_rank: String(dpRank) };
      this.rankSessions.set(labels, Math.max(0, loads[member] ?? 0));
      this.rankUp.set(labels, down.has(member) ? 0 : 1);
    }
    // Every rank's load, configured now or not (sessions on a removed engine are still open).
    this.sessionsOpen.set(Object.values(loads).reduce((sum, n) => sum + Math.max(0, n), 0));
  }

  private async refreshWeights(src: MetricSources): Promise<void> {
    const version = await src.weightVersion();
    this.weightVersion.reset();
    if (version !== null) this.weightVersion.set({ version }, 1);
  }
}
