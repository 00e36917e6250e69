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

/**
 * Delivers one task result to its callback URL. The body is the stored result's exact bytes, so
 * the signature a trainer checks is over what it receives; the delivery id is the same on every
 * retry. A non-2xx answer or a network error throws, and BullMQ retries with backoff.
 */
export async function deliverCallback(deps: CallbackDeps, job: Job<CallbackJob>): Promise<void> {
  const { task_id, delivery_id } = job.data;
  const record = await deps.tasks.get(task_id);
  const raw = await deps.tasks.rawResult(task_id);
  const spec = record?.task.callback;
  if (!record || !raw || !spec || !record.result) {
    deps.log.warn({ task: task_id }, "callback for a task without a stored result: dropped");
    return;
  }
  if (record.callback.state === "delivered" && record.callback.delivery_id === delivery_id) return;
  const attempt = job.attemptsMade + 1;
  const lastAttempt = attempt >= (job.opts.attempts ?? 1);
  let error: string | null = null;
  try {
    const res = await request(spec.url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "user-agent": "rollgate-callback/1",
        "x-rollgate-event": `task.${record.result.status}`,
        "x-rollgate-delivery": delivery_id,
        "x-rollgate-signature": signBody(raw, spec.secret),
      },
      body: raw,
      headersTimeout: deps.timeoutMs ?? 30_000,
      bodyTimeout: deps.timeoutMs ?? 30_000,
    });
    await res.body.dump();
    if (res.statusCode < 200 || res.statusCode >= 300) error = `callback answered ${res.statusCode}`;
  } catch (err) {
    error = `callback unreachable: ${(err as Error).message}`;
  }
  await deps.tasks.setCallback(task_id, {
    state: error === null ? "delivered" : lastAttempt ? "failed" : "pending",
    delivery_id,
    attempts: attempt,
    last_error: error,
    delivered_at: error === null ? new Date().toISOString() : null,
  });
  if (error !== null) throw new Error(error);
}
