/**
 * The agent CLI cases the agent suite (test/e2e-agents) runs and the request recorder
 * (record-requests.ts) records: each pinned CLI, by the tool names and argument schemas it declares,
 * and the `#sim:` script that drives it through one shell call, one read call and an answer.
 */
import path from "node:path";
import type { AgentProtocol, HarnessPreset } from "@rollgate/protocol";
import { REPO_ROOT } from "../support/cluster.js";

/** Where install.sh puts the CLIs' executables. */
export const AGENT_BIN = path.join(REPO_ROOT, "test", "agents", "node_modules", ".bin");
export const AGENT_EXECUTABLES = ["claude", "codex", "gemini", "qwen", "opencode", "pi"];

/** The npm package each harness preset runs (its version is the CLI's version). */
export const HARNESS_PACKAGES: Record<HarnessPreset, string> = {
  "claude-code": "@anthropic-ai/claude-code",
  codex: "@openai/codex",
  "gemini-cli": "@google/gemini-cli",
  "qwen-code": "@qwen-code/qwen-code",
  opencode: "opencode-ai",
  pi: "@mariozechner/pi-coding-agent",
};

/** The protocol a harness speaks when the task names none. */
export const HARNESS_PROTOCOL: Partial<Record<HarnessPreset, AgentProtocol>> = {
  "claude-code": "anthropic_messages",
  codex: "openai_responses",
  "gemini-cli": "gemini",
  "qwen-code": "openai_chat",
};

export interface ToolUse {
  /** The tool's name exactly as the CLI declares it. */
  name: string;
  /** The argument (from the CLI's own schema) that holds the command or the path. */
  arg: string;
}

export interface AgentCase {
  harness: HarnessPreset;
  protocol?: AgentProtocol;
  shell: ToolUse;
  /** The CLI's read tool; null when it has none (Codex: a second shell call reads the file). */
  read: (ToolUse & { absolute?: boolean }) | null;
}

export const ALL_PROTOCOLS: AgentProtocol[] = ["openai_chat", "openai_responses", "anthropic_messages", "gemini"];

export const AGENT_CASES: AgentCase[] = [
  { harness: "claude-code", shell: { name: "Bash", arg: "command" }, read: { name: "Read", arg: "file_path" } },
  { harness: "codex", shell: { name: "exec_command", arg: "cmd" }, read: null },
  { harness: "gemini-cli", shell: { name: "run_shell_command", arg: "command" }, read: { name: "read_file", arg: "file_path" } },
  // qwen-code's read_file takes absolute paths only (the sandbox folder is random: see AgentScript.linkDir).
  { harness: "qwen-code", shell: { name: "run_shell_command", arg: "command" }, read: { name: "read_file", arg: "file_path", absolute: true } },
  ...ALL_PROTOCOLS.map((protocol): AgentCase => ({ harness: "opencode", protocol, shell: { name: "bash", arg: "command" }, read: { name: "read", arg: "filePath" } })),
  ...ALL_PROTOCOLS.map((protocol): AgentCase => ({ harness: "pi", protocol, shell: { name: "bash", arg: "command" }, read: { name: "read", arg: "path" } })),
];

export const caseName = (c: AgentCase) => (c.protocol ? `${c.harness} (${c.protocol})` : c.harness);
export const caseSlug = (c: AgentCase) => (c.protocol ? `${c.harness}-${c.protocol}` : c.harness).replaceAll("_", "-");
/** The protocol the case's requests arrive in. */
export const caseProtocol = (c: AgentCase): AgentProtocol => c.protocol ?? HARNESS_PROTOCOL[c.harness]!;

/** What the model thinks before its shell call, where the family's format can hold reasoning. */
export const SHELL_THOUGHT = "I will write the file with the shell tool.";

export interface AgentScript {
  /** What the shell call writes into result.txt (and the evaluator expects). */
  word: string;
  shellCommand: string;
  readArg: string;
  answer: string;
  /** The `#sim:` steps: think and call the shell tool, call the read tool, answer. */
  steps: unknown[];
}

/**
 * The script for one case. `linkDir` is where the shell step links the sandbox folder for a CLI
 * whose read tool wants absolute paths (the sandbox folder's own name is random); `think: false`
 * for a model family that cannot write reasoning.
 */
export function scriptFor(c: AgentCase, word: string, linkDir: string, opts: { think?: boolean } = {}): AgentScript {
  const link = path.join(linkDir, caseSlug(c));
  const shellCommand = `echo ${word} > result.txt${c.read?.absolute ? ` && ln -s "$PWD" ${link}` : ""}`;
  const readArg = c.read ? (c.read.absolute ? `${link}/result.txt` : "result.txt") : "cat result.txt";
  const answer = `result.txt holds ${word}.`;
  const read = c.read ?? c.shell;
  const steps = [
    // A family whose output format has no reasoning (Llama 3.1, DeepSeek-V3, …) goes straight to the call.
    { ...(opts.think === false ? {} : { think: SHELL_THOUGHT }), tool_calls: [{ name: c.shell.name, arguments: { [c.shell.arg]: shellCommand } }] },
    { tool_calls: [{ name: read.name, arguments: { [read.arg]: readArg } }] },
    { text: answer },
  ];
  return { word, shellCommand, readArg, answer, steps };
}

/** The task that runs the case's CLI on its script; the caller adds id, callback and metadata. */
export function agentTask(c: AgentCase, s: AgentScript) {
  return {
    instruction: `Write ${s.word} into result.txt with your shell tool, then read it back.\n#sim: ${JSON.stringify(s.steps)}`,
    agent: { harness: c.harness, ...(c.protocol ? { protocol: c.protocol } : {}) },
    evaluator: { kind: "file" as const, path: "result.txt", equals: `${s.word}\n` },
    // Claude Code asks for max_tokens 64000, more than engine-sim's 40960-token context holds
    // beside its ~20k-token prompt: the task's max_tokens is the ceiling (as a trainer sets it).
    sampling: { max_tokens: 4096 },
    limits: { timeout_s: 300, max_llm_calls: 30 },
  };
}
