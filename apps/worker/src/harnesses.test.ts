import { AgentSpec } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { planHarness } from "./harnesses.js";

const ctx = { instruction: "Fix it; rm -rf / is NOT ok", sessionUrl: "http://gw:8080/s/s-1", token: "tok" };
const plan = (agent: unknown) => planHarness(AgentSpec.parse(agent), ctx);

describe("harness presets", () => {
  it("passes the instruction as one argv element, never through a shell", () => {
    for (const harness of ["claude-code", "codex", "gemini-cli", "qwen-code", "pi"]) {
      const p = plan({ harness });
      expect(p.argv).toContain(ctx.instruction);
      expect(p.argv.join(" ")).not.toMatch(/bash -c|sh -c/);
    }
    expect(plan({ harness: "command", command: ["my-agent", "--x"], args: ["--y"] }).argv).toEqual(["my-agent", "--x", "--y"]);
  });

  it("gives opencode its instruction split at the spaces after --, so `opencode run` joins it back unquoted", () => {
    // opencode wraps every message word holding a space in quotes and escapes the quotes inside:
    // a #sim: script passed as one argv element would reach the model as `"…#sim: [{\"think\"…]"`.
    const instruction = 'Write it.\n#sim: [{"text": "a  b", "tool_calls": []}] -x --help';
    const p = planHarness(AgentSpec.parse({ harness: "opencode", args: ["--print-logs"] }), { ...ctx, instruction });
    const dash = p.argv.indexOf("--");
    expect(p.argv.slice(0, dash)).toEqual(["opencode", "run", "--print-logs"]);
    const words = p.argv.slice(dash + 1);
    expect(words.some((w) => w.includes(" "))).toBe(false);
    expect(words.join(" ")).toBe(instruction);
  });

  it("points Codex at the session through a custom Responses provider", () => {
    const p = plan({ harness: "codex", model: "m1" });
    expect(p.argv.slice(0, 2)).toEqual(["codex", "exec"]);
    const toml = p.homeFiles[".codex/config.toml"]!;
    expect(toml).toContain('base_url = "http://gw:8080/s/s-1/v1"');
    expect(toml).toContain('wire_api = "responses"');
    expect(toml).toContain('env_key = "OPENAI_API_KEY"');
    expect(toml).toContain('model = "m1"');
  });

  it("configures Gemini CLI's api-key auth and skips its model router with -m", () => {
    const p = plan({ harness: "gemini-cli" });
    expect(JSON.parse(p.homeFiles[".gemini/settings.json"]!)).toMatchObject({ security: { auth: { selectedType: "gemini-api-key" } }, skills: { enabled: false } });
    expect(p.argv).toContain("-m");
    expect(p.env.GEMINI_CLI_TRUST_WORKSPACE).toBe("true");
  });

  it("picks opencode's and pi's provider by protocol", () => {
    const oc = JSON.parse(plan({ harness: "opencode", protocol: "gemini" }).env.OPENCODE_CONFIG_CONTENT!);
    expect(oc.provider.rollgate).toMatchObject({ npm: "@ai-sdk/google", options: { baseURL: "http://gw:8080/s/s-1/v1beta", apiKey: "tok" } });
    const pi = JSON.parse(plan({ harness: "pi", protocol: "anthropic_messages" }).homeFiles[".pi/agent/models.json"]!);
    expect(pi.providers.rollgate).toMatchObject({ api: "anthropic-messages", baseUrl: "http://gw:8080/s/s-1" });
  });

  it("turns telemetry and update checks off", () => {
    expect(plan({ harness: "claude-code" }).env).toMatchObject({ DISABLE_TELEMETRY: "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1" });
    expect(JSON.parse(plan({ harness: "qwen-code" }).homeFiles[".qwen/settings.json"]!)).toEqual({ privacy: { usageStatisticsEnabled: false } });
  });

  it("rejects an unknown harness by name", () => {
    expect(() => AgentSpec.parse({ harness: "cursor" })).toThrow(/harness/);
  });
});
