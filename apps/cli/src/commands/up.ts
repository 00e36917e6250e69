import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { numberOption, type CommandSpec } from "../framework.js";
import { EXIT, type Context } from "../output.js";
import { printPreflight } from "../preflight.js";

/** apps/cluster's entry point, next to this package in the workspace (or ROLLGATE_CLUSTER_MAIN). */
export function clusterMain(): string {
  return process.env.ROLLGATE_CLUSTER_MAIN ?? path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../cluster/dist/main.js");
}

export const upCommand: CommandSpec<Context> = {
  name: "up",
  summary: "run the all-in-one local cluster (engine-sim + gateway + worker on Redis) until Ctrl-C",
  description: `Runs the all-in-one local cluster in the foreground: engine-sim (unless --engines names real
engines), the gateway and a worker, on the Redis at --redis-url (or 127.0.0.1:6379, or a private
redis-server it starts itself). Prints each engine's state, a WARNING naming every engine that
does not answer (repeated while it lasts: tasks submitted meanwhile wait in the queue), and
"rollgate ready: <url>" once every part is up and every engine can serve; the apps' logs go to
stderr. Ctrl-C (or SIGTERM, also of npx) stops everything. Same as \`npm start\`.`,
  args: [],
  options: [
    { name: "port", short: "p", type: "string", value: "<port>", env: "PORT", default: "8080", description: "gateway port (0 picks a free one)" },
    { name: "host", type: "string", value: "<addr>", env: "HOST", description: "gateway listen address (default 127.0.0.1)" },
    { name: "redis-url", type: "string", value: "<url>", env: "REDIS_URL", description: "Redis to use" },
    { name: "dp", type: "string", value: "<n>", env: "ROLLGATE_SIM_DP_SIZE", description: "engine-sim data-parallel ranks (default 2)" },
    { name: "concurrency", short: "c", type: "string", value: "<n>", env: "ROLLGATE_WORKER_CONCURRENCY", description: "rollouts the worker runs at once (default 4)" },
    { name: "engines", type: "string", value: "<json>", env: "ROLLGATE_ENGINES", description: "real engines instead of engine-sim: JSON list of {kind, url, dp_size, model?}" },
    { name: "log-level", type: "string", value: "<level>", env: "LOG_LEVEL", description: "app log level (default info)" },
  ],
  examples: ["rollgate up", "rollgate up --port 9000 --dp 4", "rollgate up --engines '[{\"kind\":\"vllm\",\"url\":\"http://gpu-box:8000\",\"dp_size\":1}]'"],
  async run(ctx, _args, values) {
    const main = clusterMain();
    if (!existsSync(main)) throw new Error(`the cluster is not built (${main} is missing): run npm run build first`);
    numberOption(values, "port", "up", { integer: true, min: 0 });
    numberOption(values, "dp", "up", { integer: true, min: 1 });
    numberOption(values, "concurrency", "up", { integer: true, min: 1 });
    const env: NodeJS.ProcessEnv = { ...process.env };
    const set = (name: string, v: unknown) => {
      if (typeof v === "string" && v !== "") env[name] = v;
    };
    set("PORT", values.port);
    set("HOST", values.host);
    set("REDIS_URL", values["redis-url"]);
    set("ROLLGATE_SIM_DP_SIZE", values.dp);
    set("ROLLGATE_WORKER_CONCURRENCY", values.concurrency);
    set("ROLLGATE_ENGINES", values.engines);
    set("LOG_LEVEL", values["log-level"]);
    set("ROLLGATE_API_KEY", ctx.apiKey);
    const child = spawn(process.execPath, [main], { env, stdio: ["ignore", "pipe", "inherit"] });
    readline.createInterface({ input: child.stdout! }).on("line", (line) => {
      const m = /^rollgate ready: (\S+)/.exec(line);
      if (!m) {
        // Each engine's state, and loud warnings while one cannot serve.
        if (ctx.json) return ctx.printJson({ ready: false, message: line }, true);
        return ctx.out(line.startsWith("WARNING") ? ctx.style.bold(ctx.style.red(line)) : line);
      }
      const url = m[1]!;
      if (ctx.json) {
        ctx.printJson({ ready: true, url, dashboard: `${url}/dashboard` }, true);
        void printPreflight(ctx, url);
        return;
      }
      ctx.out(line);
      const s = ctx.style;
      ctx.out(`  dashboard  ${s.cyan(`${url}/dashboard`)}`);
      ctx.out(`  try        ${s.bold(`${url === "http://127.0.0.1:8080" ? "" : `ROLLGATE_URL=${url} `}rollgate submit examples/react-agent/task.json`)}`);
      ctx.out(`  stop       Ctrl-C`);
      // Model profiles: what will hold on each engine before a run (the gateway's preflight).
      void printPreflight(ctx, url);
    });
    const forward = (sig: NodeJS.Signals) => () => child.kill(sig);
    process.on("SIGINT", forward("SIGINT"));
    process.on("SIGTERM", forward("SIGTERM"));
    process.on("SIGHUP", forward("SIGTERM"));
    // Launched through npx (npm, then a shell), a SIGTERM may stop the launcher without reaching
    // us: when our parent is gone, stop the cluster as if told to.
    const parent = process.ppid;
    const orphaned = setInterval(() => {
      if (process.ppid === parent) return;
      clearInterval(orphaned);
      child.kill("SIGTERM");
    }, 500);
    orphaned.unref();
    return new Promise((resolve) => {
      child.on("error", (err) => {
        ctx.err(`rollgate up: cannot start the cluster: ${err.message}`);
        resolve(EXIT.failed);
      });
      child.on("exit", (code, signal) => resolve(code ?? (signal === "SIGINT" || signal === "SIGTERM" ? EXIT.ok : EXIT.failed)));
    });
  },
};
