import { RollgateError, TRAINER_FORMATS, type DecodedTrajectory, type Trajectory } from "@rollgate/client";
import type { TrajectoryBuilderName } from "@rollgate/protocol";
import { UsageError, numberOption, type CommandSpec } from "../framework.js";
import { EXIT, type Context } from "../output.js";
import { renderIds, renderSegments } from "../decode.js";

/** A task id (its session) or a session id → the session id and the builder to use by default. */
async function resolveSession(ctx: Context, id: string): Promise<{ sessionId: string; builder: TrajectoryBuilderName | undefined }> {
  try {
    const task = await ctx.client.getTask(id);
    const sessionId = task.session_id ?? task.result?.session_id;
    if (!sessionId) throw new RollgateError(`task ${id} has no session yet (it is ${task.status})`, 409, "no_session");
    return { sessionId, builder: task.task.trajectory.builder };
  } catch (err) {
    if (!(err instanceof RollgateError && err.status === 404)) throw err;
  }
  try {
    await ctx.client.getSession(id);
  } catch (err) {
    if (err instanceof RollgateError && err.status === 404) throw new RollgateError(`no task or session ${id}`, 404, "not_found");
    throw err;
  }
  return { sessionId: id, builder: undefined };
}

export const trajectoryCommand: CommandSpec<Context> = {
  name: "trajectory",
  summary: "print a task's (or session's) trajectory: traces, masks, a trainer format, or decoded text",
  description: `Prints the trajectory of a task's session (or of a session given by id) as rollgate builds it
for training. Default: each trace's sizes and its response token ids, masked (loss_mask 0) ids
dim on a terminal or [in brackets] otherwise. --decode shows the text, decoded by the engine that
generated it (through the gateway), the trainable tokens (what the policy sampled) in green and the
masked ones (tool results, template glue) dim, or [[in double brackets]] when not on a terminal. --format prints
the samples a trainer consumes, as JSON.`,
  args: [{ name: "id", required: true, description: "a task id (its session is used) or a session id" }],
  options: [
    { name: "format", short: "f", type: "string", value: "<name>", choices: TRAINER_FORMATS, description: "print the trainer format as JSON" },
    { name: "decode", short: "d", type: "boolean", description: "decode the tokens to text (by the engine's own tokenizer, through the gateway)" },
    { name: "builder", short: "b", type: "string", value: "<name>", choices: ["prefix_merging", "per_request"], description: "trajectory builder (default: the task's)" },
    { name: "prompt", type: "boolean", default: true, description: "with --decode, show each trace's prompt (--no-prompt hides it)" },
    { name: "max-ids", type: "string", value: "<n>", default: "400", description: "token ids shown per trace without --decode" },
  ],
  examples: ["rollgate trajectory t-123 --decode", "rollgate trajectory t-123 --format verl > sample.json", "rollgate trajectory s-abc --builder per_request --json"],
  async run(ctx, [id], values) {
    const format = values.format as (typeof TRAINER_FORMATS)[number] | undefined;
    if (format && values.decode) throw new UsageError("--decode shows the trace as text and --format prints trainer JSON: use one of them", "trajectory");
    const maxIds = numberOption(values, "max-ids", "trajectory", { integer: true, min: 1 }) ?? 400;
    const { sessionId, builder: taskBuilder } = await resolveSession(ctx, id!);
    const builder = (values.builder as TrajectoryBuilderName | undefined) ?? taskBuilder ?? "prefix_merging";
    if (format) {
      ctx.printJson(await ctx.client.getTrajectory(sessionId, { builder, format }));
      return EXIT.ok;
    }
    const [trajectory, decoded]: [Trajectory, DecodedTrajectory | null] = await Promise.all([
      ctx.client.getTrajectory(sessionId, { builder }),
      values.decode ? ctx.client.getDecodedTrajectory(sessionId, { builder }) : null,
    ]);
    const s = ctx.style;
    if (ctx.json) {
      if (!decoded) ctx.printJson(trajectory);
      else
        ctx.printJson({
          session_id: sessionId,
          builder,
          engine: decoded.engine,
          stats: trajectory.stats,
          traces: decoded.traces.map((t) => ({ index: t.index, finish_reason: t.finish_reason, prompt_text: t.prompt_text, segments: t.segments })),
        });
      return EXIT.ok;
    }
    const st = trajectory.stats;
    ctx.out(
      `${s.bold(`session ${sessionId}`)} · ${builder} · ${st.traces} trace(s) from ${st.records} record(s) · ${st.trainable_tokens}/${st.response_tokens} response tokens trainable · weights ${st.weight_versions.map((v) => v ?? "–").join(", ") || "–"}`,
    );
    for (const b of st.breaks) ctx.out(s.yellow(`  break: record ${b.record_id} started a new trace (${b.reason}): ${b.detail}`));
    ctx.out(
      s.enabled
        ? `${s.gray("legend:")} ${s.green("trainable")} (loss_mask 1) · ${s.dim("masked")} (loss_mask 0)`
        : values.decode
          ? "legend: trainable text (loss_mask 1) as is; masked text (loss_mask 0) [[in double brackets]]"
          : "legend: trainable ids (loss_mask 1) as is; masked ids (loss_mask 0) [in brackets]",
    );
    trajectory.traces.forEach((t, i) => {
      const trainable = t.loss_mask.reduce<number>((a, m) => a + m, 0);
      ctx.out("");
      ctx.out(s.bold(`── trace ${i} · prompt ${t.prompt_ids.length} tokens · response ${t.response_ids.length} tokens (${trainable} trainable) · finish ${t.finish_reason} ──`));
      const text = decoded?.traces[i];
      if (text) {
        if (values.prompt !== false) {
          ctx.out(s.gray("prompt:"));
          ctx.out(s.enabled ? s.dim(text.prompt_text) : `[[${text.prompt_text}]]`);
          ctx.out(s.gray("response:"));
        }
        ctx.out(renderSegments(text.segments, s));
      } else {
        ctx.out(renderIds(t, s, maxIds));
      }
    });
    return EXIT.ok;
  },
};
