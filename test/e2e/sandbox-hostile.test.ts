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

const root0 = process.getuid?.() === 0;
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
  worker = await startApp("worker", [], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_GATEWAY_URL: gateway.ready,
    ROLLGATE_WORKER_NAME: "outcome-w",
    // Small caps, which the ordinary agents here stay well within and the hog below runs into.
    ROLLGATE_SANDBOX_MAX_PROCS: "64",
    ROLLGATE_SANDBOX_PROCESS_MEMORY_MB: "256",
    // The capped tmpfs is a root worker's only (quota.ts).
    ...(root0 ? { ROLLGATE_SANDBOX_DISK_MB: "32", ROLLGATE_SANDBOX_INODES: "1000" } : {}),
  });
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

/**
 * Writes its answer, then goes after the worker's resources one after the other: memory, process
 * slots, disk bytes, inodes. Prints how far each got and why it stopped, and exits 1 (it failed).
 */
const HOG_AGENT = `
import json, os, time
out = {}
with open("answer.txt", "w") as f:
    f.write("0.5\\n")
chunks = []
try:
    while len(chunks) < 256:
        chunks.append(bytearray(16 << 20))
except MemoryError:
    out["memory"] = "MemoryError at %d MiB" % (len(chunks) * 16)
chunks = None
kids = []
try:
    while len(kids) < 1000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    out["processes"] = "%s at %d" % (e.strerror, len(kids))
n = 0
try:
    with open("fill", "wb", buffering=0) as f:
        while n < (1 << 30):
            n += f.write(b"x" * (1 << 20))
except OSError as e:
    out["disk"] = "%s at %d MiB" % (e.strerror, n >> 20)
os.mkdir("many")
files = 0
try:
    while files < 100000:
        open("many/%d" % files, "w").close()
        files += 1
except OSError as e:
    out["inodes"] = "%s at %d" % (e.strerror, files)
print("limits " + json.dumps(out), flush=True)
os._exit(1)
`;

describe.skipIf(!sealable)("a hostile agent against the worker's resources", () => {
  it(`a memory hog, a fork bomb${root0 ? ", a disk filler and an inode filler" : " (the disk and inode caps need a root worker)"} end in its sandbox: it is scored on what it left, the outcome says what it ran into, and the worker runs the next rollout`, async () => {
    const t = await submit({
      instruction: "write 0.5 to answer.txt, then take everything",
      agent: { harness: "command", command: ["python3", "hog.py"] },
      runtime: { isolation: "bwrap", network: "host", files: { "hog.py": HOG_AGENT } },
      evaluator: { kind: "command", command: ["bash", "-c", "cat answer.txt"], reward: "last_line_float" },
      limits: { timeout_s: 60 },
    });
    const log = t.result!.agent.log_tail;
    const hit = JSON.parse(/limits (.*)/.exec(log)?.[1] ?? "{}") as Record<string, string>;
    expect(hit.memory, log).toMatch(/^MemoryError at \d+ MiB$/);
    expect(hit.processes, log).toMatch(/^Resource temporarily unavailable at \d+$/);
    if (root0) {
      expect(hit.disk, log).toMatch(/^No space left on device at \d+ MiB$/);
      expect(hit.inodes, log).toMatch(/^No space left on device at \d+$/);
      expect(t.result!.agent.limits_reached).toEqual(["disk", "inodes"]);
    }
    // Scored on what it left, and its failure is its own: not a lost rollout, not run again.
    expect(t.status, JSON.stringify(t.result!.error)).toBe("completed");
    expect(t.result!.reward).toBe(0.5);
    expect(t.result!.agent.exit_code).toBe(1);
    expect(t.attempts).toBe(1);
    // The worker goes on.
    const next = await submit({
      instruction: "write 1",
      agent: { harness: "command", command: ["bash", "-c", "echo 1 > answer.txt"] },
      runtime: { isolation: "bwrap", network: "host" },
      evaluator: { kind: "command", command: ["bash", "-c", "cat answer.txt"], reward: "last_line_float" },
      limits: { timeout_s: 60 },
    });
    expect(next.status, JSON.stringify(next.result!.error)).toBe("completed");
    expect(next.result!.reward).toBe(1);
    expect(next.result!.agent.limits_reached).toBeUndefined();
  }, 120_000);
});
