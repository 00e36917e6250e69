import type { CommandSpec } from "../framework.js";
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
  summary: "set the policy weight version stamped on every completion from now on",
  args: [{ name: "version", required: true, description: "e.g. step-42 (what your trainer calls this checkpoint)" }],
  options: [],
  examples: ["rollgate weights step-42"],
  async run(ctx, [version]) {
    show(ctx, `weight version set to ${version}`, await ctx.client.setWeightVersion(version!));
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
