import { signBody, signDelivery } from "@rollgate/client";
import { TaskResult, summarizeGroup, type CallbackState, type GroupResult } from "@rollgate/protocol";
import type { CallbackJob } from "@rollgate/queue";
import type { TaskStore } from "@rollgate/store";
import type { Job } from "bullmq";
import type { Logger } from "pino";
import { EgressDenied, egressRequest, type EgressPolicy } from "./egress.js";

export interface CallbackDeps {
  tasks: TaskStore;
  log: Logger;
  timeoutMs?: number;
  /** Where callbacks may go (default: the worker's configured policy, see egress.ts). */
  egress?: EgressPolicy;
}

interface Delivery {
  url: string;
  secret: string;
  event: string;
  body: string;
}

/**
 * POSTs one delivery; the error text, or null on a 2xx. A URL the egress policy refuses is a
 * final failure (`denied`): nothing is sent and it is not retried.
 */
async function post(d: Delivery, deliveryId: string, timeoutMs: number, egress?: EgressPolicy): Promise<{ error: string | null; denied?: boolean }> {
  let close: (() => Promise<void>) | undefined;
  // Signed at each attempt: a retry carries a fresh timestamp (and the same delivery id).
  const timestamp = Math.floor(Date.now() / 1000);
  try {
    const sent = await egressRequest(d.url, "callback.url", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "user-agent": "rollgate-callback/1",
        "x-rollgate-event": d.event,
        "x-rollgate-delivery": deliveryId,
        "x-rollgate-timestamp": String(timestamp),
        "x-rollgate-signature-v2": signDelivery({ deliveryId, event: d.event, timestamp, body: d.body }, d.secret),
        // Body-only, for receivers of the previous release during a rolling upgrade; current
        // receivers ignore it and refuse a delivery that has only this one.
        "x-rollgate-signature": signBody(d.body, d.secret),
      },
      body: d.body,
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    }, egress);
    close = sent.close;
    const { res } = sent;
    await res.body.dump();
    return { error: res.statusCode >= 200 && res.statusCode < 300 ? null : `callback answered ${res.statusCode}` };
  } catch (err) {
    if (err instanceof EgressDenied) return { error: `callback not sent: ${err.message}`, denied: true };
    return { error: `callback unreachable: ${(err as Error).message}` };
  } finally {
    await close?.();
  }
}

/** What to send for a job: a task's stored result, or a group's results; null when there is nothing. */
async function deliveryFor(deps: CallbackDeps, data: CallbackJob): Promise<Delivery | null> {
  if ("task_id" in data) {
    const record = await deps.tasks.get(data.task_id);
    const raw = await deps.tasks.rawResult(data.task_id);
    if (!record?.task.callback || !raw || !record.result) return null;
    return { ...record.task.callback, event: `task.${record.result.status}`, body: raw };
  }
  const spec = await deps.tasks.groupCallback(data.group_id);
  if (!spec) return null;
  const body = await deps.tasks.groupBody(data.group_id, async () => {
    const ids = await deps.tasks.groupTaskIds(data.group_id);
    const raws = await Promise.all(ids.map((id) => deps.tasks.rawResult(id)));
    // Each member's result as stored (the bytes its own callback carries), plus what the group amounts to.
    const results = raws.map((raw) => (raw === null ? null : (JSON.parse(raw) as unknown)));
    const parsed = results.map((r) => TaskResult.safeParse(r).data ?? null);
    const branch = await deps.tasks.groupBranch(data.group_id);
    const group = {
      group_id: data.group_id,
      tasks: results,
      summary: summarizeGroup(ids, parsed),
      ...(branch ? { branch: { ...branch, rewards: parsed.map((r) => r?.reward ?? null) } } : {}),
    };
    return JSON.stringify(group satisfies Omit<GroupResult, "tasks"> & { tasks: unknown[] });
  });
  return { ...spec, event: "group.completed", body };
}

/** How many times a callback delivery may lose its worker (stall) before it is given up (`failed`). */
export const CALLBACK_MAX_STALLS = 10;

/** A delivery given up because its workers were lost: `failed`, with why. */
export async function markDeliveryLost(tasks: TaskStore, job: Job<CallbackJob>, why: string): Promise<void> {
  const state: CallbackState = { state: "failed", delivery_id: job.data.delivery_id, attempts: job.attemptsMade, last_error: why, delivered_at: null };
  if ("task_id" in job.data) await tasks.setCallback(job.data.task_id, state);
  else await tasks.setGroupCallbackState(job.data.group_id, state);
}

/**
 * Delivers one callback. The body is the stored bytes, so the signature a trainer checks is over
 * what it receives; the delivery id is the same on every retry, the timestamp is each attempt's. A non-2xx answer or a network
 * error throws, and BullMQ retries with exponential backoff and jitter.
 */
export async function deliverCallback(deps: CallbackDeps, job: Job<CallbackJob>): Promise<void> {
  const attempt = job.attemptsMade + 1;
  // Every line about this delivery carries the task (or group) id and the delivery id.
  const ids = "task_id" in job.data ? { task_id: job.data.task_id } : { group_id: job.data.group_id };
  const log = deps.log.child({ ...ids, delivery_id: job.data.delivery_id, callback_attempt: attempt });
  if (job.stalledCounter > CALLBACK_MAX_STALLS) {
    // Given up here, in the job: marked failed by a `failed` handler after BullMQ ended the job, a
    // worker killed in between would leave the delivery `pending` with nothing left to send it.
    await markDeliveryLost(deps.tasks, job, `the workers delivering it were lost ${job.stalledCounter} times`);
    log.warn({ stalls: job.stalledCounter }, "callback failed: its workers kept dying");
    return;
  }
  const delivery = await deliveryFor(deps, job.data);
  if (!delivery) {
    log.warn("callback with nothing to deliver: dropped");
    return;
  }
  const sent = await post(delivery, job.data.delivery_id, deps.timeoutMs ?? 30_000, deps.egress);
  const { error } = sent;
  // A denied destination would be denied again: that is the last attempt.
  const lastAttempt = sent.denied === true || attempt >= (job.opts.attempts ?? 1);
  const state: CallbackState = {
    state: error === null ? "delivered" : lastAttempt ? "failed" : "pending",
    delivery_id: job.data.delivery_id,
    attempts: attempt,
    last_error: error,
    delivered_at: error === null ? new Date().toISOString() : null,
  };
  if ("task_id" in job.data) await deps.tasks.setCallback(job.data.task_id, state);
  else await deps.tasks.setGroupCallbackState(job.data.group_id, state);
  if (error === null) log.info({ event: delivery.event }, "callback delivered");
  else log.warn({ event: delivery.event, err: error, final: lastAttempt }, lastAttempt ? "callback failed: no attempts left" : "callback failed: will retry");
  if (error !== null && !sent.denied) throw new Error(error);
}
