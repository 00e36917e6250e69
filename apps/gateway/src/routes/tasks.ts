import { randomUUID } from "node:crypto";
import { Task, type AcceptedTask } from "@rollgate/protocol";
import type { FastifyPluginAsync } from "fastify";
import { z } from "zod";
import { requireApiKey } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { errorBody, trainerErrorHandler, validationError } from "../errors.js";

const IdParams = z.object({ id: z.string().min(1).max(256) });

/** The trainer-facing task API (DESIGN §2). */
export function taskRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.setErrorHandler(trainerErrorHandler);
    app.addHook("onRequest", requireApiKey(ctx.env.ROLLGATE_API_KEY));

    app.post("/v1/tasks", async (req, reply) => {
      const parsed = Task.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send(validationError(parsed.error));
      const task: AcceptedTask = { ...parsed.data, id: parsed.data.id ?? `t-${randomUUID()}` };
      const created = await ctx.tasks.create(task, new Date());
      const status = created ? "queued" : await ctx.tasks.status(task.id);
      // A task still queued is (re-)enqueued: the job id is the task id, so BullMQ keeps one job,
      // and a crash between storing and enqueueing cannot strand a task.
      if (status === "queued") await ctx.rollouts.add("rollout", { task_id: task.id }, { jobId: task.id });
      return reply.code(202).send({ id: task.id, status });
    });

    app.get("/v1/tasks/:id", async (req, reply) => {
      const { id } = IdParams.parse(req.params);
      const record = await ctx.tasks.get(id);
      if (!record) return reply.code(404).send(errorBody("not_found", `no task ${id}`));
      return record;
    });
  };
}
