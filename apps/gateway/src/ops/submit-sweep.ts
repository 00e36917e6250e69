import { randomUUID } from "node:crypto";
import type { RolloutJob } from "@rollgate/queue";
import type { TaskStore } from "@rollgate/store";
import type { Queue } from "bullmq";
import type { Logger } from "pino";

/** Submissions looked at per round: a round is a few reads each, and the next round takes the rest. */
const PER_ROUND = 200;

/**
 * Finishes submissions a replica began and never saw through. Storing a task and queueing its job
 * are writes to different Redis slots (BullMQ's keys are its own), so a replica killed between
 * them leaves the task `queued` with no job: no worker would ever run it, and the trainer would
 * wait for good. Each submission is noted before the task is stored and cleared once its job is
 * queued; every replica runs this sweep (one at a time), which queues the job of each task whose
 * note is older than the grace period and is still queued with no live job. Adding a job is
 * idempotent (its id is the task id), so a sweep racing a slow submission adds nothing twice.
 */
export class SubmitSweep {
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private readonly owner = randomUUID();

  constructor(
    private readonly tasks: TaskStore,
    private readonly rollouts: Queue<RolloutJob>,
    private readonly log: Logger,
    private readonly opts: { intervalMs: number; graceMs: number },
  ) {}

  start(): void {
    if (this.opts.intervalMs <= 0) return;
    this.timer = setInterval(() => {
      this.running ??= this.round()
        .then(() => undefined)
        // Redis away or a command refused: logged; the next round tries again.
        .catch((err: Error) => this.log.warn({ err: err.message }, "submit sweep failed; the next round retries"))
        .finally(() => (this.running = null));
    }, this.opts.intervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.running;
  }

  /** One round: returns the ids of the tasks whose job it queued. */
  async round(now = new Date()): Promise<string[]> {
    if (!(await this.tasks.claimSubmitSweep(this.owner, Math.max(10_000, 2 * this.opts.intervalMs)))) return [];
    const queued: string[] = [];
    try {
      const ids = await this.tasks.unfinishedSubmits(new Date(now.getTime() - this.opts.graceMs), PER_ROUND);
      for (const id of ids) {
        if (await this.finish(id)) queued.push(id);
        await this.tasks.submitted([id]);
      }
    } finally {
      await this.tasks.sweepDone(this.owner);
    }
    if (queued.length > 0) this.log.warn({ tasks: queued }, "queued the jobs of submitted tasks that had none (a replica stopped between storing and queueing them)");
    return queued;
  }

  /** Queues the job of a task left queued without one; true when it had to. */
  private async finish(id: string): Promise<boolean> {
    if (!(await this.tasks.reindexQueued(id))) return false;
    const job = await this.rollouts.getJob(id);
    const state = job ? await job.getState() : null;
    // A waiting, delayed or running job will run (or is running) the task.
    if (state !== null && state !== "completed" && state !== "failed" && state !== "unknown") return false;
    // An ended job of the same id (an earlier task's whose record expired) would make the add a no-op.
    // Read again: a task that ended meanwhile had a job that ran it.
    if ((await this.tasks.status(id)) !== "queued") return false;
    if (job && state !== "unknown") await job.remove();
    await this.rollouts.add("rollout", { task_id: id }, { jobId: id });
    return true;
  }
}
