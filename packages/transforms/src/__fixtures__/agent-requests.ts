/**
 * The requests real agent CLIs sent through rollgate, recorded by test/agents/record-requests.ts
 * (agent-requests/README.md says which CLIs and how to refresh them), for the transforms tests.
 */
import { readFileSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { AgentProtocol } from "@rollgate/protocol";

export interface AgentRequest {
  file: string;
  cli: string;
  version: string;
  protocol: AgentProtocol;
  /** `main`, `tool-result` or `side-<n>`. */
  kind: string;
  /** The key the body's reasoning signatures and seals were made with. */
  reasoning_key: string;
  method: string;
  url: string;
  headers: Record<string, string>;
  body: Record<string, unknown>;
}

const DIR = fileURLToPath(new URL("./agent-requests/", import.meta.url));

/** Every recorded request in `protocol`, by file name. */
export function agentRequests(protocol: AgentProtocol): AgentRequest[] {
  return readdirSync(DIR)
    .filter((f) => f.endsWith(".json"))
    .sort()
    .map((file) => ({ file, ...(JSON.parse(readFileSync(DIR + file, "utf8")) as Omit<AgentRequest, "file">) }))
    .filter((r) => r.protocol === protocol);
}
