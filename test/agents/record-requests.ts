/**
 * Records the requests the real agent CLIs send into the fixtures the transforms tests replay
 * (packages/transforms/src/__fixtures__/agent-requests). Each CLI case of the agent suite runs
 * through the whole system on its `#sim:` script, with a recording relay in front of the gateway's
 * session URLs; its main turn, its tool-result turn and its side requests become one file each
 * (request-fixtures.ts says how they are named, redacted and scrubbed). Files no case wrote are
 * removed, and the README's table of files and CLI versions is rewritten.
 *
 * Run from the repository root: `npm run record:agent-requests` (installs the CLIs, builds, runs
 * this with test/agents/vitest.record.config.ts). About three minutes on two cores.
 */
import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { TaskRecord } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO_ROOT } from "../support/cluster.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { AGENT_CASES, HARNESS_PACKAGES, agentTask, caseName, caseProtocol, caseSlug, scriptFor, type AgentCase } from "./cases.js";
import { startRecordingRelay, type RecordingRelay } from "./recording-relay.js";
import { requestKinds, toFixture, type AgentRequestFixture } from "./request-fixtures.js";
import { requireAgentClis, startAgentStack, type AgentStack } from "./stack.js";

const FIXTURE_DIR = path.join(REPO_ROOT, "packages", "transforms", "src", "__fixtures__", "agent-requests");
const README = path.join(FIXTURE_DIR, "README.md");

const prefix = uniquePrefix("record");
let relay: RecordingRelay;
let stack: AgentStack;
let linkDir: string;
const api = apiClient(() => stack.fleet.url);
const written = new Map<string, AgentRequestFixture>();

// Fixed words and task ids (the key prefix is the run's own): a refresh changes only what the CLIs changed.
const wordOf = (c: AgentCase) => `agent-ok-${caseSlug(c)}`;
const taskIdOf = (c: AgentCase) => `t-record-${caseSlug(c)}`;

async function versionOf(c: AgentCase): Promise<string> {
  const pkg = path.join(REPO_ROOT, "test", "agents", "node_modules", HARNESS_PACKAGES[c.harness], "package.json");
  return (JSON.parse(await readFile(pkg, "utf8")) as { version: string }).version;
}

beforeAll(async () => {
  requireAgentClis();
  linkDir = await mkdtemp(path.join(os.tmpdir(), "rollgate-agent-links-"));
  relay = await startRecordingRelay();
  // Sessions hand out the relay's URL; the worker itself talks to the gateway directly.
  stack = await startAgentStack({ prefix, gatewayEnv: { ROLLGATE_PUBLIC_URL: relay.url } });
  relay.setTarget(stack.fleet.url);
  for (const c of AGENT_CASES) {
    const res = await api("/v1/tasks", { body: { ...agentTask(c, scriptFor(c, wordOf(c), linkDir)), id: taskIdOf(c), metadata: { suite: "record-requests" } } });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
  }
}, 5 * 60_000);

afterAll(async () => {
  await stack?.stop();
  await relay?.close();
  if (linkDir) await rm(linkDir, { recursive: true, force: true });
  await dropPrefix(prefix);
}, 60_000);

describe.each(AGENT_CASES.map((c) => [caseName(c), c] as const))("%s", (_name, c) => {
  it("completes its task, and its requests become fixtures", async () => {
    const task = await poll(async () => (await api(`/v1/tasks/${taskIdOf(c)}`)).body as TaskRecord, (t) => t.result !== null, 10 * 60_000, 500);
    const result = task.result!;
    // Only a run that went as scripted is worth recording.
    expect(result.status, JSON.stringify({ error: result.error, log: result.agent.log_tail })).toBe("completed");
    expect(result.reward).toBe(1);
    const session = relay.requests.filter((r) => r.session === result.session_id);
    const facts = {
      cli: c.harness,
      version: await versionOf(c),
      protocol: caseProtocol(c),
      taskId: taskIdOf(c),
      linkDir,
      word: wordOf(c),
    };
    for (const { kind, request } of requestKinds(session, c.shell.name)) {
      expect(request.status, `${kind} ${request.url}`).toBe(200);
      const file = `${caseSlug(c)}.${kind}.json`;
      const fixture = toFixture(kind, request, facts);
      written.set(file, fixture);
      await writeFile(path.join(FIXTURE_DIR, file), `${JSON.stringify(fixture, null, 2)}\n`);
    }
  });
});

describe("the fixture folder", () => {
  it("holds exactly this run's files, listed with their CLI versions in the README", async () => {
    const cases = new Set([...written.values()].map((f) => `${f.cli}/${f.protocol}`));
    expect(cases.size, "every case recorded (a failed case leaves the folder as it was)").toBe(AGENT_CASES.length);
    for (const f of await readdir(FIXTURE_DIR)) if (f.endsWith(".json") && !written.has(f)) await rm(path.join(FIXTURE_DIR, f));
    const rows = [...written.entries()]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([file, f]) => `| \`${file}\` | ${f.cli} ${f.version} | ${f.protocol} | ${f.kind} | \`${f.method} ${f.url}\` |`);
    const table = ["| file | CLI | protocol | kind | request |", "| --- | --- | --- | --- | --- |", ...rows].join("\n");
    const readme = await readFile(README, "utf8");
    const begin = "<!-- recorded:begin -->";
    const end = "<!-- recorded:end -->";
    expect(readme).toContain(begin);
    await writeFile(README, `${readme.slice(0, readme.indexOf(begin) + begin.length)}\n${table}\n${readme.slice(readme.indexOf(end))}`);
  });
});
