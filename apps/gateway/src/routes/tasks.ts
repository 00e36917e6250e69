import { randomUUID } from "node:crypto";
import { BatchRequest, BranchAccepted, BranchRequest, Task, TaskAccepted, TaskEvent, TaskListQuery, TaskRecord, isTerminalStatus, type AcceptedTask, type TaskResult, type TaskStatus } from "@rollgate/protocol";
import type { FastifyPluginAsync } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import { z } from "zod";
import type { GatewayContext } from "../context.js";
import { errorBody } from "../errors.js";
import { closeSessionSettled } from "../llm/close-session.js";
import { replayGap } from "../llm/replay.js";
import { IdParams, TRAINER_SECURITY, errorResponses, named, textResponse } from "./schemas.js";

const TaskPage = named("TaskPage", z.object({ tasks: z.array(TaskRecord), next_cursor: z.string().nullable() }));
/** What a submission answers: null when the task was deleted before its state could be read back. */
const Accepted = named("Accepted", TaskAccepted.extend({ status: TaskAccepted.shape.status.nullable() }));
const BatchAccepted = named("BatchAccepted", z.object({ tasks: z.array(Accepted) }));
const CancelAnswer = named("CancelAnswer", z.object({ id: z.string(), status: z.enum(["cancelled", "cancelling"]) }));
const EventsQuery = z.object({ after: z.string().optional().describe("event id to resume after (or the Last-Event-ID header)") });
const tags = ["tasks"];
const security = TRAINER_SECURITY;
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

/** How many tasks of a batch are stored and queued together. */
const SUBMIT_CHUNK = 100;

/** The trainer-facing task API (docs/http-api.md#tasks). */
export function taskRoutes(ctx: GatewayContext): FastifyPluginAsync {
  /**
   * Before new tasks' jobs are added: the queue may still hold an ended job (completed or failed:
   * BullMQ keeps them for the board) of an earlier task with the same id whose record has expired
   * (ROLLGATE_RESULT_TTL_S). Adding a job whose id exists does nothing, so the new task would stay
   * queued for good; that old job is removed first. One read per new task, sent together.
   */
  async function dropEndedJobs(ids: string[]): Promise<void> {
    const jobs = await Promise.all(ids.map((id) => ctx.rollouts.getJob(id)));
    await Promise.all(
      jobs.map(async (job) => {
        if (!job) return;
        const state = await job.getState();
        if (state === "completed" || state === "failed") await job.remove();
      }),
    );
  }

  /** Stores and enqueues one validated task; idempotent on its id. */
  async function submit(task: AcceptedTask): Promise<{ id: string; status: TaskStatus | null }> {
    // Noted first: should this replica stop before the job is queued, the submit sweep queues it.
    await ctx.tasks.submitting([task.id], new Date());
    const created = await ctx.tasks.create(task, new Date());
    if (created) await dropEndedJobs([task.id]);
    const status = created ? "queued" : await ctx.tasks.status(task.id);
    // A task still queued is (re-)enqueued: the job id is the task id, so BullMQ keeps one job.
    if (status === "queued") await ctx.rollouts.add("rollout", { task_id: task.id }, { jobId: task.id });
    await ctx.tasks.submitted([task.id]);
    return { id: task.id, status };
  }

  /**
   * `submit` for many tasks, SUBMIT_CHUNK at a time: their stores run concurrently (the store's
   * connection sends them in a few writes) and their jobs are queued in one bulk add, in order.
   */
  async function submitAll(tasks: AcceptedTask[]): Promise<{ id: string; status: TaskStatus | null }[]> {
    const out: { id: string; status: TaskStatus | null }[] = [];
    for (let i = 0; i < tasks.length; i += SUBMIT_CHUNK) {
      const chunk = tasks.slice(i, i + SUBMIT_CHUNK);
      await ctx.tasks.submitting(chunk.map((t) => t.id), new Date());
      const created = await Promise.all(chunk.map((task) => ctx.tasks.create(task, new Date())));
      await dropEndedJobs(chunk.filter((_, k) => created[k]).map((t) => t.id));
      const statuses = await Promise.all(chunk.map((task, k) => (created[k] ? ("queued" as const) : ctx.tasks.status(task.id))));
      const queued = chunk.filter((_, k) => statuses[k] === "queued");
      if (queued.length > 0) await ctx.rollouts.addBulk(queued.map((task) => ({ name: "rollout", data: { task_id: task.id }, opts: { jobId: task.id } })));
      await ctx.tasks.submitted(chunk.map((t) => t.id));
      chunk.forEach((task, k) => out.push({ id: task.id, status: statuses[k]! }));
    }
    return out;
  }

  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();

    const submitSchema = {
      tags,
      security,
      summary: "Submit a task",
      description: "Validates and enqueues one task. Re-submitting the same `id` is idempotent.",
      body: Task,
      response: { 202: Accepted, ...errorResponses(400, 401) },
    };
    app.post("/v1/tasks", { schema: submitSchema }, async (req, reply) => {
      return reply.code(202).send(await submit({ ...req.body, id: req.body.id ?? `t-${randomUUID()}` }));
    });

    const batchSchema = {
      tags,
      security,
      summary: "Submit tasks or a GRPO group",
      description: "`{tasks: [...]}`, or `{group_id, n, task}` expanding into `n` tasks `<group_id>-<k>` sharing one routing affinity.",
      body: BatchRequest,
      response: { 202: BatchAccepted, ...errorResponses(400, 401) },
    };
    app.post("/v1/tasks/batch", { bodyLimit: 256 * 1024 * 1024, schema: batchSchema }, async (req, reply) => {
      const body = req.body;
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
      return reply.code(202).send({ tasks: await submitAll(tasks) });
    });

    const branchSchema = {
      tags,
      security,
      summary: "Branch a finished rollout",
      description:
        "Creates a group of `n` tasks with the source task's agent, runtime, instruction and evaluator (members `<group_id>-<k>`). Each replays the source's first `at_call` LLM calls from its records (its agent must ask what the source asked: otherwise it ends `failed` with `error.kind: replay_diverged`), then samples. Replayed answers are loss_mask 0 unless `train_replayed`. `callback` is the group callback: every member's result, their rewards and the shared prefix, once.",
      params: IdParams,
      body: BranchRequest,
      response: { 202: named("BranchAccepted", BranchAccepted), ...errorResponses(400, 401, 404, 409) },
    };
    app.post("/v1/tasks/:id/branches", { schema: branchSchema }, async (req, reply) => {
      const body = req.body;
      const source = await ctx.tasks.get(req.params.id);
      if (!source) return reply.code(404).send(errorBody("not_found", `no task ${req.params.id}`));
      if (!isTerminalStatus(source.status) || !source.session_id) {
        return reply.code(409).send(errorBody("conflict", `task ${source.id} is ${source.status}: a rollout can be branched once it has ended`));
      }
      // A deleted session took its records with it: no rollout is left to replay.
      const heads = (await ctx.sessions.get(source.session_id)) ? await ctx.sessions.recordHeads(source.session_id) : null;
      const made = await ctx.sessions.numberedCalls(source.session_id);
      const why = heads ? replayGap(heads, body.at_call, made) : `its session ${source.session_id} was deleted, and its records with it`;
      if (why) return reply.code(409).send(errorBody("conflict", `task ${source.id} cannot be replayed to call ${body.at_call}: ${why}`));
      // The last replayed answer (a call before the point may have failed: the last one recorded).
      const lastSeq = Math.max(...heads!.filter((r) => r.seq < body.at_call).map((r) => r.seq));
      const last = (await ctx.sessions.record(source.session_id, lastSeq))!;
      const groupId = body.group_id ?? `b-${randomUUID()}`;
      // A group id names one branch request. Sent again (a retry) it is that group: kept as it was
      // defined, its members submitted again (idempotent: only one a failed first send missed is
      // made). Another group's id would have its callback tell this branch point with the rewards
      // of other runs.
      const existing = body.group_id ? await ctx.tasks.groupDefinition(groupId) : null;
      if (existing && !(existing.branch?.task_id === source.id && existing.branch.at_call === body.at_call && existing.size === body.n)) {
        const what = existing.branch ? `branches of task ${existing.branch.task_id} at call ${existing.branch.at_call}, n = ${existing.size}` : `a group of ${existing.size} tasks`;
        return reply.code(409).send(errorBody("conflict", `group ${groupId} exists (${what}): give this branch request another group_id`));
      }
      const branch = { task_id: source.id, session_id: source.session_id, at_call: body.at_call, train_replayed: body.train_replayed };
      const tasks: AcceptedTask[] = Array.from({ length: body.n }, (_, k) => ({
        ...source.task,
        id: `${groupId}-${k}`,
        group_id: groupId,
        sampling: body.sampling ?? source.task.sampling,
        // The group callback tells the branches' results; members send none of their own.
        callback: null,
        branch,
      }));
      if (!existing) {
        await ctx.tasks.defineGroup(groupId, body.n, body.callback ?? null, {
          task_id: source.id,
          at_call: body.at_call,
          shared_prefix_ids: last.prompt_ids.concat(last.output_ids),
        });
      }
      for (const t of tasks) await submit(t);
      // Accepted on purpose (a whole-rollout replay is the cheapest replay-and-mask check), but said.
      // (A rollout whose last call failed leaves that call to sample.)
      return reply.code(202).send({ group_id: groupId, task_ids: tasks.map((t) => t.id), whole_rollout: body.at_call >= made && lastSeq === made - 1 });
    });

    const listSchema = {
      tags,
      security,
      summary: "List tasks",
      description: "Newest first; `cursor` is the `next_cursor` of the previous page.",
      querystring: TaskListQuery,
      response: { 200: TaskPage, ...errorResponses(400, 401) },
    };
    app.get("/v1/tasks", { schema: listSchema }, async (req) => {
      const q = req.query;
      return ctx.tasks.list({
        limit: q.limit,
        ...(q.status ? { status: q.status } : {}),
        ...(q.group_id ? { groupId: q.group_id } : {}),
        ...(q.cursor ? { cursor: q.cursor } : {}),
      });
    });

    const getSchema = {
      tags,
      security,
      summary: "A task",
      description: "Status, timings, attempts, callback delivery state, and the result when terminal.",
      params: IdParams,
      response: { 200: TaskRecord, ...errorResponses(400, 401, 404) },
    };
    app.get("/v1/tasks/:id", { schema: getSchema }, async (req, reply) => {
      const { id } = req.params;
      const record = await ctx.tasks.get(id);
      if (!record) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      return record;
    });

    const cancelSchema = {
      tags,
      security,
      summary: "Cancel a task",
      description: "A queued task never starts (200 `cancelled`; a session its last attempt left open, its worker gone, is closed); a running one has its sandbox killed (202 `cancelling`).",
      params: IdParams,
      response: { 200: CancelAnswer, 202: CancelAnswer, ...errorResponses(400, 401, 404, 409) },
    };
    app.delete("/v1/tasks/:id", { schema: cancelSchema }, async (req, reply) => {
      const { id } = req.params;
      const record = await ctx.tasks.get(id);
      if (!record) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      if (record.status === "cancelled") return reply.code(200).send({ id, status: "cancelled" });
      if (isTerminalStatus(record.status)) {
        return reply.code(409).send(errorBody("conflict", `task ${id} already ended as ${record.status}`));
      }
      const reason = "cancelled by DELETE /v1/tasks/:id";
      const now = new Date();
      // The flag first: a worker that picks the job up from now on cancels it at once, and
      // workers running it are told through pub/sub.
      await ctx.tasks.requestCancel(id, reason, now);
      const job = await ctx.rollouts.getJob(id);
      const state = job ? await job.getState() : "unknown";
      // Every step below leaves the task with a job that ends it should this replica die after
      // it: the task's own job is removed only once the task has ended and a job for what follows
      // its end is queued (a worker taking the task's job meanwhile finds the cancel flag).
      if (state !== "active") {
        const task = record.task as AcceptedTask;
        const callback = task.callback ? { state: "pending" as const, delivery_id: randomUUID(), attempts: 0, last_error: null, delivered_at: null } : null;
        const finished = await ctx.tasks.finish(id, cancelledBeforeStart(task, record.created_at, reason, now, record.attempts), now, ctx.env.ROLLGATE_RESULT_TTL_S, callback);
        if (finished) {
          // The last attempt's session may still be open: a worker that died or stalled past its
          // job lock, or an attempt that failed before closing it, left it so, and no worker will
          // run this task again to close it. Closed here so its agent can write no more into it.
          const orphan = record.session_id;
          if (orphan) {
            await closeSessionSettled(ctx, orphan, now).catch((err: unknown) =>
              req.log.warn({ err, task_id: id, session_id: orphan }, "cancel: closing the last attempt's session failed"),
            );
          }
          // Its callback and its group's are sent by a worker: a job at the head of the queue (its
          // id its own: the task's job may still be waiting), and a worker that finds the task
          // ended queues what follows (and nothing else).
          if (task.callback || task.group_id) await ctx.rollouts.add("rollout", { task_id: id }, { jobId: `${id}@cancelled-${randomUUID()}`, lifo: true });
          if (job && (state === "waiting" || state === "delayed" || state === "prioritized")) {
            // Not run at all now (a worker would only find the task ended).
            await job.remove().catch(() => undefined); // it became active just now: that worker finds the task ended
          }
          return reply.code(200).send({ id, status: "cancelled" });
        }
      }
      return reply.code(202).send({ id, status: "cancelling" });
    });

    const logsSchema = {
      tags,
      security,
      summary: "The agent's output so far",
      params: IdParams,
      response: { 200: textResponse("text/plain", "the log tail"), ...errorResponses(400, 401, 404) },
    };
    app.get("/v1/tasks/:id/logs", { schema: logsSchema }, async (req, reply) => {
      const { id } = req.params;
      const record = await ctx.tasks.get(id);
      if (!record) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      const logs = (await ctx.tasks.logs(id)) ?? record.result?.agent.log_tail ?? "";
      return reply.type("text/plain; charset=utf-8").send(logs);
    });

    const eventsSchema = {
      tags,
      security,
      summary: "A task's lifecycle as Server-Sent Events",
      description: "One `TaskEvent` per SSE message (`event:` is its type); ends after `terminal`. Resumes after `Last-Event-ID` or `?after=`.",
      params: IdParams,
      querystring: EventsQuery,
      response: { 200: { description: "an SSE stream of TaskEvent", content: { "text/event-stream": { schema: TaskEvent } } }, ...errorResponses(400, 401, 404) },
    };
    app.get("/v1/tasks/:id/events", { schema: eventsSchema }, async (req, reply) => {
      const { id } = req.params;
      if (!(await ctx.tasks.status(id))) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      const header = req.headers["last-event-id"];
      const query = req.query.after;
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
