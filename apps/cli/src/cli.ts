import { readFileSync } from "node:fs";
import { allCommands } from "./commands/index.js";
import { UsageError, commandHelp, findCommand, formatOptions, parseCommand, type CommandSpec, type OptionSpec } from "./framework.js";
import { DEFAULT_URL, EXIT, makeContext, makeStyle, reportError, type Context } from "./output.js";

export const GLOBAL_OPTIONS: OptionSpec[] = [
  { name: "url", short: "u", type: "string", value: "<url>", env: "ROLLGATE_URL", description: `the gateway (default ${DEFAULT_URL})` },
  { name: "api-key", short: "k", type: "string", value: "<key>", env: "ROLLGATE_API_KEY", description: "API key, sent as Authorization: Bearer" },
  { name: "json", type: "boolean", description: "machine-readable JSON on stdout (errors too: {error:{type,message}})" },
  { name: "color", type: "boolean", description: "colours on a terminal (--no-color, or NO_COLOR, turns them off)" },
  { name: "help", short: "h", type: "boolean", description: "help for rollgate or the command" },
  { name: "version", short: "V", type: "boolean", description: "the CLI's version" },
];

function version(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version?: string };
    return pkg.version ?? "0.0.0";
  } catch {
    return "0.0.0";
  }
}

export function mainHelp(commands: CommandSpec<Context>[]): string {
  const w = Math.max(...commands.map((c) => c.name.length)) + 2;
  return [
    "rollgate: the rollout gateway for agentic RL, from the command line",
    "",
    "Usage: rollgate <command> [arguments] [options]",
    "",
    "Commands:",
    ...commands.map((c) => `  ${c.name.padEnd(w)}${c.summary}`),
    `  ${"help".padEnd(w)}help for a command (same as rollgate <command> --help)`,
    "",
    "Global options (any command):",
    formatOptions(GLOBAL_OPTIONS),
    "",
    "Exit codes: 0 ok · 1 the outcome failed (a task failed, timed out or was cancelled) · 2 usage",
    "            error · 3 the gateway is unreachable · 4 the gateway answered an error (4xx/5xx)",
    "",
    "Start here:",
    "  rollgate up                                   # the local cluster, in another terminal",
    "  rollgate submit examples/react-agent/task.json",
    "  rollgate tasks                                # what ran, newest first",
    "  rollgate watch <task id>",
    "  rollgate trajectory <task id> --decode",
  ].join("\n");
}

/** Runs the CLI on `argv` (without node and the script); resolves to the exit code. */
export async function runCli(argv: string[]): Promise<number> {
  const commands = allCommands;
  const { name, rest } = findCommand(argv, GLOBAL_OPTIONS);
  const style = makeStyle(process.stderr.isTTY === true && !process.env.NO_COLOR && !argv.includes("--no-color"));
  const usage = (message: string, cmd?: string) => {
    if (argv.includes("--json")) process.stdout.write(`${JSON.stringify({ error: { type: "usage", message } })}\n`);
    process.stderr.write(`${style.red("rollgate:")} ${message}\n  See: rollgate ${cmd ? `${cmd} ` : ""}--help\n`);
    return EXIT.usage;
  };
  if (name === undefined) {
    if (rest.includes("--version") || rest.includes("-V")) {
      process.stdout.write(`${version()}\n`);
      return EXIT.ok;
    }
    if (rest.includes("--help") || rest.includes("-h") || rest.length === 0) {
      process.stdout.write(`${mainHelp(commands)}\n`);
      return rest.length === 0 ? EXIT.usage : EXIT.ok;
    }
    return usage(`no command given (unknown option ${rest[0]})`);
  }
  if (name === "help") {
    const target = rest.find((a) => !a.startsWith("-"));
    const cmd = commands.find((c) => c.name === target);
    if (target && !cmd) return usage(`unknown command ${JSON.stringify(target)}`);
    process.stdout.write(`${cmd ? commandHelp("rollgate", cmd, GLOBAL_OPTIONS) : mainHelp(commands)}\n`);
    return EXIT.ok;
  }
  const cmd = commands.find((c) => c.name === name);
  if (!cmd) {
    const near = commands.filter((c) => c.name.startsWith(name.slice(0, 2))).map((c) => c.name);
    return usage(`unknown command ${JSON.stringify(name)}${near.length ? ` (did you mean ${near.join(" or ")}?)` : ""}`);
  }
  let parsed;
  try {
    parsed = parseCommand(cmd, rest, GLOBAL_OPTIONS);
  } catch (err) {
    if (err instanceof UsageError) return usage(`${cmd.name}: ${err.message}`, cmd.name);
    throw err;
  }
  if (parsed.values.help) {
    process.stdout.write(`${commandHelp("rollgate", cmd, GLOBAL_OPTIONS)}\n`);
    return EXIT.ok;
  }
  const ctx = makeContext(parsed.values);
  try {
    new URL(ctx.url);
  } catch {
    return usage(`--url ${JSON.stringify(ctx.url)} is not a URL (e.g. http://127.0.0.1:8080)`);
  }
  try {
    return await cmd.run(ctx, parsed.args, parsed.values);
  } catch (err) {
    if (err instanceof UsageError) return usage(`${cmd.name}: ${err.message}`, cmd.name);
    return reportError(ctx, err);
  }
}
