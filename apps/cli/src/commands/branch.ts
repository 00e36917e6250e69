import { UsageError, numberOption, type CommandSpec } from "../framework.js";
import { EXIT, type Context } from "../output.js";

export const branchCommand: CommandSpec<Context> = {
  name: "branch",
  summary: "replay a finished task to an LLM call and sample n continuations from there (a group)",
  description: `Makes a group of n tasks that replay the task's first <call> LLM calls from its records (the
agent re-runs the same tool calls in a fresh sandbox), then sample from the engine. Replayed
answers are loss_mask 0 unless --train-replayed. See docs/data-model.md#branches.`,
  args: [{ name: "id", required: true, description: "the finished task to branch" }],
  options: [
    { name: "at", type: "string", value: "<call>", description: "the call to branch at: the calls before it are replayed (≥ 1)" },
    { name: "n", short: "n", type: "string", value: "<n>", description: "how many branches (default 4)" },
    { name: "train-replayed", type: "boolean", description: "keep the replayed answers trainable" },
  ],
  examples: ["rollgate branch t-123 --at 2 -n 4", "rollgate branch t-123 --at 2 --json | jq -r .group_id"],
  async run(ctx, [id], values) {
    const at = numberOption(values, "at", "branch", { integer: true, min: 1 });
    if (at === undefined) throw new UsageError("--at <call> is required: the call to branch at", "branch");
    const n = numberOption(values, "n", "branch", { integer: true, min: 1 }) ?? 4;
    const accepted = await ctx.client.branch(id!, { at_call: at, n, train_replayed: values["train-replayed"] === true });
    if (ctx.json) {
      ctx.printJson(accepted);
      return EXIT.ok;
    }
    const s = ctx.style;
    ctx.out(`${s.bold(accepted.group_id)}: ${accepted.task_ids.length} branch(es) of ${id} at call ${at}`);
    for (const t of accepted.task_ids) ctx.out(`  ${t}`);
    if (accepted.whole_rollout) ctx.out(s.yellow(`call ${at} is past the task's last call: every branch replays the whole rollout and samples nothing`));
    ctx.out(s.gray(`follow them: rollgate tasks --group ${accepted.group_id}`));
    return EXIT.ok;
  },
};
