import { UsageError, type CommandSpec } from "../framework.js";
import { EXIT, type Context } from "../output.js";

function show(ctx: Context, what: string, answer: unknown) {
  if (ctx.json) ctx.printJson(answer ?? { ok: true });
  else ctx.out(`${what}${answer && typeof answer === "object" && Object.keys(answer).length ? `: ${JSON.stringify(answer)}` : ""}`);
}

export const pauseCommand: CommandSpec<Context> = {
  name: "pause",
  summary: "pause inference on every gateway replica (hold new engine calls; for a weight update)",
  args: [],
  options: [{ name: "mode", type: "string", value: "<mode>", choices: ["drain", "abort"], description: "in-flight engine calls: let them finish, or abort them (default: the gateway's)" }],
  examples: ["rollgate pause --mode drain && ./sync_weights.sh && rollgate weights step-42 && rollgate resume"],
  async run(ctx, _args, values) {
    show(ctx, "paused", await ctx.client.pause(values.mode ? { mode: values.mode as "drain" | "abort" } : {}));
    return EXIT.ok;
  },
};

export const resumeCommand: CommandSpec<Context> = {
  name: "resume",
  summary: "resume inference after a pause",
  args: [],
  options: [],
  async run(ctx) {
    show(ctx, "resumed", await ctx.client.resume());
    return EXIT.ok;
  },
};

export const weightsCommand: CommandSpec<Context> = {
  name: "weights",
  summary: "set the policy weight version stamped on every completion from now on; with --load, every engine loads the weights first (inference must be paused)",
  args: [{ name: "version", required: true, description: "e.g. step-42 (what your trainer calls this checkpoint)" }],
  options: [
    { name: "load", type: "string", value: "<path>", description: "a checkpoint folder every engine can read: each engine loads it through its own route, then the version moves" },
    { name: "lora", type: "string", value: "<name>", description: "with --load: load the folder as the LoRA adapter <name> (replacing one of that name) instead of full weights" },
  ],
  examples: ["rollgate weights step-42", "rollgate pause && rollgate weights step-43 --load /ckpt/step-43 && rollgate resume"],
  async run(ctx, [version], values) {
    const path = values.load as string | undefined;
    const lora = values.lora as string | undefined;
    // A usage error (not a bare line on stderr): --json gets its {error} on stdout too.
    if (lora && !path) throw new UsageError("--lora names the adapter that --load <path> loads: give both", "weights");
    if (!path) {
      show(ctx, `weight version set to ${version}`, await ctx.client.setWeightVersion(version!));
      return EXIT.ok;
    }
    const answer = await ctx.client.loadWeights(version!, lora ? { lora: { name: lora, path } } : { path });
    if (ctx.json) ctx.printJson(answer);
    else {
      const engines = (answer as { engines?: { index: number; kind: string; ranks: { dp_rank: number; loaded: boolean }[] }[] }).engines ?? [];
      ctx.out(`weights ${lora ? `(LoRA adapter ${lora}) ` : ""}loaded from ${path} on ${engines.length} engine(s); weight version set to ${version}`);
      for (const e of engines) ctx.out(`  engine ${e.index} (${e.kind}): ranks ${e.ranks.filter((r) => r.loaded).map((r) => r.dp_rank).join(", ")} loaded`);
    }
    return EXIT.ok;
  },
};

export const enginesCommand: CommandSpec<Context> = {
  name: "engines",
  summary: "list the engines and their ranks (health, load, sessions)",
  args: [],
  options: [],
  async run(ctx) {
    const answer = await ctx.client.engines();
    if (ctx.json) ctx.printJson(answer);
    else ctx.out(JSON.stringify(answer, null, 2));
    return EXIT.ok;
  },
};
