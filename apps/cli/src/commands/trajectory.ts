import { RollgateError, TRAINER_FORMATS, type DecodedTrajectory, type TaskRecord, type Trajectory } from "@rollgate/client";
import { TrajectoryBuilderName } from "@rollgate/protocol";
import { UsageError, numberOption, type CommandSpec } from "../framework.js";
import { EXIT, fmt, statusColor, type Context } from "../output.js";
import { renderIds, renderSegments } from "../decode.js";
import { memberOrder } from "../summary.js";

/** Errors that concern one member of a group (its session, its records), not the gateway or the request. */
const MEMBER_ERRORS = new Set([404, 409, 422, 502]);

type Target =
  /** `unscored`: why this session's trajectory is not a scored, whole rollout (said on stderr), if it is not. */
  | { kind: "session"; sessionId: string; builder: TrajectoryBuilderName | undefined; unscored: string | null }
  | { kind: "group"; groupId: string; tasks: TaskRecord[] };

/** A task id (its session), a session id, or a GRPO group id (every task of the group). */
async function resolveTarget(ctx: Context, id: string): Promise<Target> {
  try {
    const task = await ctx.client.getTask(id);
    const sessionId = task.session_id ?? task.result?.session_id;
    if (!sessionId) throw new RollgateError(`task ${id} has no session yet (it is ${task.status})`, 409, "no_session");
    const r = task.result;
    const unscored = r && r.status !== "completed" ? `task ${id} ended ${r.status}${r.error ? ` (${r.error.kind}: ${r.error.message})` : ""}: this rollout has no reward, its samples are not a scored rollout's` : null;
    return { kind: "session", sessionId, builder: task.task.trajectory.builder, unscored };
  } catch (err) {
    if (!(err instanceof RollgateError && err.status === 404)) throw err;
  }
  try {
    const session = await ctx.client.getSession(id);
    const lost = session.lost_calls.count;
    const unscored = lost > 0 ? `session ${id} lost ${lost} LLM call(s)${session.lost_calls.first ? ` (${session.lost_calls.first.kind}: ${session.lost_calls.first.message})` : ""}: its trajectory is not a whole rollout` : null;
    return { kind: "session", sessionId: id, builder: undefined, unscored };
  } catch (err) {
    if (!(err instanceof RollgateError && err.status === 404)) throw err;
  }
  const tasks: TaskRecord[] = [];
  for await (const t of ctx.client.listTasks({ group_id: id, limit: 1000 })) tasks.push(t);
  if (tasks.length === 0) throw new RollgateError(`no task, session or group ${id}`, 404, "not_found");
  return { kind: "group", groupId: id, tasks: memberOrder(id, tasks) };
}

export const trajectoryCommand: CommandSpec<Context> = {
  name: "trajectory",
  summary: "print a task's (or session's, or a whole group's) trajectory: traces, masks, a trainer format, or decoded text",
  description: `Prints the trajectory of a task's session (or of a session given by id) as rollgate builds it
for training. Default: each trace's sizes and its response token ids, masked (loss_mask 0) ids
dim on a terminal or [in brackets] otherwise. --decode shows the text, decoded by the engine that
generated it (through the gateway), the trainable tokens (what the policy sampled) in green and the
masked ones (tool results, template glue) dim, or [[in double brackets]] when not on a terminal.
--format prints the samples a trainer consumes, as JSON. Given a GRPO group id, does this for every
task of the group (with --json or --format: {group_id, tasks: [{task_id, status, reward, error,
session_id, trajectory | samples}]}, error being the task's: a member that is not completed was not
scored); a member whose trajectory cannot be read (its session dropped, its trajectory invalid) has
null there and why as trajectory_error, the others are still printed, and the command exits 4
naming it.`,
  args: [{ name: "id", required: true, description: "a task id (its session is used), a session id, or a group id" }],
  options: [
    { name: "format", short: "f", type: "string", value: "<name>", choices: TRAINER_FORMATS, description: "print the trainer format as JSON" },
    { name: "decode", short: "d", type: "boolean", description: "decode the tokens to text (by the engine's own tokenizer, through the gateway)" },
    { name: "builder", short: "b", type: "string", value: "<name>", choices: TrajectoryBuilderName.options, description: "trajectory builder (default: the task's)" },
    { name: "prompt", type: "boolean", default: true, description: "with --decode, show each trace's prompt (--no-prompt hides it)" },
    { name: "max-ids", type: "string", value: "<n>", default: "400", description: "token ids shown per trace without --decode" },
  ],
  examples: [
    "rollgate trajectory t-123 --decode",
    "rollgate trajectory t-123 --format verl > sample.json",
    "rollgate trajectory s-abc --builder per_request --json",
    "rollgate trajectory g-7 --format verl > group.json",
  ],
  async run(ctx, [id], values) {
    const format = values.format as (typeof TRAINER_FORMATS)[number] | undefined;
    if (format && values.decode) throw new UsageError("--decode shows the trace as text and --format prints trainer JSON: use one of them", "trajectory");
    const maxIds = numberOption(values, "max-ids", "trajectory", { integer: true, min: 1 }) ?? 400;
    const target = await resolveTarget(ctx, id!);
    const decode = values.decode === true;
    const show = { format, decode, prompt: values.prompt !== false, maxIds, builder: values.builder as TrajectoryBuilderName | undefined };
    if (target.kind === "session") {
      const out = await showSession(ctx, target.sessionId, show.builder ?? target.builder ?? "prefix_merging", show);
      if (out !== undefined) ctx.printJson(out);
      // A failed task's or a lossy session's samples look like any others: say so where a person sees it.
      if (target.unscored) ctx.err(`${ctx.errStyle.yellow("rollgate: warning:")} ${target.unscored}`);
      return EXIT.ok;
    }
    // A group: every task's trajectory, like `watch <group id>` follows every task.
    const s = ctx.style;
    if (!ctx.json && !format) ctx.out(`group ${s.bold(target.groupId)}: ${target.tasks.length} task(s)`);
    const all: unknown[] = [];
    const unread: string[] = [];
    for (const t of target.tasks) {
      const sessionId = t.session_id ?? t.result?.session_id ?? null;
      // The task's error beside its samples: a failed member's (a lost call, an invalid trajectory) are not a scored rollout's.
      const head = { task_id: t.id, status: t.status, reward: t.result?.reward ?? null, error: t.result?.error ?? null, session_id: sessionId };
      if (!ctx.json && !format) {
        ctx.out("");
        ctx.out(s.bold(`══ task ${t.id} · ${statusColor(s, t.status)} · reward ${fmt.reward(head.reward)}${t.result?.error ? ` · ${t.result.error.kind}` : ""} ══`));
      }
      if (!sessionId) {
        if (ctx.json || format) all.push({ ...head, trajectory: null });
        else ctx.out(s.gray(`  no session yet (${t.status})`));
        continue;
      }
      let out: unknown;
      try {
        out = await showSession(ctx, sessionId, show.builder ?? t.task.trajectory.builder, show);
      } catch (err) {
        // One member's trajectory that cannot be read (its session dropped, its trajectory invalid)
        // is named; the rest of the group is still exported.
        if (!(err instanceof RollgateError) || !MEMBER_ERRORS.has(err.status)) throw err;
        unread.push(`task ${t.id}: ${err.status} ${err.type}: ${err.message}`);
        const trajectoryError = { status: err.status, type: err.type, message: err.message };
        if (ctx.json || format) all.push({ ...head, ...(format ? { samples: null } : { trajectory: null }), trajectory_error: trajectoryError });
        else ctx.out(s.red(`  cannot read its trajectory: ${err.status} ${err.type}: ${err.message}`));
        continue;
      }
      if (out !== undefined) all.push({ ...head, ...(format ? { samples: out } : { trajectory: out }) });
    }
    if (ctx.json || format) ctx.printJson({ group_id: target.groupId, tasks: all });
    if (unread.length === 0) return EXIT.ok;
    for (const line of unread) ctx.err(`${ctx.errStyle.red("rollgate:")} ${line}`);
    return EXIT.api;
  },
};

interface ShowOptions {
  format: (typeof TRAINER_FORMATS)[number] | undefined;
  /** Show text, decoded by the engine that generated it (the gateway's decoded-trajectory route). */
  decode: boolean;
  prompt: boolean;
  maxIds: number;
}

/** Prints one session's trajectory, or returns what --json / --format print for it. */
async function showSession(ctx: Context, sessionId: string, builder: TrajectoryBuilderName, o: ShowOptions): Promise<unknown> {
  if (o.format === "rollgate") return ctx.client.getTrajectory(sessionId, { builder });
  // A trainer's samples alone (a task that was not scored is warned about on stderr).
  if (o.format) return (await ctx.client.getTrajectory(sessionId, { builder, format: o.format })).samples;
  const [trajectory, decoded]: [Trajectory, DecodedTrajectory | null] = await Promise.all([
    ctx.client.getTrajectory(sessionId, { builder }),
    o.decode ? ctx.client.getDecodedTrajectory(sessionId, { builder }) : null,
  ]);
  const s = ctx.style;
  if (ctx.json) {
    if (!decoded) return trajectory;
    return {
      session_id: sessionId,
      builder,
      engine: decoded.engine,
      stats: trajectory.stats,
      traces: decoded.traces.map((t) => ({ index: t.index, finish_reason: t.finish_reason, prompt_text: t.prompt_text, segments: t.segments })),
    };
  }
  const st = trajectory.stats;
  ctx.out(
    `${s.bold(`session ${sessionId}`)} · ${builder} · ${st.traces} trace(s) from ${st.records} record(s) · ${st.trainable_tokens}/${st.response_tokens} response tokens trainable · weights ${st.weight_versions.map((v) => v ?? "–").join(", ") || "–"}`,
  );
  for (const b of st.breaks) ctx.out(s.yellow(`  break: record ${b.record_id} started a new trace (${b.reason}): ${b.detail}`));
  ctx.out(
    s.enabled
      ? `${s.gray("legend:")} ${s.green("trainable")} (loss_mask 1) · ${s.dim("masked")} (loss_mask 0)`
      : decoded
        ? "legend: trainable text (loss_mask 1) as is; masked text (loss_mask 0) [[in double brackets]]"
        : "legend: trainable ids (loss_mask 1) as is; masked ids (loss_mask 0) [in brackets]",
  );
  trajectory.traces.forEach((t, i) => {
    const trainable = t.loss_mask.reduce<number>((a, m) => a + m, 0);
    ctx.out("");
    ctx.out(s.bold(`── trace ${i} · prompt ${t.prompt_ids.length} tokens · response ${t.response_ids.length} tokens (${trainable} trainable) · finish ${t.finish_reason} ──`));
    const text = decoded?.traces[i];
    if (text) {
      if (o.prompt) {
        ctx.out(s.gray("prompt:"));
        ctx.out(s.enabled ? s.dim(text.prompt_text) : `[[${text.prompt_text}]]`);
        ctx.out(s.gray("response:"));
      }
      ctx.out(renderSegments(text.segments, s));
    } else {
      ctx.out(renderIds(t, s, o.maxIds));
    }
  });
  return undefined;
}
