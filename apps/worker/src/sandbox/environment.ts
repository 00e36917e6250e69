import path from "node:path";

export interface SandboxEnvInput {
  sessionUrl: string;
  token: string;
  sessionId: string;
  taskId: string;
  instruction: string;
  home: string;
  tmp: string;
  path: string;
  /** What the harness preset sets (telemetry off, config content). */
  harnessEnv: Record<string, string>;
  /** The task's own `agent.env`: wins over everything else. */
  agentEnv: Record<string, string>;
}

/**
 * The whole environment an agent gets (docs/agent-environment.md#environment-variables): the gateway URLs for every SDK, the session
 * token as every key, the task's identity and instruction, its harness preset's variables, the
 * task's own `agent.env`, and the minimum a program needs to start (PATH, HOME, TMPDIR, LANG).
 * Nothing of the worker's own environment is copied.
 */
export function sandboxEnv(i: SandboxEnvInput): Record<string, string> {
  return {
    PATH: i.path,
    HOME: i.home,
    TMPDIR: i.tmp,
    LANG: "C.UTF-8",
    OPENAI_BASE_URL: `${i.sessionUrl}/v1`,
    OPENAI_API_KEY: i.token,
    ANTHROPIC_BASE_URL: i.sessionUrl,
    ANTHROPIC_API_KEY: i.token,
    GOOGLE_GEMINI_BASE_URL: i.sessionUrl,
    GEMINI_API_KEY: i.token,
    ROLLGATE_SESSION_ID: i.sessionId,
    ROLLGATE_TASK_ID: i.taskId,
    ROLLGATE_INSTRUCTION: i.instruction,
    ...i.harnessEnv,
    ...i.agentEnv,
  };
}

/**
 * The PATH sandboxed programs see by default: node's own folder (agents are node programs), the
 * bins installed with rollgate (node_modules/.bin: the example agent, agent CLIs), and the
 * system folders.
 */
export function defaultSandboxPath(installRoot: string): string {
  return [
    path.dirname(process.execPath),
    path.join(installRoot, "node_modules", ".bin"),
    "/usr/local/bin",
    "/usr/bin",
    "/bin",
  ].join(":");
}
