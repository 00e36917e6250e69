import type { IncomingMessage } from "node:http";
import type { Session } from "@rollgate/protocol";
import { LogController, type FastifyBaseLogger, type FastifyReply, type FastifyRequest } from "fastify";
import type { Bindings, ChildLoggerOptions, Logger, LoggerOptions } from "pino";

/**
 * Gateway logging: what every line carries (reqId; the session and task ids of agent routes) and
 * what no line may carry (session tokens, API keys, callback secrets).
 *
 * Secrets reach a request in three places: the `authorization`, `x-api-key` and
 * `x-goog-api-key` headers, and a `?key=` query parameter (Gemini SDKs put the API key there,
 * and `/admin/queues` accepts the admin key there). Headers are redacted by path; URLs are
 * rewritten by the `req` serializer and by the routeNotFound line, the only Fastify line that
 * prints a URL inside its message.
 */

export const REDACTED = "[REDACTED]";

/** Query parameters whose value is a credential. */
const SECRET_PARAMS = ["key", "api_key", "apikey", "token", "access_token", "admin_key"];
const SECRET_QUERY = new RegExp(`([?&](?:${SECRET_PARAMS.join("|")})=)[^&#\\s"]*`, "gi");

/** The URL with every credential query parameter's value replaced. */
export function maskUrl(url: string): string {
  return url.replace(SECRET_QUERY, `$1${REDACTED}`);
}

const SECRET_HEADERS = ["authorization", "x-api-key", "x-goog-api-key", "cookie", "proxy-authorization"];
/** pino `redact` paths: secret headers wherever a request or headers object is logged, and secret fields. */
export const REDACT_PATHS = [
  ...SECRET_HEADERS.flatMap((h) => [`req.headers["${h}"]`, `headers["${h}"]`, `request.headers["${h}"]`]),
  ...["key", "api_key", "token", "access_token"].flatMap((k) => [`query.${k}`, `req.query.${k}`]),
  "token",
  "*.token",
  "secret",
  "*.secret",
  "*.*.secret",
  "apiKey",
  "*.apiKey",
];

/** Fastify's request serializer, with the URL's credentials masked. Takes a Fastify or a raw request. */
export function serializeRequest(req: FastifyRequest | IncomingMessage): Record<string, unknown> {
  const r = req as Partial<FastifyRequest> & Partial<IncomingMessage>;
  const raw = ("raw" in r && r.raw ? r.raw : r) as IncomingMessage;
  return {
    method: r.method,
    url: maskUrl(r.url ?? raw.url ?? ""),
    version: raw.headers?.["accept-version"],
    host: r.host ?? raw.headers?.host,
    remoteAddress: r.ip ?? raw.socket?.remoteAddress,
    remotePort: raw.socket?.remotePort,
  };
}

/**
 * The gateway's logger: `base` (the caller's pino instance, or the default one) with the redaction
 * and the masking `req` serializer added, so they hold whatever logger a caller passes in.
 */
export function redactingLogger(base: Logger): Logger {
  return base.child({}, { redact: { paths: REDACT_PATHS, censor: REDACTED }, serializers: { req: serializeRequest } });
}

/**
 * Options for the default root logger (no logger passed in): the same redaction, plus a hook that
 * masks credential query parameters inside message strings as a last line of defence.
 */
export function rootLoggerOptions(level: string): LoggerOptions {
  return {
    level,
    redact: { paths: REDACT_PATHS, censor: REDACTED },
    serializers: { req: serializeRequest },
    hooks: {
      logMethod(args, method) {
        const masked = args.map((a) => (typeof a === "string" ? maskUrl(a) : a));
        return method.apply(this, masked as Parameters<typeof method>);
      },
    },
  };
}

/** Fastify's log controller with the one URL-in-a-message line masked. */
export class RedactingLogController extends LogController {
  override routeNotFound(request: FastifyRequest, reply: FastifyReply, metadata?: unknown): void {
    if (this.isLogDisabled(request)) return;
    void reply;
    void metadata;
    request.log.info(`Route ${request.raw.method}:${maskUrl(request.raw.url ?? "")} not found`);
  }
}

/** Ids a request's path names: `/s/:sid/…` and `/v1/sessions/:id…` → session_id, `/v1/tasks/:id…` → task_id. */
export function idsFromUrl(url: string | undefined): { session_id?: string; task_id?: string } {
  if (!url) return {};
  const path = url.split("?", 1)[0]!;
  const decode = (s: string) => {
    try {
      return decodeURIComponent(s);
    } catch {
      return s;
    }
  };
  let m = /^\/s\/([^/]+)(?:\/|$)/.exec(path) ?? /^\/v1\/sessions\/([^/]+)/.exec(path);
  if (m) return { session_id: decode(m[1]!) };
  m = /^\/v1\/tasks\/([^/]+)/.exec(path);
  if (m && m[1] !== "batch") return { task_id: decode(m[1]!) };
  return {};
}

/**
 * Which task a session belongs to (`session.metadata.task_id`), cached: a session's metadata never
 * changes, so one Redis read per session per replica (bounded map, entries expire after `ttlMs`
 * in case an id is deleted and reused).
 */
export class SessionTaskCache {
  private readonly entries = new Map<string, { taskId: string | null; at: number }>();

  constructor(
    private readonly load: (sid: string) => Promise<Session | null>,
    private readonly maxEntries = 10_000,
    private readonly ttlMs = 10 * 60_000,
  ) {}

  /** The cached answer: a task id, null (a session without a task), or undefined (not known yet). */
  peek(sid: string): string | null | undefined {
    const e = this.entries.get(sid);
    if (!e) return undefined;
    if (Date.now() - e.at > this.ttlMs) {
      this.entries.delete(sid);
      return undefined;
    }
    return e.taskId;
  }

  async taskOf(sid: string): Promise<string | null> {
    const cached = this.peek(sid);
    if (cached !== undefined) return cached;
    const session = await this.load(sid).catch(() => null);
    // An unknown session is not cached: it may be created in a moment.
    if (!session) return null;
    const raw = session.metadata.task_id;
    const taskId = typeof raw === "string" && raw ? raw : null;
    if (this.entries.size >= this.maxEntries) {
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(sid, { taskId, at: Date.now() });
    return taskId;
  }
}

/**
 * Fastify's `childLoggerFactory`: the request logger gets the session id (and the task id when
 * the cache knows it) from the URL, so even the "incoming request" line carries them. The
 * requestObservability plugin adds the task id after its lookup for a session seen first.
 *
 * The logger is made when the request first logs at an enabled level (or asks for a child or its
 * bindings): most agent requests log nothing, and a pino child per request (its bindings
 * serialised up front) was a visible share of the gateway's CPU per call.
 */
export function requestChildLogger(sessionTasks: SessionTaskCache) {
  return function childLoggerFactory(
    logger: FastifyBaseLogger,
    bindings: Bindings,
    opts: ChildLoggerOptions,
    rawReq: IncomingMessage,
  ): FastifyBaseLogger {
    return new RequestLogger(logger, bindings, opts, rawReq.url, sessionTasks);
  };
}

type LevelMethod = "fatal" | "error" | "warn" | "info" | "debug" | "trace";

/** A request's logger, made on first use (see requestChildLogger); lines are those of the logger it stands for. */
class RequestLogger implements FastifyBaseLogger {
  private made: FastifyBaseLogger | null = null;
  private ids: Bindings | null = null;

  constructor(
    private readonly parent: FastifyBaseLogger,
    private readonly base: Bindings,
    private readonly opts: ChildLoggerOptions,
    private readonly url: string | undefined,
    private readonly sessionTasks: SessionTaskCache,
  ) {}

  /** The ids the URL names, and the session's task id when the cache knows it. */
  extra(): Bindings {
    if (this.ids) return this.ids;
    const ids = idsFromUrl(this.url);
    const extra: Bindings = { ...ids };
    if (ids.session_id && !ids.task_id) {
      const taskId = this.sessionTasks.peek(ids.session_id);
      if (taskId) extra.task_id = taskId;
    }
    return (this.ids = extra);
  }

  private logger(): FastifyBaseLogger {
    return (this.made ??= this.parent.child({ ...this.base, ...this.extra() }, this.opts));
  }

  private write(level: LevelMethod, args: unknown[]): void {
    // Nothing is made for a line below the level: the parent's, unless the route set its own
    // (Fastify passes the route's logLevel, by default the parent's, as the child's level).
    if (!this.made && (this.opts.level === undefined || this.opts.level === this.parent.level) && !(this.parent as unknown as Logger).isLevelEnabled(level)) return;
    (this.logger()[level] as (...a: unknown[]) => void)(...args);
  }

  get level(): string {
    return this.made?.level ?? this.opts.level ?? this.parent.level;
  }
  set level(level: string) {
    this.logger().level = level;
  }
  fatal(...args: unknown[]): void {
    this.write("fatal", args);
  }
  error(...args: unknown[]): void {
    this.write("error", args);
  }
  warn(...args: unknown[]): void {
    this.write("warn", args);
  }
  info(...args: unknown[]): void {
    this.write("info", args);
  }
  debug(...args: unknown[]): void {
    this.write("debug", args);
  }
  trace(...args: unknown[]): void {
    this.write("trace", args);
  }
  silent(): void {}
  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.logger().child(bindings, options);
  }
  bindings(): Bindings {
    return (this.logger() as unknown as Logger).bindings();
  }
  isLevelEnabled(level: string): boolean {
    return ((this.made ?? this.parent) as unknown as Logger).isLevelEnabled(level);
  }
}

/** Whether a request logger carries a task id from the start (no parse of a logger's bindings). */
export function boundToTask(log: unknown): boolean {
  return log instanceof RequestLogger && log.extra().task_id !== undefined;
}
