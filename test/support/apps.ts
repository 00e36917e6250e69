import path from "node:path";
import { startChild, stopChild, type StartedChild } from "@rollgate/testkit";
import { REPO_ROOT } from "./cluster.js";
import { TEST_REDIS_URL } from "./redis.js";

/** Starts one built app (`apps/<name>/dist/main.js`) as a process and waits for its ready line. */
export function startApp(name: "engine-sim" | "gateway" | "worker", args: string[], env: Record<string, string>): Promise<StartedChild> {
  const ready = { "engine-sim": /^engine-sim ready: (\S+)/, gateway: /^gateway ready: (\S+)/, worker: /^worker ready: (\S+)/ }[name];
  return startChild(name, process.execPath, [path.join(REPO_ROOT, "apps", name, "dist", "main.js"), ...args], {
    env: { ...process.env, REDIS_URL: TEST_REDIS_URL, LOG_LEVEL: "warn", ...env },
    ready,
  });
}

/** A gateway and `workers` worker processes on one key prefix, against a running engine. */
export async function startFleet(opts: { prefix: string; engineUrl: string; workers: number; workerEnv?: Record<string, string>; gatewayEnv?: Record<string, string> }) {
  const gateway = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: opts.prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: opts.engineUrl, dp_size: 2, profile: "qwen3" }]),
    ...opts.gatewayEnv,
  });
  const workers: StartedChild[] = [];
  for (let i = 0; i < opts.workers; i++) {
    workers.push(
      await startApp("worker", [], {
        ROLLGATE_KEY_PREFIX: opts.prefix,
        ROLLGATE_GATEWAY_URL: gateway.ready,
        ROLLGATE_WORKER_NAME: `w${i}`,
        ROLLGATE_CALLBACK_BACKOFF_MS: "100",
        ...opts.workerEnv,
      }),
    );
  }
  return {
    url: gateway.ready,
    gateway,
    workers,
    stop: async () => {
      await Promise.all(workers.map((w) => stopChild(w.proc, 5_000)));
      await stopChild(gateway.proc, 5_000);
    },
  };
}

export { stopChild };
