import { ClosedSession, CreateSessionResponse, Readiness, Session, Trajectory, type CreateSessionRequest, type TrajectoryBuilderName } from "@rollgate/protocol";
import { request } from "undici";
import { z } from "zod";

/**
 * A gateway answer the worker could not use. `status` is the HTTP status (null: no answer at all)
 * and `code` the server's error type (`{error: {type}}`), so callers decide by type and status,
 * never by message text.
 */
export class GatewayError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
    readonly code: string | null,
  ) {
    super(message);
    this.name = new.target.name;
  }
}

/** The gateway could not be reached or failed (transport error or 5xx): infrastructure, so the rollout is retried. */
export class GatewayUnavailable extends GatewayError {}

/**
 * The gateway refused the request (4xx: a wrong API key, a bad request, an unknown session) or
 * answered something this worker cannot read: the same request would be refused again, so the
 * task fails with this error instead of being retried.
 */
export class GatewayRefused extends GatewayError {}

const ErrorEnvelope = z.object({ error: z.object({ type: z.string(), message: z.string().optional() }) });

/** Sorts a non-2xx answer: 5xx is unavailable (retried), 4xx refused (final). Pure. */
export function classifyAnswer(what: string, status: number, body: string): GatewayError {
  let code: string | null = null;
  let detail = body.slice(0, 500);
  try {
    const env = ErrorEnvelope.safeParse(JSON.parse(body));
    if (env.success) {
      code = env.data.error.type;
      detail = `${code}: ${env.data.error.message ?? ""}`.trim();
    }
  } catch {
    // not JSON: the start of the body says what it was
  }
  const message = `${what} answered ${status}${detail ? ` (${detail})` : ""}`;
  return status >= 500 ? new GatewayUnavailable(message, status, code) : new GatewayRefused(message, status, code);
}

/** The worker's view of the gateway's session API (workers never touch engines directly). */
export class GatewayClient {
  constructor(
    private readonly baseUrl: string,
    private readonly apiKey: string | undefined,
  ) {}

  private async call<T>(method: "GET" | "POST", path: string, read: Reader<T>, body?: unknown, accept: number[] = []): Promise<T> {
    const what = `${method} ${path}`;
    let res;
    try {
      res = await request(`${this.baseUrl}${path}`, {
        method,
        headers: {
          ...(body !== undefined ? { "content-type": "application/json" } : {}),
          ...(this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {}),
        },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        headersTimeout: 60_000,
        bodyTimeout: 120_000,
      });
    } catch (err) {
      throw new GatewayUnavailable(`gateway ${this.baseUrl} unreachable: ${(err as Error).message}`, null, null);
    }
    let text: string;
    try {
      text = await res.body.text();
    } catch (err) {
      throw new GatewayUnavailable(`${what}: the answer was cut off: ${(err as Error).message}`, res.statusCode, null);
    }
    if ((res.statusCode < 200 || res.statusCode >= 300) && !accept.includes(res.statusCode)) throw classifyAnswer(what, res.statusCode, text);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw new GatewayRefused(`${what} answered ${res.statusCode} with a body that is not JSON: ${text.slice(0, 200)}`, res.statusCode, "bad_response");
    }
    const parsed = read.schema.safeParse(json);
    if (!parsed.success) {
      const problem = parsed.error.issues.map((i) => `${i.path.length ? i.path.join(".") : "body"}: ${i.message}`).join("; ");
      throw new GatewayRefused(`${what} answered ${res.statusCode} with a body this worker cannot read: ${problem.slice(0, 500)}`, res.statusCode, "bad_response");
    }
    return parsed.data as T;
  }

  openSession(req: Partial<CreateSessionRequest>) {
    return this.call("POST", "/v1/sessions", readOpened, req);
  }
  /** Closes the session; with a builder, the answer also holds its trajectory (or why it has none). */
  closeSession(id: string, trajectory?: TrajectoryBuilderName) {
    return this.call("POST", `/v1/sessions/${encodeURIComponent(id)}/close${trajectory ? `?trajectory=${trajectory}` : ""}`, readClosed);
  }
  session(id: string) {
    return this.call("GET", `/v1/sessions/${encodeURIComponent(id)}`, readSession);
  }
  trajectory(id: string, builder: TrajectoryBuilderName) {
    return this.call("GET", `/v1/sessions/${encodeURIComponent(id)}/trajectory?builder=${builder}`, readTrajectory);
  }
  /** `GET /readyz`: the body whether it is 200 (ready) or 503 (not ready, and why). Not per rollout: checked in full. */
  readiness() {
    return this.call("GET", "/readyz", reader<Readiness>(Readiness), undefined, [503]);
  }
}

// The gateway's answers are checked with zod in the fields this worker reads; the rest is kept as
// sent (loose objects), and a trajectory's traces are not walked: the gateway built them through
// the protocol's schemas, and checking every token id and logprob again cost the worker more than
// anything else it does with the answer. A body without what the worker needs is still a clear
// GatewayRefused ("bad_response") naming the field, never a crash.

const OpenedView = z.looseObject(CreateSessionResponse.pick({ id: true, token: true, base_url: true }).shape);
const SessionView = z.looseObject(Session.pick({ id: true, lost_calls: true, replay_diverged: true }).shape);
// In the protocol's key order (builder, traces, stats; then `tree` as sent): the object is stored
// in the task's result as is, and its JSON is the bytes of the signed callback body.
const TrajectoryView = z.looseObject({ builder: Trajectory.shape.builder, traces: z.array(z.unknown()), stats: Trajectory.shape.stats });
const ClosedView = SessionView.extend({
  counts: Session.shape.counts,
  trajectory: TrajectoryView.optional(),
  trajectory_error: ClosedSession.shape.trajectory_error,
});

/** What openSession's caller reads of the answer. */
export type OpenedSession = Pick<CreateSessionResponse, "id" | "token" | "base_url">;
/** What the worker reads of a session: its lost calls and whether its replay diverged. */
export type SessionState = Pick<Session, "id" | "lost_calls" | "replay_diverged">;
/** What the worker reads of a closed session: as a session, plus its counts and its trajectory (or why it has none). */
export type ClosedState = SessionState & Pick<ClosedSession, "counts" | "trajectory" | "trajectory_error">;

/** A schema of the fields read, and the type the caller gets (the traces as the gateway built them). */
type Reader<T> = { schema: z.ZodType; _answer?: T };
const reader = <T>(schema: z.ZodType): Reader<T> => ({ schema });
const readOpened = reader<OpenedSession>(OpenedView);
const readSession = reader<SessionState>(SessionView);
const readClosed = reader<ClosedState>(ClosedView);
const readTrajectory = reader<Trajectory>(TrajectoryView);
