/**
 * Chaos: a worker SIGKILLed in the narrow windows of a rollout's start, each held open by a real
 * TCP proxy between the worker and the gateway (the worker is killed while its request is held, at
 * a point it cannot be seen from outside otherwise). Whatever the window, the task ends exactly
 * once and no session of it is left open (an open session is one its agent, or anyone with its
 * token, could keep writing into, and one that holds its engine rank's slot).
 */
import type { TaskRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { startHoldingProxy, type HoldingProxy } from "../support/holding-proxy.js";
import { apiClient } from "../support/http.js";
import { poll, terminalTask } from "../support/poll.js";
import { TEST_REDIS_URL, dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";
import { simEngines, startSimAndGateway } from "./support.js";

const prefix = uniquePrefix("chaos-windows");
const procs: StartedChild[] = [];
/** The workers (and extra replicas) of the running test: stopped after it, so the next test's task goes to its own. */
let workers: StartedChild[] = [];
const proxies: HoldingProxy[] = [];
let gatewayUrl = "";
let engineUrl = "";
const api = apiClient(() => gatewayUrl);
let n = 0;

/** A worker on `gateway` (the gateway itself, or a proxy in front of it) that takes one rollout at a time. */
async function worker(gateway = gatewayUrl, env: Record<string, string> = {}): Promise<StartedChild> {
  const w = await startApp("worker", [], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_GATEWAY_URL: gateway,
    ROLLGATE_WORKER_NAME: `ww${n++}`,
    ROLLGATE_WORKER_CONCURRENCY: "1",
    ROLLGATE_JOB_LOCK_MS: "2000",
    ROLLGATE_STALLED_INTERVAL_MS: "1000",
    ...env,
  });
  workers.push(w);
  return w;
}

async function proxy(opts: Parameters<typeof startHoldingProxy>[1], target = gatewayUrl): Promise<HoldingProxy> {
  const p = await startHoldingProxy(target, opts);
  proxies.push(p);
  return p;
}

const task = (command: string) => ({
  instruction: 'Say done.\n#sim: [{"text": "done"}]',
  agent: { harness: "command", command: ["bash", "-c", command] },
  evaluator: { kind: "command", command: ["true"] },
  limits: { timeout_s: 60 },
});

async function submit(body: unknown): Promise<string> {
  const res = await api("/v1/tasks", { body });
  expect(res.status).toBe(202);
  return res.body.id as string;
}

async function sessionState(id: string): Promise<string> {
  return (await api(`/v1/sessions/${id}`)).body.state as string;
}

/** The types of a task's events, in order (the events route is an SSE stream that ends with the task). */
async function eventTypes(id: string): Promise<string[]> {
  const sse = (await api(`/v1/tasks/${id}/events`)).body as string;
  return [...sse.matchAll(/^event: (\S+)$/gm)].map((m) => m[1]!);
}

beforeAll(async () => {
  ({ engineUrl, gatewayUrl } = await startSimAndGateway(prefix, procs));
}, 60_000);

afterEach(async () => {
  await Promise.all(workers.map((w) => stopChild(w.proc, 5_000)));
  workers = [];
});

afterAll(async () => {
  await Promise.all(proxies.map((p) => p.close()));
  await Promise.all(procs.map((p) => stopChild(p.proc, 5_000)));
  await dropPrefix(prefix);
});

describe("a worker killed in a narrow window of a rollout's start", () => {
  it("after the gateway opened its session, before the worker heard back: that session is closed, the task ends once", async () => {
    // The gateway opens the session; its answer (the id and token) never reaches the worker.
    const hold = await proxy({ match: /^POST \/v1\/sessions /, at: "answer" });
    const victim = await worker(hold.url);
    const id = await submit(task("rollgate-example-agent"));
    const answer = await poll(async () => hold.held[0]?.answer ?? "", (a) => a.includes('"token"'), 30_000, 50);
    const heldSession = /"id":"([^"]+)"/.exec(answer)?.[1];
    expect(heldSession, `no session answer was held: ${answer}`).toBeTruthy();
    expect(await sessionState(heldSession!)).toBe("open");
    victim.proc.kill("SIGKILL");

    await worker();
    const r = await terminalTask(api, id, 60_000);
    expect(r.status).toBe("completed");
    expect(r.session_id).not.toBe(heldSession);
    // The session the dead worker never heard of is closed: nothing can write into it any more.
    expect(await sessionState(heldSession!)).toBe("closed");
    expect((await eventTypes(id)).filter((t) => t === "terminal")).toHaveLength(1);
  }, 120_000);

  it("after taking an orphaned attempt back, before closing its session: the next worker closes it, the task ends once", async () => {
    // Attempt 1 runs on a worker that is killed mid-agent.
    const first = await worker();
    const id = await submit(task("sleep 3; rollgate-example-agent"));
    const r1 = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.status === "running", 30_000, 50);
    const orphan = r1.session_id!;
    first.proc.kill("SIGKILL");

    // The worker that takes the task over puts it back to queued, then its close of the orphaned
    // session is held (never reaches the gateway) and it is killed there.
    const hold = await proxy({ match: /^POST \/v1\/sessions\/[^/ ]+\/close/, at: "request" });
    const second = await worker(hold.url);
    await poll(async () => hold.held.length, (k) => k > 0, 30_000, 50);
    expect(hold.held[0]!.request).toContain(orphan);
    second.proc.kill("SIGKILL");

    await worker();
    const r = await terminalTask(api, id, 60_000);
    expect(r.status).toBe("completed");
    expect(r.session_id).not.toBe(orphan);
    expect(await sessionState(orphan)).toBe("closed");
    expect((await eventTypes(id)).filter((t) => t === "terminal")).toHaveLength(1);
  }, 120_000);

  it("while ending a task whose workers kept dying (the job stalled too often): the next worker ends it failed, worker_lost, its session closed", async () => {
    const id = await submit(task("sleep 30; rollgate-example-agent"));
    // Three workers in a row are killed mid-agent: the job has stalled more often than allowed.
    const sessions: string[] = [];
    for (let k = 0; k < 3; k++) {
      const w = await worker();
      const r = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.status === "running" && !sessions.includes(t.session_id!), 30_000, 50);
      sessions.push(r.session_id!);
      w.proc.kill("SIGKILL");
    }
    // The worker that gives the task up is killed as it closes the last attempt's session.
    const hold = await proxy({ match: /^POST \/v1\/sessions\/[^/ ]+\/close/, at: "request" });
    const ender = await worker(hold.url);
    await poll(async () => hold.held.length, (k) => k > 0, 30_000, 50);
    expect(hold.held[0]!.request).toContain(sessions[2]);
    ender.proc.kill("SIGKILL");

    await worker();
    const r = await terminalTask(api, id, 45_000);
    expect(r.status).toBe("failed");
    expect(r.result.error?.kind).toBe("worker_lost");
    for (const s of sessions) expect(await sessionState(s)).toBe("closed");
    expect((await eventTypes(id)).filter((t) => t === "terminal")).toHaveLength(1);
  }, 180_000);

  it("while ending a task whose last attempt failed on infrastructure: the next worker ends it, its session closed", async () => {
    // Submitted through a replica whose jobs get one attempt: the first infrastructure failure is the last.
    const oneShot = await startApp("gateway", ["--port", "0"], {
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: simEngines(engineUrl),
      ROLLGATE_ROLLOUT_ATTEMPTS: "1",
    });
    workers.push(oneShot);
    const res = await fetch(`${oneShot.ready}/v1/tasks`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(task("rollgate-example-agent")) });
    expect(res.status).toBe(202);
    const id = ((await res.json()) as { id: string }).id;
    // The worker's close with the trajectory fails (the gateway, as it sees it, went away): its
    // only attempt is used up. It is killed as it closes the session to give the task up.
    const hold = await proxy({ match: /^POST \/v1\/sessions\/[^/ ]+\/close /, at: "request", reset: /^POST \/v1\/sessions\/[^/ ]+\/close\?/ });
    const ender = await worker(hold.url);
    await poll(async () => hold.held.length, (k) => k > 0, 30_000, 50);
    const session = /\/v1\/sessions\/([^/ ]+)\/close/.exec(hold.held[0]!.request)![1]!;
    ender.proc.kill("SIGKILL");

    await worker();
    const r = await terminalTask(api, id, 45_000);
    expect(["completed", "failed"]).toContain(r.status);
    expect(await sessionState(session)).toBe("closed");
    expect((await eventTypes(id)).filter((t) => t === "terminal")).toHaveLength(1);
  }, 120_000);
});

describe("an attempt failing on infrastructure", () => {
  it("goes back to the queue saying so (not as a lost worker), its session closed; the last one ends the task failed", async () => {
    // Every close that asks for the trajectory fails (the gateway went away, as the worker sees it).
    const resetting = await proxy({ match: /^$never/, at: "request", reset: /^POST \/v1\/sessions\/[^/ ]+\/close\?/ });
    await worker(resetting.url);
    const id = await submit(task("rollgate-example-agent"));
    const r = await terminalTask(api, id, 60_000);
    expect(r.status).toBe("failed");
    expect(r.result.error?.kind).toBe("infrastructure");
    const sse = (await api(`/v1/tasks/${id}/events`)).body as string;
    const retries = [...sse.matchAll(/^event: retrying\ndata: (.*)$/gm)].map((m) => (JSON.parse(m[1]!) as { data: { reason: string; session_id: string } }).data);
    expect(retries.map((d) => d.reason)).toEqual(["infrastructure", "infrastructure"]);
    for (const d of retries) expect(await sessionState(d.session_id)).toBe("closed");
    expect(await sessionState(r.session_id!)).toBe("closed");
  }, 120_000);
});

describe("a gateway replica killed in a narrow window of a cancel", () => {
  it("before it stored the cancelled result of a queued task: the task still ends cancelled and its callback arrives", async () => {
    const trainer = await startTrainer();
    try {
      // No worker yet: the task stays queued.
      const id = await submit({ ...task("rollgate-example-agent"), callback: { url: trainer.url, secret: "s" } });
      // A replica whose Redis connection holds the command that stores the cancelled result (its
      // terminal event) and is killed there.
      const hold = await proxy({ match: /"type":"terminal"/, at: "request", anywhere: true }, TEST_REDIS_URL);
      const replica = await startApp("gateway", ["--port", "0"], {
        ROLLGATE_KEY_PREFIX: prefix,
        ROLLGATE_ENGINES: simEngines(engineUrl),
        REDIS_URL: hold.url.replace(/^http:/, "redis:"),
      });
      workers.push(replica);
      void fetch(`${replica.ready}/v1/tasks/${id}`, { method: "DELETE" }).catch(() => undefined);
      await poll(async () => hold.held.length, (k) => k > 0, 30_000, 50);
      replica.proc.kill("SIGKILL");

      await worker();
      const r = await terminalTask(api, id, 45_000);
      expect(r.status).toBe("cancelled");
      const received = await trainer.waitFor(1, 45_000);
      expect(new Set(received.map((c) => c.headers["x-rollgate-delivery"]))).toEqual(new Set([r.callback.delivery_id]));
    } finally {
      await trainer.close();
    }
  }, 120_000);
});

describe("a worker frozen in a narrow window of a rollout's start", () => {
  it("after marking the task running, before opening its session, thawed after another worker took it over: its late open is refused, nothing runs in it, the task ends once on the other attempt", async () => {
    // The frozen worker's open is held at the proxy, so it reaches the gateway only when released:
    // after the takeover, as a thawed worker's would.
    const hold = await proxy({ match: /^POST \/v1\/sessions /, at: "request" });
    const frozen = await worker(hold.url);
    const id = await submit(task("sleep 3; rollgate-example-agent"));
    await poll(async () => hold.held.length, (k) => k > 0, 30_000, 50);
    const late = ((await api(`/v1/tasks/${id}`)).body as TaskRecord).session_id!;
    expect(late).toBeTruthy();
    frozen.proc.kill("SIGSTOP");

    // Its job lock lapses; another worker takes the task back (closing the session id it was
    // marked running on, never opened) and runs attempt 2 on a session of its own.
    await worker();
    const taken = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.status === "running" && t.session_id !== late, 30_000, 50);
    hold.release();
    frozen.proc.kill("SIGCONT");
    const answer = await poll(async () => hold.held[0]!.answer, (a) => a.includes("\r\n\r\n"), 30_000, 50);
    // The late open is refused: no session under that id, so its agent has nothing to call through.
    expect(answer).toMatch(/^HTTP\/1\.1 409 /);
    expect((await api(`/v1/sessions/${late}`)).status).toBe(404);

    const r = await terminalTask(api, id, 60_000);
    expect(r.status).toBe("completed");
    expect(r.session_id).toBe(taken.session_id);
    expect(r.attempts).toBe(2);
    expect(await sessionState(taken.session_id!)).toBe("closed");
    expect((await eventTypes(id)).filter((t) => t === "terminal")).toHaveLength(1);
    expect(frozen.proc.exitCode).toBeNull();
  }, 120_000);
});

describe("a worker killed after evaluating, before storing the result", () => {
  it("runs the whole rollout again (the sandbox the evaluator scored is gone): one result, scored on the trajectory it is delivered with", async () => {
    // The victim's Redis connection holds the write of its result (its terminal event), after its evaluator ran.
    const hold = await proxy({ match: /"type":"terminal"/, at: "request", anywhere: true }, TEST_REDIS_URL);
    const victim = await worker(gatewayUrl, { REDIS_URL: hold.url.replace(/^http:/, "redis:") });
    const id = await submit(task("rollgate-example-agent"));
    await poll(async () => hold.held.length, (k) => k > 0, 30_000, 50);
    const first = ((await api(`/v1/tasks/${id}`)).body as TaskRecord).session_id!;
    victim.proc.kill("SIGKILL");

    await worker();
    const r = await terminalTask(api, id, 60_000);
    expect(r.status).toBe("completed");
    expect(r.result.reward).not.toBeNull();
    // The result is the second attempt's: its trajectory and the reward its evaluator gave.
    expect(r.attempts).toBe(2);
    expect(r.session_id).not.toBe(first);
    expect(await sessionState(first)).toBe("closed");
    const sse = (await api(`/v1/tasks/${id}/events`)).body as string;
    const evaluated = [...sse.matchAll(/^event: evaluating\ndata: (.*)$/gm)].map((m) => JSON.parse(m[1]!) as { data: Record<string, unknown> });
    // The evaluator ran once per attempt: an evaluator with side effects sees two runs.
    expect(evaluated).toHaveLength(2);
    const retries = [...sse.matchAll(/^event: retrying\ndata: (.*)$/gm)].map((m) => (JSON.parse(m[1]!) as { data: { reason: string } }).data.reason);
    expect(retries).toEqual(["worker_lost"]);
    expect((await eventTypes(id)).filter((t) => t === "terminal")).toHaveLength(1);
  }, 120_000);
});

describe("a gateway replica killed in a narrow window of a submit", () => {
  it("between storing the task and queueing its job: a replica's submit sweep queues it, the task runs and ends once", async () => {
    const id = `strand-${Math.random().toString(36).slice(2, 10)}`;
    // A replica whose Redis connection holds the command that queues the task's job (its data
    // names the task) and is killed there: the task is stored, its job never added.
    const hold = await proxy({ match: new RegExp(`"task_id":"${id}"`), at: "request", anywhere: true }, TEST_REDIS_URL);
    const replica = await startApp("gateway", ["--port", "0"], {
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: simEngines(engineUrl),
      REDIS_URL: hold.url.replace(/^http:/, "redis:"),
    });
    workers.push(replica);
    void fetch(`${replica.ready}/v1/tasks`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...task("rollgate-example-agent"), id }) }).catch(() => undefined);
    await poll(async () => hold.held.length, (k) => k > 0, 30_000, 50);
    replica.proc.kill("SIGKILL");
    expect((await api(`/v1/tasks/${id}`)).body.status).toBe("queued");

    // A worker, and a replica whose sweep runs often (the suite's first gateway sweeps at the defaults).
    await worker();
    const healer = await startApp("gateway", ["--port", "0"], {
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: simEngines(engineUrl),
      ROLLGATE_SUBMIT_SWEEP_MS: "500",
      ROLLGATE_SUBMIT_GRACE_MS: "2000",
    });
    workers.push(healer);
    const r = await terminalTask(api, id, 25_000);
    expect(r.status).toBe("completed");
    expect(r.attempts).toBe(1);
    expect((await eventTypes(id)).filter((t) => t === "terminal")).toHaveLength(1);
    // Listed as a submitted task is.
    const listed = (await api(`/v1/tasks?limit=50`)).body as { tasks: TaskRecord[] };
    expect(listed.tasks.map((t) => t.id)).toContain(id);
  }, 90_000);
});

describe("a worker killed while giving up a callback delivery", () => {
  it("whose workers kept dying mid-delivery: the next worker marks it failed, never left pending", async () => {
    // A trainer that takes each delivery and never answers: every worker is killed while it delivers.
    const seen: string[] = [];
    const trainer = http.createServer((req) => {
      req.resume();
      req.on("end", () => seen.push(String(req.headers["x-rollgate-delivery"])));
    });
    await new Promise<void>((r) => trainer.listen(0, "127.0.0.1", r));
    const fast = { ROLLGATE_JOB_LOCK_MS: "1000", ROLLGATE_STALLED_INTERVAL_MS: "500" };
    try {
      const url = `http://127.0.0.1:${(trainer.address() as AddressInfo).port}/rollouts`;
      const id = await submit({ ...task("rollgate-example-agent"), callback: { url, secret: "s" } });
      // Eleven workers in a row are killed mid-delivery: more than the ten stalls a delivery may have.
      let victim = await worker(gatewayUrl, fast);
      for (let k = 1; k <= 11; k++) {
        await poll(async () => seen.length, (c) => c >= k, 60_000, 50);
        victim.proc.kill("SIGKILL");
        if (k < 11) victim = await worker(gatewayUrl, fast);
      }
      // The worker that gives the delivery up is killed as it writes the `failed` state.
      const hold = await proxy({ match: /"state":"failed"/, at: "request", anywhere: true }, TEST_REDIS_URL);
      const ender = await worker(gatewayUrl, { ...fast, REDIS_URL: hold.url.replace(/^http:/, "redis:") });
      expect(await poll(async () => hold.held.length, (k) => k > 0, 60_000, 50)).toBe(1);
      ender.proc.kill("SIGKILL");

      await worker(gatewayUrl, fast);
      const done = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (t) => t.callback.state !== "pending", 45_000, 200);
      expect(done.callback.state).toBe("failed");
      expect(done.callback.last_error).toMatch(/lost/);
      expect(new Set(seen)).toEqual(new Set([done.callback.delivery_id]));
    } finally {
      await new Promise<void>((r) => {
        trainer.closeAllConnections();
        trainer.close(() => r());
      });
    }
  }, 240_000);
});
