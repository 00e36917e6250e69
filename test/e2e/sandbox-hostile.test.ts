/**
 * A hostile agent in a sealed bubblewrap sandbox, against real engine-sim, gateway, worker and
 * Redis processes, going after what sandbox-escape.test.ts does not:
 *
 * - its own outcome. A rollout that lost an LLM call to infrastructure is never scored (it runs
 *   again, or ends `infrastructure` with no reward), so an agent that could mark one of its calls
 *   lost at will could set aside every rollout it is about to fail: the policy would learn to
 *   escape bad rewards instead of earning good ones.
 * - the worker's host through its egress proxy: a task that allows any destination
 *   (`runtime.egress: ["*"]`) must still not reach the services of the worker's own host (Redis,
 *   the gateway, engines listening on every address), by any of the host's addresses.
 */
import { spawnSync } from "node:child_process";
import http from "node:http";
import os from "node:os";
import type { TaskRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";

const sealable = spawnSync("bwrap", ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-net", "true"]).status === 0;
const prefix = uniquePrefix("outcome");
let engine: StartedChild;
let gateway: StartedChild;
let worker: StartedChild;
/** A service of the worker's host that listens on every address, as Redis or a gateway often does. */
let hostService: http.Server;
let hostServicePort = 0;
const hostIp = Object.values(os.networkInterfaces())
  .flat()
  .find((a) => a && a.family === "IPv4" && !a.internal)?.address;

beforeAll(async () => {
  if (!sealable) return;
  hostService = http.createServer((_req, res) => res.writeHead(200).end("host service"));
  await new Promise<void>((r) => hostService.listen(0, "0.0.0.0", r));
  hostServicePort = (hostService.address() as { port: number }).port;
  engine = await startApp("engine-sim", ["--port", "0", "--dp", "1"], {});
  gateway = await startApp("gateway", ["--port", "0"], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 1, profile: "qwen3" }]),
  });
  worker = await startApp("worker", [], { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_GATEWAY_URL: gateway.ready, ROLLGATE_WORKER_NAME: "outcome-w" });
}, 90_000);

afterAll(async () => {
  await Promise.all([worker, gateway, engine].map((c) => c && stopChild(c.proc, 5_000)));
  if (hostService) await new Promise((r) => hostService.close(r));
  await dropPrefix(prefix);
});

/**
 * Makes one ordinary call, then sends its session POSTs whose headers end just below and just
 * above 16 KiB (Node's limit, the relay's and the gateway's alike): the relay takes them, and adds
 * a little of its own (the gateway's host) on the way. Prints how each was answered.
 */
const AGENT = `
import net from "node:net";
const base = new URL(process.env.OPENAI_BASE_URL);
const chat = await fetch(base + "/chat/completions", {
  method: "POST",
  headers: { authorization: "Bearer " + process.env.OPENAI_API_KEY, "content-type": "application/json" },
  body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "what is 6 times 7?" }], max_tokens: 8 }),
});
console.log("chat " + chat.status);
const answers = {};
for (let size = 16384 - 256; size <= 16384 + 64; size += 4) {
  const head = "POST " + base.pathname + "/chat/completions HTTP/1.1\\r\\nHost: r\\r\\nContent-Type: application/json\\r\\nContent-Length: 1000000\\r\\nX-Pad: ";
  const line = (head + "a".repeat(size - head.length - 4) + "\\r\\n\\r\\n");
  const status = await new Promise((resolve) => {
    const s = net.connect(Number(base.port), base.hostname);
    let got = "";
    s.on("data", (d) => { got += d; if (got.includes("\\r\\n")) { s.destroy(); resolve(got.split(" ")[1]); } });
    s.on("error", () => resolve("reset"));
    s.on("close", () => resolve(got ? got.split(" ")[1] : "closed"));
    s.write(line);
    s.write("b".repeat(1000000));
  });
  answers[status] = (answers[status] ?? 0) + 1;
}
console.log("answers " + JSON.stringify(answers));
`;

async function submit(task: Record<string, unknown>): Promise<TaskRecord> {
  const res = await fetch(`${gateway.ready}/v1/tasks`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(task) });
  expect(res.status).toBe(202);
  const { id } = (await res.json()) as { id: string };
  return poll(async () => (await (await fetch(`${gateway.ready}/v1/tasks/${id}`)).json()) as TaskRecord, (r) => r.result !== null, 60_000, 200);
}

/** Asks its egress proxy for a tunnel to, and a plain GET of, each host:port in argv; prints the answers. */
const PROXY_AGENT = `
import net from "node:net";
const proxy = new URL(process.env.HTTPS_PROXY);
const ask = (request) => new Promise((resolve) => {
  const s = net.connect(Number(proxy.port), proxy.hostname);
  let got = "";
  s.on("data", (d) => { got += d; if (got.includes("\\r\\n")) { s.destroy(); resolve(got.split("\\r\\n")[0]); } });
  s.on("error", (e) => resolve("error " + e.code));
  s.on("close", () => resolve(got || "closed"));
  s.write(request);
});
const out = {};
for (const target of process.argv.slice(2)) {
  out["CONNECT " + target] = await ask("CONNECT " + target + " HTTP/1.1\\r\\nHost: " + target + "\\r\\n\\r\\n");
  out["GET " + target] = await ask("GET http://" + target + "/ HTTP/1.1\\r\\nHost: " + target + "\\r\\n\\r\\n");
}
console.log("answers " + JSON.stringify(out));
`;

describe.skipIf(!sealable || !hostIp)("a hostile agent with runtime.egress [\"*\"] against the worker's host", () => {
  it("reaches no service of the worker's host by the host's own addresses", async () => {
    const target = `${hostIp}:${hostServicePort}`;
    // The service is there, for anyone on the network.
    expect(await (await fetch(`http://${target}/`)).text()).toBe("host service");
    const t = await submit({
      instruction: "look around",
      agent: { harness: "command", command: ["node", "agent.mjs", target] },
      runtime: { isolation: "bwrap", egress: ["*"], files: { "agent.mjs": PROXY_AGENT } },
      evaluator: { kind: "none" },
      limits: { timeout_s: 60 },
    });
    const log = t.result!.agent.log_tail;
    const answers = JSON.parse(/answers (.*)/.exec(log)![1]!) as Record<string, string>;
    expect(answers[`CONNECT ${target}`], log).toMatch(/^HTTP\/1\.1 403/);
    expect(answers[`GET ${target}`], log).toMatch(/^HTTP\/1\.1 403/);
  }, 90_000);
});

/** What an agent leaves for its grader to run: one LLM call on the session, printing how it was answered. */
const SOLUTION = `
const base = process.env.OPENAI_BASE_URL ?? "http://127.0.0.1:47811/s/" + process.env.ROLLGATE_SESSION_ID + "/v1";
const res = await fetch(base + "/chat/completions", {
  method: "POST",
  headers: { authorization: "Bearer " + (process.env.OPENAI_API_KEY ?? ""), "content-type": "application/json" },
  body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "what is 6 times 7?" }], max_tokens: 8 }),
}).catch((e) => ({ status: "error " + e.message }));
console.log("called " + res.status);
`;

describe.skipIf(!sealable)("a hostile agent against its own outcome", () => {
  it("code its grader runs makes no LLM call into the rollout: the evaluator does not hold the session's token", async () => {
    const t = await submit({
      instruction: "write a program that asks the model",
      agent: { harness: "command", command: ["node", "solution.mjs"] },
      runtime: { isolation: "bwrap", files: { "solution.mjs": SOLUTION } },
      evaluator: { kind: "command", command: ["node", "solution.mjs"], reward: "exit_code" },
      limits: { timeout_s: 60 },
    });
    expect(t.status, JSON.stringify(t.result!.error)).toBe("completed");
    expect(t.result!.agent.log_tail).toContain("called 200");
    // The grader's run of the same program was refused, and is not a call of the rollout.
    expect(t.result!.evaluation).toMatchObject({ stdout_tail: expect.stringContaining("called 401") });
    const session = (await (await fetch(`${gateway.ready}/v1/sessions/${t.result!.session_id}`)).json()) as { counts: { llm_calls: number }; lost_calls: { count: number } };
    expect(session.counts.llm_calls).toBe(1);
    expect(session.lost_calls.count).toBe(0);
  }, 90_000);


  it("cannot have its rollout set aside as lost by sending its session a request the gateway drops: it is scored, on its first attempt", async () => {
    const res = await fetch(`${gateway.ready}/v1/tasks`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        instruction: "write 42 to answer.txt",
        agent: { harness: "command", command: ["node", "agent.mjs"] },
        runtime: { isolation: "bwrap", files: { "agent.mjs": AGENT } },
        evaluator: { kind: "file", path: "answer.txt", equals: "42" },
        limits: { timeout_s: 60 },
      }),
    });
    expect(res.status).toBe(202);
    const { id } = (await res.json()) as { id: string };
    const t = await poll(async () => (await (await fetch(`${gateway.ready}/v1/tasks/${id}`)).json()) as TaskRecord, (r) => r.result !== null, 60_000, 200);
    const log = t.result!.agent.log_tail;
    expect(log).toContain("chat 200");
    // It did try: some of its requests were too big for the relay, some reached the gateway.
    const answers = JSON.parse(/answers (.*)/.exec(log)![1]!) as Record<string, number>;
    expect(answers["431"], log).toBeGreaterThan(0);
    expect(answers["400"], log).toBeGreaterThan(0);
    // Scored as what it did (it wrote no answer), not set aside and run again.
    expect(t.status, JSON.stringify(t.result!.error)).toBe("completed");
    expect(t.result!.reward).toBe(0);
    expect(t.attempts).toBe(1);
  }, 90_000);
});
