import { parseArgs } from "node:util";

/** A small command framework on `node:util` parseArgs: subcommands, typed options, generated help. */

export interface OptionSpec {
  name: string;
  short?: string;
  type: "string" | "boolean";
  description: string;
  /** The placeholder shown in help, e.g. "<file>". */
  value?: string;
  default?: string | boolean;
  /** Allowed values of a string option (checked). */
  choices?: readonly string[];
  /** Environment variable that supplies the default. */
  env?: string;
}

export interface ArgSpec {
  name: string;
  required: boolean;
  description: string;
}

export type Values = Record<string, string | boolean | undefined>;

export interface CommandSpec<C> {
  name: string;
  summary: string;
  description?: string;
  args: ArgSpec[];
  options: OptionSpec[];
  examples?: string[];
  run: (ctx: C, args: string[], values: Values) => Promise<number>;
}

/** A usage mistake: the message is printed with a pointer to --help, exit code 2. */
export class UsageError extends Error {
  constructor(
    message: string,
    readonly command?: string,
  ) {
    super(message);
  }
}

function optionLabel(o: OptionSpec): string {
  const flag = `${o.short ? `-${o.short}, ` : "    "}--${o.name}${o.type === "string" ? ` ${o.value ?? "<value>"}` : ""}`;
  return flag;
}

function describeOption(o: OptionSpec): string {
  const extra: string[] = [];
  if (o.choices) extra.push(`one of ${o.choices.join(", ")}`);
  if (o.env) extra.push(`env ${o.env}`);
  if (o.default !== undefined && o.default !== false) extra.push(`default ${String(o.default)}`);
  return extra.length ? `${o.description} (${extra.join("; ")})` : o.description;
}

export function formatOptions(options: OptionSpec[]): string {
  const labels = options.map(optionLabel);
  const width = Math.min(34, Math.max(...labels.map((l) => l.length)) + 2);
  return options.map((o, i) => `  ${labels[i]!.padEnd(width)}${describeOption(o)}`).join("\n");
}

export function commandHelp<C>(program: string, cmd: CommandSpec<C>, globals: OptionSpec[]): string {
  const usageArgs = cmd.args.map((a) => (a.required ? `<${a.name}>` : `[${a.name}]`)).join(" ");
  const parts = [`Usage: ${program} ${cmd.name}${usageArgs ? ` ${usageArgs}` : ""} [options]`, "", cmd.description ?? cmd.summary];
  if (cmd.args.length) {
    const width = Math.max(...cmd.args.map((a) => a.name.length)) + 4;
    parts.push("", "Arguments:", ...cmd.args.map((a) => `  ${a.name.padEnd(width)}${a.description}`));
  }
  if (cmd.options.length) parts.push("", "Options:", formatOptions(cmd.options));
  parts.push("", "Global options:", formatOptions(globals));
  if (cmd.examples?.length) parts.push("", "Examples:", ...cmd.examples.map((e) => `  ${e}`));
  return parts.join("\n");
}

/**
 * Splits argv into the command name and the rest; global string options may come before the
 * command (`rollgate --url X submit f`).
 */
export function findCommand(argv: string[], globals: OptionSpec[]): { name: string | undefined; rest: string[] } {
  const takesValue = new Set(globals.filter((o) => o.type === "string").flatMap((o) => [`--${o.name}`, ...(o.short ? [`-${o.short}`] : [])]));
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--") break;
    if (a.startsWith("-")) {
      if (takesValue.has(a)) i++;
      continue;
    }
    return { name: a, rest: [...argv.slice(0, i), ...argv.slice(i + 1)] };
  }
  return { name: undefined, rest: argv };
}

/** Parses a command's argv (strict: unknown options and wrong arities are usage errors). */
export function parseCommand<C>(cmd: CommandSpec<C>, argv: string[], globals: OptionSpec[]): { args: string[]; values: Values } {
  const all = [...globals, ...cmd.options];
  const options: Record<string, { type: "string" | "boolean"; short?: string }> = {};
  for (const o of all) options[o.name] = { type: o.type, ...(o.short ? { short: o.short } : {}) };
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options, strict: true, allowPositionals: true, allowNegative: true });
  } catch (err) {
    throw new UsageError((err as Error).message.replace(/\. To specify a positional argument.*$/s, ""), cmd.name);
  }
  const values: Values = { ...(parsed.values as Values) };
  for (const o of all) {
    if (values[o.name] === undefined && o.env && process.env[o.env]) values[o.name] = process.env[o.env];
    if (values[o.name] === undefined && o.default !== undefined) values[o.name] = o.default;
    const v = values[o.name];
    if (o.choices && typeof v === "string" && !o.choices.includes(v)) {
      throw new UsageError(`--${o.name} must be one of ${o.choices.join(", ")} (got ${JSON.stringify(v)})`, cmd.name);
    }
  }
  const required = cmd.args.filter((a) => a.required).length;
  if (values.help !== true) {
    if (parsed.positionals.length < required) {
      throw new UsageError(`missing ${cmd.args.slice(parsed.positionals.length).filter((a) => a.required).map((a) => `<${a.name}>`).join(" ")}`, cmd.name);
    }
    if (parsed.positionals.length > cmd.args.length) {
      throw new UsageError(`unexpected argument ${JSON.stringify(parsed.positionals[cmd.args.length])}`, cmd.name);
    }
  }
  return { args: parsed.positionals, values };
}

/** A positive number option, or a usage error naming it. */
export function numberOption(values: Values, name: string, cmd: string, opts: { integer?: boolean; min?: number } = {}): number | undefined {
  const v = values[name];
  if (v === undefined || v === false) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || (opts.integer && !Number.isInteger(n)) || n < (opts.min ?? 0)) {
    throw new UsageError(`--${name} must be a${opts.integer ? "n integer" : " number"} ≥ ${opts.min ?? 0} (got ${JSON.stringify(v)})`, cmd);
  }
  return n;
}
