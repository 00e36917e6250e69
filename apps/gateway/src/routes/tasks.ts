import { randomUUID } from "node:crypto";
import { BatchRequest, Task, TaskListQuery, type AcceptedTask, type TaskResult, type TaskStatus } from "@rollgate/protocol";
import type { FastifyPluginAsync } from "fastify";
import { z } from "zod";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { errorBody, trainerErrorHandler, validationError } from "../errors.js";

const IdParams = z.object({ id: z.string().min(1).max(256) });
const TERMINAL = new Set<TaskStatus>(["completed", "failed", "timed_out", "cancelled"]);
const EVENT_POLL_MS = 250;
const HEARTBEAT_MS = 15_000;

/** A task cancelled while no worker runs it: before its first attempt, or waiting for a retry (`attempts` ran). */
function cancelledBeforeStart(task: AcceptedTask, createdAt: string, reason: string, now: Date, attempts = 0): TaskResult {
  const waited = Math.max(0, now.getTime() - Date.parse(createdAt));
  return {
    id: task.id,
    group_id: task.group_id ?? null,
    status: "cancelled",
    reward: null,
    evaluation: null,
    error: { kind: "cancelled", message: reason },
    session_id: null,
    trajectory: null,
    usage: { llm_calls: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0 },
    timings: { queued_ms: waited, run_ms: 0, eval_ms: 0, total_ms: waited },
    attempts,
    worker: "",
    agent: { exit_code: null, signal: null, log_tail: "" },
    metadata: task.metadata,
  };
}

/** The trainer-facing task API (docs/http-api.md#tasks). */
export function taskRoutes(ctx: GatewayContext): FastifyPluginAsync {
  /** Stores and enqueues one validated task; idempotent on its id. */
  async function submit(task: AcceptedTask): Promise<{ id: string; status: TaskStatus | null }> {
    const created = await ctx.tasks.create(task, new Date());
    const status = created ? "queued" : await ctx.tasks.status(task.id);
    // A task still queued is (re-)enqueued: the job id is the task id, so BullMQ keeps one job,
    // and a crash between storing and enqueueing cannot strand a task.
    if (status === "queued") await ctx.rollouts.add("rollout", { task_id: task.id }, { jobId: task.id });
    return { id: task.id, status };
  }

  return async (app) => {
    app.setErrorHandler(trainerErrorHandler);
    app.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));

    app.post("/v1/tasks", async (req, reply) => {
      const parsed = Task.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send(validationError(parsed.error));
      return reply.code(202).send(await submit({ ...parsed.data, id: parsed.data.id ?? `t-${randomUUID()}` }));
    });

    app.post("/v1/tasks/batch", { bodyLimit: 256 * 1024 * 1024 }, async (req, reply) => {
      const parsed = BatchRequest.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send(validationError(parsed.error));
      const body = parsed.data;
      let tasks: AcceptedTask[];
      if ("tasks" in body) {
        tasks = body.tasks.map((t) => ({ ...t, id: t.id ?? `t-${randomUUID()}` }));
      } else {
        // A GRPO group: n copies with ids <group_id>-<k> sharing the group's routing affinity.
        tasks = Array.from({ length: body.n }, (_, k) => ({ ...body.task, id: `${body.group_id}-${k}`, group_id: body.group_id }));
        await ctx.tasks.defineGroup(body.group_id, body.n, body.group_callback ?? null);
      }
      const ids = new Set(tasks.map((t) => t.id));
      if (ids.size !== tasks.length) return reply.code(400).send(errorBody("invalid_request", "task ids in a batch must be unique"));
      const out = [];
      for (const t of tasks) out.push(await submit(t));
      return reply.code(202).send({ tasks: out });
    });

    app.get("/v1/tasks", async (req, reply) => {
      const q = TaskListQuery.safeParse(req.query);
      if (!q.success) return reply.code(400).send(validationError(q.error));
      const page = await ctx.tasks.list({
        limit: q.data.limit,
        ...(q.data.status ? { status: q.data.status } : {}),
        ...(q.data.group_id ? { groupId: q.data.group_id } : {}),
        ...(q.data.cursor ? { cursor: q.data.cursor } : {}),
      });
      return page;
    });

    app.get("/v1/tasks/:id", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      const record = await ctx.tasks.get(id);
      if (!record) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      return record;
    });

    app.delete("/v1/tasks/:id", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      const record = await ctx.tasks.get(id);
      if (!record) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      if (record.status === "cancelled") return reply.code(200).send({ id, status: "cancelled" });
      if (TERMINAL.has(record.status)) {
        return reply.code(409).send(errorBody("conflict", `task ${id} already ended as ${record.status}`));
      }
      const reason = "cancelled by DELETE /v1/tasks/:id";
      const now = new Date();
      // The flag first: a worker that picks the job up from now on cancels it at once, and
      // workers running it are told through pub/sub.
      await ctx.tasks.requestCancel(id, reason, now);
      const job = await ctx.rollouts.getJob(id);
      const state = job ? await job.getState() : "unknown";
      if (job && (state === "waiting" || state === "delayed" || state === "prioritized")) {
        try {
          await job.remove();
        } catch {
          // It became active just now: the worker sees the flag.
        }
      }
      if (state !== "active") {
        const task = record.task as AcceptedTask;
        const callback = task.callback ? { state: "pending" as const, delivery_id: randomUUID(), attempts: 0, last_error: null, delivered_at: null } : null;
        const finished = await ctx.tasks.finish(id, cancelledBeforeStart(task, record.created_at, reason, now, record.attempts), now, 7 * 24 * 3600, callback);
        if (finished) {
          // Its callback and its group's are sent by a worker: the job goes back at the head of the
          // queue, and a worker that finds the task ended queues what follows (and nothing else).
          if (task.callback || task.group_id) await ctx.rollouts.add("rollout", { task_id: id }, { jobId: id, lifo: true });
          return reply.code(200).send({ id, status: "cancelled" });
        }
      }
      return reply.code(202).send({ id, status: "cancelling" });
    });

    app.get("/v1/tasks/:id/logs", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      const record = await ctx.tasks.get(id);
      if (!record) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      const logs = (await ctx.tasks.logs(id)) ?? record.result?.agent.log_tail ?? "";
      return reply.type("text/plain; charset=utf-8").send(logs);
    });

    app.get("/v1/tasks/:id/events", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      if (!(await ctx.tasks.status(id))) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      const header = req.headers["last-event-id"];
      const query = (req.query as { after?: unknown }).after;
      // An event id is a Redis stream id: anything else would fail the stream read after the 200.
      const [from, given] = typeof header === "string" && header ? ["Last-Event-ID", header] : ["after", query];
      if (given !== undefined && given !== "" && (typeof given !== "string" || !/^\d{1,16}-\d{1,16}$/.test(given))) {
        return reply.code(400).send(errorBody("invalid_request", `${from}: must be the id of an event of this stream ("<ms>-<n>")`));
      }
      let after = (given as string | undefined) || null;
      reply.hijack();
      const raw = reply.raw;
      raw.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
      let open = true;
      raw.on("close", () => (open = false));
      let lastWrite = Date.now();
      while (open) {
        const events = await ctx.tasks.events(id, after);
        for (const e of events) {
          raw.write(`id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`);
          after = e.id;
          lastWrite = Date.now();
          if (e.type === "terminal") open = false;
        }
        if (!open) break;
        if (Date.now() - lastWrite > HEARTBEAT_MS) {
          raw.write(": keep-alive\n\n");
          lastWrite = Date.now();
        }
        await new Promise((r) => setTimeout(r, EVENT_POLL_MS));
      }
      raw.end();
    });
  };
}
