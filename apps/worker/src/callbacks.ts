import type { CallbackState } from "@rollgate/protocol";
import type { CallbackJob } from "@rollgate/queue";
import type { TaskStore } from "@rollgate/store";
import type { Job } from "bullmq";
import type { Logger } from "pino";
import { request } from "undici";
import { signBody } from "./signing.js";

export interface CallbackDeps {
  tasks: TaskStore;
  log: Logger;
  timeoutMs?: number;
}

interface Delivery {
  url: string;
  secret: string;
  event: string;
  body: string;
}

/** POSTs one delivery; the error text, or null on a 2xx. */
async function post(d: Delivery, deliveryId: string, timeoutMs: number): Promise<string | null> {
  try {
    const res = await request(d.url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "user-agent": "rollgate-callback/1",
        "x-rollgate-event": d.event,
        "x-rollgate-delivery": deliveryId,
        "x-rollgate-signature": signBody(d.body, d.secret),
      },
      body: d.body,
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
    await res.body.dump();
    return res.statusCode >= 200 && res.statusCode < 300 ? null : `callback answered ${res.statusCode}`;
  } catch (err) {
    return `callback unreachable: ${(err as Error).message}`;
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
    const results = await Promise.all(ids.map(async (id) => JSON.parse((await deps.tasks.rawResult(id)) ?? "null") as unknown));
    return JSON.stringify({ group_id: data.group_id, tasks: results });
  });
  return { ...spec, event: "group.completed", body };
}

/**
 * Delivers one callback. The body is the stored bytes, so the signature a trainer checks is over
 * what it receives; the delivery id is the same on every retry. A non-2xx answer or a network
 * error throws, and BullMQ retries with exponential backoff and jitter.
 */
export async function deliverCallback(deps: CallbackDeps, job: Job<CallbackJob>): Promise<void> {
  const delivery = await deliveryFor(deps, job.data);
  if (!delivery) {
    deps.log.warn({ job: job.data }, "callback with nothing to deliver: dropped");
    return;
  }
  const attempt = job.attemptsMade + 1;
  const lastAttempt = attempt >= (job.opts.attempts ?? 1);
  const error = await post(delivery, job.data.delivery_id, deps.timeoutMs ?? 30_000);
  const state: CallbackState = {
    state: error === null ? "delivered" : lastAttempt ? "failed" : "pending",
    delivery_id: job.data.delivery_id,
    attempts: attempt,
    last_error: error,
    delivered_at: error === null ? new Date().toISOString() : null,
  };
  if ("task_id" in job.data) await deps.tasks.setCallback(job.data.task_id, state);
  else await deps.tasks.setGroupCallbackState(job.data.group_id, state);
  if (error !== null) throw new Error(error);
}
