import type { AgentProtocol, AgentSpec, HarnessPreset } from "@rollgate/protocol";

/**
 * How each agent CLI runs unmodified and offline against a session (docs/agent-environment.md#harness-presets):
 * its binary and non-interactive argv, the config files it needs in HOME, the variables that turn
 * its telemetry and update checks off, and how its model name is pinned. The instruction is always
 * one argv element, never part of a shell string.
 */
export interface HarnessPlan {
  argv: string[];
  /** Argv that must come after the task's `agent.args` (the message of `opencode run -- …`). */
  trailing?: string[];
  /** Files to write, relative to the sandbox HOME. */
  homeFiles: Record<string, string>;
  env: Record<string, string>;
}

export interface HarnessContext {
  instruction: string;
  /** `<gateway>/s/<sid>`: each protocol's base URL hangs off it. */
  sessionUrl: string;
  token: string;
}

/** The model name an agent is told when the task names none (the gateway serves the engine's anyway). */
export const DEFAULT_AGENT_MODEL = "rollgate-policy";

const QUIET = { DO_NOT_TRACK: "1", NO_UPDATE_NOTIFIER: "1", CI: "1" };

/** Protocol defaults for the multi-protocol CLIs. */
const DEFAULT_PROTOCOL: Record<"opencode" | "pi", AgentProtocol> = { opencode: "openai_chat", pi: "openai_chat" };

function opencodeProvider(protocol: AgentProtocol, sessionUrl: string): { npm: string; baseURL: string } {
  switch (protocol) {
    case "openai_chat":
      return { npm: "@ai-sdk/openai-compatible", baseURL: `${sessionUrl}/v1` };
    case "openai_responses":
      return { npm: "@ai-sdk/openai", baseURL: `${sessionUrl}/v1` };
    case "anthropic_messages":
      return { npm: "@ai-sdk/anthropic", baseURL: `${sessionUrl}/v1` };
    case "gemini":
      return { npm: "@ai-sdk/google", baseURL: `${sessionUrl}/v1beta` };
  }
}

function piApi(protocol: AgentProtocol, sessionUrl: string): { api: string; baseUrl: string } {
  switch (protocol) {
    case "openai_chat":
      return { api: "openai-completions", baseUrl: `${sessionUrl}/v1` };
    case "openai_responses":
      return { api: "openai-responses", baseUrl: `${sessionUrl}/v1` };
    case "anthropic_messages":
      return { api: "anthropic-messages", baseUrl: sessionUrl };
    case "gemini":
      return { api: "google-generative-ai", baseUrl: `${sessionUrl}/v1beta` };
  }
}

function presetPlan(harness: HarnessPreset, protocol: AgentProtocol | undefined, model: string, c: HarnessContext): HarnessPlan {
  switch (harness) {
    case "claude-code":
      return {
        argv: ["claude", "-p", c.instruction, "--model", model, "--allowedTools", "Bash,Read,Edit,Write,Glob,Grep"],
        homeFiles: {},
        env: {
          ...QUIET,
          CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
          DISABLE_TELEMETRY: "1",
          DISABLE_AUTOUPDATER: "1",
          DISABLE_ERROR_REPORTING: "1",
        },
      };
    case "codex":
      // Codex speaks only Responses, and only through a custom provider (the built-in one
      // ignores OPENAI_BASE_URL and tries a WebSocket).
      return {
        argv: ["codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", c.instruction],
        homeFiles: {
          ".codex/config.toml": [
            `model = ${JSON.stringify(model)}`,
            `model_provider = "rollgate"`,
            `check_for_update_on_startup = false`,
            `[analytics]`,
            `enabled = false`,
            `[model_providers.rollgate]`,
            `name = "rollgate"`,
            `base_url = ${JSON.stringify(`${c.sessionUrl}/v1`)}`,
            `env_key = "OPENAI_API_KEY"`,
            `wire_api = "responses"`,
            ``,
          ].join("\n"),
        },
        env: { ...QUIET },
      };
    case "gemini-cli":
      // `-m` skips Gemini CLI's model router; selectedType avoids its "gateway" auth bug. Agent
      // skills off: its system prompt lists its built-in skills in the order they load, which
      // differs run to run, so a rollout could not be branched (replayed) nor share a prefix cache.
      return {
        argv: ["gemini", "--yolo", "-m", model, "-p", c.instruction],
        homeFiles: {
          ".gemini/settings.json": JSON.stringify({
            security: { auth: { selectedType: "gemini-api-key" } },
            privacy: { usageStatisticsEnabled: false },
            skills: { enabled: false },
          }),
        },
        env: { ...QUIET, GEMINI_CLI_TRUST_WORKSPACE: "true" },
      };
    case "opencode": {
      const p = opencodeProvider(protocol ?? DEFAULT_PROTOCOL.opencode, c.sessionUrl);
      const config = {
        provider: {
          rollgate: {
            npm: p.npm,
            name: "rollgate",
            options: { baseURL: p.baseURL, apiKey: c.token },
            models: { [model]: { name: model, tool_call: true } },
          },
        },
        model: `rollgate/${model}`,
        small_model: `rollgate/${model}`,
        autoupdate: false,
        share: "disabled",
      };
      // `opencode run` joins its message words with " " and wraps every word holding a space in
      // quotes, escaping the quotes inside (JSON, `#sim:` scripts): split the instruction at the
      // spaces after `--`, so the join gives it back byte for byte and nothing is read as a flag.
      return {
        argv: ["opencode", "run"],
        trailing: ["--", ...c.instruction.split(" ")],
        homeFiles: {},
        env: {
          ...QUIET,
          OPENCODE_CONFIG_CONTENT: JSON.stringify(config),
          OPENCODE_DISABLE_MODELS_FETCH: "1",
          OPENCODE_DISABLE_AUTOUPDATE: "1",
          OPENCODE_DISABLE_DEFAULT_PLUGINS: "1",
          OPENCODE_DISABLE_LSP_DOWNLOAD: "1",
        },
      };
    }
    case "qwen-code":
      return {
        argv: ["qwen", "--yolo", "-p", c.instruction],
        homeFiles: { ".qwen/settings.json": JSON.stringify({ privacy: { usageStatisticsEnabled: false } }) },
        env: { ...QUIET, OPENAI_MODEL: model },
      };
    case "pi": {
      const p = piApi(protocol ?? DEFAULT_PROTOCOL.pi, c.sessionUrl);
      const models = {
        providers: {
          rollgate: {
            baseUrl: p.baseUrl,
            api: p.api,
            apiKey: c.token,
            models: [{ id: model, reasoning: false, input: ["text"], contextWindow: 128000, maxTokens: 8192 }],
          },
        },
      };
      return {
        argv: ["pi", "-p", "--provider", "rollgate", "--model", model, c.instruction],
        homeFiles: { ".pi/agent/models.json": JSON.stringify(models) },
        env: { ...QUIET, PI_OFFLINE: "1" },
      };
    }
  }
}

/** The argv, HOME files and environment for a task's agent. */
export function planHarness(agent: AgentSpec, c: HarnessContext): HarnessPlan {
  if (agent.harness === "command") return { argv: [...agent.command, ...agent.args], homeFiles: {}, env: {} };
  const { trailing = [], ...plan } = presetPlan(agent.harness, agent.protocol, agent.model ?? DEFAULT_AGENT_MODEL, c);
  return { ...plan, argv: [...plan.argv, ...agent.args, ...trailing] };
}
