/**
 * The system the agent CLIs run through: engine-sim, a gateway and one worker whose sandboxes find
 * the CLIs on their PATH. Shared by the agent suite and the request recorder.
 */
import { existsSync } from "node:fs";
import path from "node:path";
import type { StartedChild } from "@rollgate/testkit";
import { startApp, startFleet, stopChild } from "../support/apps.js";
import { REPO_ROOT } from "../support/cluster.js";
import { AGENT_BIN, AGENT_EXECUTABLES } from "./cases.js";

export interface AgentStack {
  engine: StartedChild;
  fleet: Awaited<ReturnType<typeof startFleet>>;
  stop: () => Promise<void>;
}

/** A worker whose sandboxes find the CLIs on their PATH. */
export const AGENT_WORKER_ENV: Record<string, string> = {
  // Two rollouts at once: the machine is small and the CLIs are heavy to start.
  ROLLGATE_WORKER_CONCURRENCY: "2",
  ROLLGATE_SANDBOX_PATH: [path.dirname(process.execPath), AGENT_BIN, path.join(REPO_ROOT, "node_modules", ".bin"), "/usr/local/bin", "/usr/bin", "/bin"].join(":"),
};

/** Throws, naming what is missing, unless install.sh has installed every CLI. */
export function requireAgentClis(): void {
  const missing = AGENT_EXECUTABLES.filter((b) => !existsSync(path.join(AGENT_BIN, b)));
  if (missing.length > 0) throw new Error(`agent CLIs not installed (${missing.join(", ")}): run test/agents/install.sh first`);
}

export async function startAgentStack(opts: { prefix: string; gatewayEnv?: Record<string, string> }): Promise<AgentStack> {
  // Unscripted side requests (opencode's title, qwen-code's memory agent) get short random answers.
  const engine = await startApp("engine-sim", ["--port", "0", "--dp", "2", "--random-tokens", "8"], {});
  try {
    const fleet = await startFleet({
      prefix: opts.prefix,
      engineUrl: engine.ready,
      workers: 1,
      ...(opts.gatewayEnv ? { gatewayEnv: opts.gatewayEnv } : {}),
      workerEnv: AGENT_WORKER_ENV,
    });
    return {
      engine,
      fleet,
      stop: async () => {
        await fleet.stop();
        await stopChild(engine.proc);
      },
    };
  } catch (err) {
    await stopChild(engine.proc);
    throw err;
  }
}
