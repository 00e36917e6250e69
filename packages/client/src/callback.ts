import http from "node:http";
import type { AddressInfo } from "node:net";
import { TaskResult, type GroupResult } from "@rollgate/protocol";
import { RollgateError } from "./errors.js";
import { DEFAULT_SIGNATURE_TOLERANCE_SECONDS, verifyDelivery } from "./signature.js";

/** One verified callback delivery. */
export interface CallbackDelivery {
  /** `X-Rollgate-Event`: `task.<status>` or `group.completed`. */
  event: string;
  /** `X-Rollgate-Delivery`: stable across retries (deliveries are de-duplicated on it). */
  deliveryId: string;
  rawBody: string;
  body: unknown;
}

/** A group callback's body: every member's result and the group's summary (which members have no reward, and why). */
export type GroupCallbackBody = GroupResult;

export interface CallbackServerOptions {
  /** The `callback.secret` the tasks were submitted with: deliveries with a bad signature get 401. */
  secret: string;
  /**
   * How far (seconds, either way) a delivery's `X-Rollgate-Timestamp` may be from this machine's
   * clock; one further is refused (401) as a possible replay. Default 300 (5 minutes).
   */
  toleranceSeconds?: number;
  /** Default 0 (a free port). */
  port?: number;
  /** Default 127.0.0.1; use 0.0.0.0 when the workers run on other hosts. */
  host?: string;
  /** The URL workers should call, when it differs from the listen address (NAT, containers). */
  publicUrl?: string;
  /**
   * Called once for every new verified delivery: retries of an acknowledged one are not repeated,
   * and a retry that arrives while the handler still runs (the worker stops waiting after 30 s)
   * waits for it; a handler that throws answers 500, and the retry calls it again.
   */
  onDelivery?: (delivery: CallbackDelivery) => void | Promise<void>;
  /**
   * Bodies larger than this are refused (413) before they are all held in memory: the signature is
   * checked only once the body is whole, so anyone who can reach the port could otherwise make
   * the trainer hold a body of any size. Default 512 MiB (a trajectory with routed experts is large).
   */
  maxBodyBytes?: number;
}

export interface CallbackServer {
  /** Put this in `task.callback.url` (or `group_callback.url`). */
  url: string;
  /** Every verified delivery so far, in arrival order. */
  deliveries: CallbackDelivery[];
  /** How many deliveries were refused for a bad or missing signature or a stale timestamp. */
  rejected: () => number;
  /** The result of task `id`, once its callback arrives. */
  waitForResult: (id: string, opts?: { timeoutMs?: number; signal?: AbortSignal }) => Promise<TaskResult>;
  /** A group's results, once its group callback arrives. */
  waitForGroup: (groupId: string, opts?: { timeoutMs?: number; signal?: AbortSignal }) => Promise<GroupCallbackBody>;
  /**
   * Lets go of what is held for a task or a group (a group: its members' results too, and their
   * deliveries): a long run keeps one server, and every result it holds would stay in memory.
   * Delivery ids are still remembered, so a retry is still acknowledged without being kept.
   */
  forget: (taskOrGroupId: string) => void;
  close: () => Promise<void>;
}

/** Answers 413 and ends the connection: the rest of the body is not read, so it must not be parsed as a request. */
function refuseTooLarge(res: http.ServerResponse): void {
  if (!res.headersSent) res.writeHead(413, { connection: "close" }).end("body too large");
}

const isTaskBody = (b: unknown): boolean => typeof b === "object" && b !== null && typeof (b as { id?: unknown }).id === "string" && typeof (b as { status?: unknown }).status === "string";
const isGroupBody = (b: unknown): boolean => typeof b === "object" && b !== null && typeof (b as { group_id?: unknown }).group_id === "string" && Array.isArray((b as { tasks?: unknown }).tasks);

/**
 * A small HTTP server that receives rollgate callbacks: it checks `X-Rollgate-Signature-V2`
 * (HMAC-SHA256 with `secret` over the delivery id, the timestamp, the event and the raw body) and
 * that the timestamp is within `toleranceSeconds` of now, answers 401 to a forgery, a replay under
 * another delivery id or event, a stale delivery or one with only the legacy body-only
 * `X-Rollgate-Signature`, and 200 to the rest,
 * de-duplicates retries by `X-Rollgate-Delivery`, and lets you await a task's or a group's result.
 */
export async function startCallbackServer(opts: CallbackServerOptions): Promise<CallbackServer> {
  const deliveries: CallbackDelivery[] = [];
  const seen = new Set<string>();
  /** Deliveries whose handler is running, by id: settled when it returns or throws. */
  const inflight = new Map<string, Promise<void>>();
  const taskResults = new Map<string, TaskResult>();
  const groups = new Map<string, GroupCallbackBody>();
  const waiters = new Set<() => void>();
  let rejected = 0;

  const server = http.createServer((req, res) => {
    if (req.method !== "POST") {
      res.writeHead(405, { allow: "POST" }).end();
      return;
    }
    const limit = opts.maxBodyBytes ?? 512 * 1024 * 1024;
    if (Number(req.headers["content-length"] ?? 0) > limit) return void refuseTooLarge(res);
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        chunks.length = 0;
        refuseTooLarge(res);
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => {
      void (async () => {
        const raw = Buffer.concat(chunks);
        const refused = verifyDelivery(raw, req.headers, opts.secret, { toleranceSeconds: opts.toleranceSeconds ?? DEFAULT_SIGNATURE_TOLERANCE_SECONDS });
        if (refused) {
          rejected++;
          res.writeHead(401, { "content-type": "application/json" }).end(JSON.stringify({ error: refused }));
          return;
        }
        const deliveryId = String(req.headers["x-rollgate-delivery"] ?? "");
        // A retry that comes while the same delivery is still being handled (the worker gave up
        // waiting for a slow handler) waits for that one: handled once, or again if it failed.
        for (let running = inflight.get(deliveryId); deliveryId && running; running = inflight.get(deliveryId)) await running;
        if (deliveryId && seen.has(deliveryId)) {
          res.writeHead(200).end("duplicate");
          return;
        }
        let body: unknown;
        try {
          body = JSON.parse(raw.toString("utf8"));
        } catch {
          res.writeHead(400).end("not JSON");
          return;
        }
        // Only the body is signed, not X-Rollgate-Event: a task's genuine body re-sent as
        // `group.completed` must not be filed as its group (its waiter would get no members).
        const isGroup = String(req.headers["x-rollgate-event"] ?? "").startsWith("group.");
        if (!(isGroup ? isGroupBody(body) : isTaskBody(body))) {
          res.writeHead(400).end(`the body is not a ${isGroup ? "group" : "task"} result`);
          return;
        }
        const delivery: CallbackDelivery = { event: String(req.headers["x-rollgate-event"] ?? ""), deliveryId, rawBody: raw.toString("utf8"), body };
        let handled!: () => void;
        if (deliveryId) inflight.set(deliveryId, new Promise<void>((r) => (handled = r)));
        try {
          await opts.onDelivery?.(delivery);
        } catch {
          // The handler failed: answer 500 so the gateway retries this delivery.
          res.writeHead(500).end("handler failed");
          return;
        } finally {
          if (deliveryId) {
            // A waiting retry resumes only after the synchronous rest of this run: it finds the id
            // seen when the handler succeeded, and handles the delivery itself when it failed.
            inflight.delete(deliveryId);
            handled();
          }
        }
        if (deliveryId) seen.add(deliveryId);
        deliveries.push(delivery);
        if (delivery.event.startsWith("group.")) {
          const g = body as GroupCallbackBody;
          groups.set(g.group_id, g);
        } else {
          const r = TaskResult.safeParse(body);
          if (r.success) taskResults.set(r.data.id, r.data);
        }
        res.writeHead(200).end("ok");
        for (const w of [...waiters]) w();
      })();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, opts.host ?? "127.0.0.1", () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const host = opts.host && opts.host !== "0.0.0.0" && opts.host !== "::" ? opts.host : "127.0.0.1";
  const url = opts.publicUrl ?? `http://${host.includes(":") ? `[${host}]` : host}:${addr.port}/rollouts`;

  function forget(id: string): void {
    const group = groups.get(id);
    const members = new Set<string>([id, ...(group?.tasks ?? []).flatMap((t) => (t && typeof t.id === "string" ? [t.id] : []))]);
    groups.delete(id);
    for (const m of members) taskResults.delete(m);
    for (let i = deliveries.length - 1; i >= 0; i--) {
      const b = deliveries[i]!.body as { id?: unknown; group_id?: unknown };
      const isGroupDelivery = deliveries[i]!.event.startsWith("group.");
      if ((isGroupDelivery && b.group_id === id) || (!isGroupDelivery && members.has(String(b.id)))) deliveries.splice(i, 1);
    }
  }

  function waitFor<T>(get: () => T | undefined, what: string, o: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<T> {
    return new Promise((resolve, reject) => {
      const ready = get();
      if (ready !== undefined) return resolve(ready);
      const check = () => {
        const v = get();
        if (v !== undefined) {
          done();
          resolve(v);
        }
      };
      const timer =
        o.timeoutMs !== undefined
          ? setTimeout(() => {
              done();
              reject(new RollgateError(`no callback for ${what} within ${o.timeoutMs} ms`, 0, "timeout"));
            }, o.timeoutMs)
          : undefined;
      const onAbort = () => {
        done();
        reject(new RollgateError(`stopped waiting for ${what}`, 0, "aborted"));
      };
      function done() {
        waiters.delete(check);
        if (timer) clearTimeout(timer);
        o.signal?.removeEventListener("abort", onAbort);
      }
      waiters.add(check);
      o.signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  return {
    url,
    deliveries,
    rejected: () => rejected,
    waitForResult: (id, o) => waitFor(() => taskResults.get(id), `task ${id}`, o),
    waitForGroup: (groupId, o) => waitFor(() => groups.get(groupId), `group ${groupId}`, o),
    forget,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}
