import { Readiness, type ClosedSession, type CreateSessionRequest, type CreateSessionResponse, type LostCalls, type Session, type Trajectory, type TrajectoryBuilderName } from "@rollgate/protocol";
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
    const problem = read(json);
    if (problem !== null) throw new GatewayRefused(`${what} answered ${res.statusCode} with a body this worker cannot read: ${problem.slice(0, 500)}`, res.statusCode, "bad_response");
    return json as T;
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
    return this.call<Readiness>("GET", "/readyz", (j) => {
      const parsed = Readiness.safeParse(j);
      return parsed.success ? null : parsed.error.message;
    }, undefined, [503]);
  }
}

// The gateway's answers are checked structurally, only in the fields this worker reads, not by
// re-running the protocol's zod schemas: the gateway built each answer with those schemas (its
// replies are serialized through them), and a full check of a trajectory's token arrays cost the
// worker more than anything else it does with the answer. A body that is not what the worker
// needs is still a clear GatewayRefused ("bad_response") naming the field, never a crash.

/** Checks a parsed JSON answer (filling in what an older gateway leaves out); null when it is usable, else what is wrong. */
type Reader<T> = ((json: unknown) => string | null) & { __answer?: T };

/** What openSession's caller reads of the answer. */
export type OpenedSession = Pick<CreateSessionResponse, "id" | "token" | "base_url">;
/** What the worker reads of a session: its lost calls and whether its replay diverged. */
export type SessionView = Pick<Session, "id" | "lost_calls" | "replay_diverged">;
/** What the worker reads of a closed session: as a session, plus its counts and its trajectory (or why it has none). */
export type ClosedView = SessionView & Pick<ClosedSession, "counts" | "trajectory" | "trajectory_error">;

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);

function lostCallsProblem(v: unknown, at: string): string | null {
  if (!isObj(v)) return `${at}: expected an object`;
  if (!isInt(v.count) || v.count < 0) return `${at}.count: expected a non-negative integer`;
  const first = v.first;
  if (first === null) return null;
  if (!isObj(first)) return `${at}.first: expected an object or null`;
  for (const k of ["at", "kind", "message"] as const) if (typeof first[k] !== "string") return `${at}.first.${k}: expected a string`;
  if (!isInt(first.status)) return `${at}.first.status: expected an integer`;
  return null;
}

function sessionProblem(j: unknown): string | null {
  if (!isObj(j)) return "body: expected an object";
  if (typeof j.id !== "string") return "id: expected a string";
  // Defaults as the protocol has them (a gateway from before these fields).
  if (j.lost_calls === undefined) j.lost_calls = { count: 0, first: null } satisfies LostCalls;
  if (j.replay_diverged === undefined) j.replay_diverged = null;
  const lost = lostCallsProblem(j.lost_calls, "lost_calls");
  if (lost) return lost;
  const d = j.replay_diverged;
  if (d !== null && !(isObj(d) && isInt(d.call) && typeof d.message === "string")) return "replay_diverged: expected {call, message} or null";
  return null;
}

function trajectoryProblem(t: unknown, at: string): string | null {
  if (!isObj(t)) return `${at}: expected an object`;
  if (typeof t.builder !== "string") return `${at}.builder: expected a string`;
  if (!Array.isArray(t.traces)) return `${at}.traces: expected an array`;
  if (!isObj(t.stats)) return `${at}.stats: expected an object`;
  return null;
}

const readOpened: Reader<OpenedSession> = (j) => {
  if (!isObj(j)) return "body: expected an object";
  for (const k of ["id", "token", "base_url"] as const) if (typeof j[k] !== "string") return `${k}: expected a string`;
  return null;
};

const readSession: Reader<SessionView> = sessionProblem;

const readTrajectory: Reader<Trajectory> = (j) => trajectoryProblem(j, "body");

const readClosed: Reader<ClosedView> = (j) => {
  const p = sessionProblem(j);
  if (p) return p;
  const c = (j as Obj).counts;
  if (!isObj(c)) return "counts: expected an object";
  for (const k of ["llm_calls", "prompt_tokens", "completion_tokens", "cached_tokens"] as const) if (!isInt(c[k])) return `counts.${k}: expected an integer`;
  const { trajectory, trajectory_error: te } = j as Obj;
  if (te !== undefined && !(isObj(te) && typeof te.type === "string" && typeof te.message === "string")) return "trajectory_error: expected {type, message}";
  return trajectory === undefined ? null : trajectoryProblem(trajectory, "trajectory");
};
