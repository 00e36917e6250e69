/**
 * The bytes of agent bodies a gateway holds at once (ops/body-budget.ts): the queue itself, then a
 * listening gateway on a real socket (engine-sim with a slow first token, so a call stays held,
 * real Redis): a body past the budget waits unread until an earlier call's answer ends and is then
 * answered; a body that never finishes arriving is cut off after the timeout and gives its bytes
 * back; an agent that leaves while its call waits takes its place in the queue with it.
 */
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Harness, startHarness } from "./__fixtures__/harness.js";
import { BodyBudget, bodyBytes } from "./ops/body-budget.js";

const MiB = 2 ** 20;

describe("BodyBudget", () => {
  it("grants bytes first come first served: a small body does not overtake a large one waiting", () => {
    const budget = new BodyBudget(100, 60, 60_000);
    const order: string[] = [];
    budget.reserve(60, () => order.push("a"));
    budget.reserve(60, () => order.push("b"));
    budget.reserve(10, () => order.push("c"));
    expect(order).toEqual(["a"]);
    expect(budget.queued).toBe(2);
    budget.release(60);
    expect(order).toEqual(["a", "b", "c"]);
    expect(budget.inUse).toBe(70);
  });

  it("a waiter that leaves no longer holds back those behind it", () => {
    const budget = new BodyBudget(100, 100, 60_000);
    const order: string[] = [];
    budget.reserve(50, () => order.push("a"));
    const leaveB = budget.reserve(100, () => order.push("b"));
    budget.reserve(40, () => order.push("c"));
    leaveB();
    expect(order).toEqual(["a", "c"]);
    expect(budget.queued).toBe(0);
  });

  it("refuses a budget below the largest body", () => {
    expect(() => new BodyBudget(10, 64, 1_000)).toThrow(/below the largest body/);
  });

  it("sizes a body by content-length, a chunked one at the largest a body may be, none at 0", () => {
    expect(bodyBytes({ "content-length": "1234" }, 100 * MiB)).toBe(1234);
    expect(bodyBytes({ "transfer-encoding": "chunked" }, 100 * MiB)).toBe(100 * MiB);
    expect(bodyBytes({}, 100 * MiB)).toBe(0);
    // Over the limit: Fastify answers 413 without reading it, so it holds nothing.
    expect(bodyBytes({ "content-length": String(200 * MiB) }, 100 * MiB)).toBe(0);
  });
});

let h: Harness;
let session: { id: string; token: string; urls: { openai: string } };
/** A second gateway whose bodies must arrive within a second (the first's take their time: 40 MiB in this process). */
let slow: Harness;

beforeAll(async () => {
  // The smallest budget there is: one largest body.
  [h, slow] = await Promise.all([
    // Each call stays 3 s at the engine: long enough for a loaded machine to see it there.
    // No health rounds: a round that probes the engine again runs engine calls of its own, and the
    // tests count the calls running at the engine.
    startHarness("body-budget", { ttftMs: 3_000 }, { ROLLGATE_AGENT_BODY_BUDGET_MB: "64", ROLLGATE_HEALTH_INTERVAL_S: "0" }),
    startHarness("body-timeout", {}, { ROLLGATE_AGENT_BODY_TIMEOUT_S: "1" }),
  ]);
  session = await h.openSession();
});
afterAll(async () => {
  await Promise.all([h?.close(), slow?.close()]);
});

async function metric(name: string, gateway = h): Promise<number> {
  const text = await (await fetch(`${gateway.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  if (!line) throw new Error(`no metric ${name}`);
  return Number(line.split(" ")[1]);
}

async function until(what: string, check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

async function running(): Promise<number> {
  const stats = (await (await fetch(`${await simUrl()}/sim/stats`)).json()) as { ranks: { running: number }[] };
  return stats.ranks[0]!.running;
}
async function simUrl(): Promise<string> {
  const addr = h.sim.server.address();
  if (!addr || typeof addr === "string") throw new Error("engine-sim is not listening");
  return `http://127.0.0.1:${addr.port}`;
}

/** A chat call whose JSON is padded with whitespace to `bytes` (what the gateway parses is small). */
function paddedBody(bytes: number): string {
  const json = JSON.stringify({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "hi" }] });
  return json.slice(0, -1) + " ".repeat(bytes - json.length) + "}";
}

/** An OpenAI chat call with its body padded to `bytes` on the wire (raw HTTP: an SDK sends what it serialises). */
function call(bytes: number, signal?: AbortSignal): Promise<Response> {
  return fetch(`${session.urls.openai}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${session.token}`, "content-type": "application/json" },
    body: paddedBody(bytes),
    ...(signal ? { signal } : {}),
  });
}

describe("a gateway's agent body budget", () => {
  it("holds a call whose body does not fit, unread, until an earlier call's answer ends; both are answered", async () => {
    // The gateway's first call on an engine probes it (engine calls of its own): done with first.
    expect((await call(1_000)).status).toBe(200);
    await until("the probes done", async () => (await running()) === 0);
    const first = call(40 * MiB);
    await until("the first call at the engine", async () => (await running()) === 1);
    const second = call(40 * MiB);
    await until("the second call waiting", async () => (await metric("rollgate_agent_calls_waiting_for_body_budget")) === 1);
    expect(await metric("rollgate_agent_body_bytes")).toBe(40 * MiB);
    // While the first is at the engine the second never reaches it.
    expect(await running()).toBe(1);
    const answers = await Promise.all([first, second]);
    for (const a of answers) {
      expect(a.status).toBe(200);
      expect(((await a.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content).toBeTruthy();
    }
    await until("every byte given back", async () => (await metric("rollgate_agent_body_bytes")) === 0);
    expect(await metric("rollgate_agent_calls_waiting_for_body_budget")).toBe(0);
    expect(await metric("rollgate_agent_body_timeouts_total")).toBe(0);
    expect(await h.records(session.id)).toHaveLength(3);
  });

  it("closes a connection whose body stops arriving, gives its bytes back, and records no call", async () => {
    const { id, token } = await slow.openSession();
    const port = Number(new URL(slow.url).port);
    const sock = net.connect(port, "127.0.0.1");
    const closed = new Promise<void>((resolve) => sock.on("close", () => resolve()));
    sock.on("error", () => undefined);
    sock.write(`POST /s/${id}/v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{"mod`);
    await until("the body's bytes held", async () => (await metric("rollgate_agent_body_bytes", slow)) === 5000);
    await closed;
    expect(await metric("rollgate_agent_body_timeouts_total", slow)).toBe(1);
    expect(await metric("rollgate_agent_body_bytes", slow)).toBe(0);
    expect(await slow.records(id)).toHaveLength(0);
    const state = (await (await fetch(`${slow.url}/v1/sessions/${id}`)).json()) as { lost_calls: { count: number } };
    expect(state.lost_calls.count).toBe(0);
  });

  it("a path that spells /s/ percent-encoded reaches the same route and waits its turn too", async () => {
    const first = call(40 * MiB);
    await until("the first call at the engine", async () => (await running()) === 1);
    // Fastify decodes the path before routing: "/%73/<sid>/…" is the agent route of "/s/<sid>/…".
    const encoded = fetch(`${session.urls.openai.replace("/s/", "/%73/")}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${session.token}`, "content-type": "application/json" },
      body: paddedBody(40 * MiB),
    });
    await until("the encoded call waiting", async () => (await metric("rollgate_agent_calls_waiting_for_body_budget")) === 1);
    expect(await running()).toBe(1);
    const answers = await Promise.all([first, encoded]);
    expect(answers.map((a) => a.status)).toEqual([200, 200]);
    await until("every byte given back", async () => (await metric("rollgate_agent_body_bytes")) === 0);
  });

  it("a connection that closes with pipelined calls still queued behind its first gives back every call's bytes, and both calls are left", async () => {
    const port = Number(new URL(h.url).port);
    const own = await h.openSession();
    const body = paddedBody(1_000);
    const head = `POST /s/${own.id}/v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer ${own.token}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`;
    const sock = net.connect(port, "127.0.0.1");
    sock.on("error", () => undefined);
    // Two calls in one write (HTTP/1.1 pipelining): the second's answer queues behind the first's.
    sock.write(head + body + head + body);
    await until("both bodies held", async () => (await metric("rollgate_agent_body_bytes")) === 2_000);
    await until("both calls at the engine", async () => (await running()) === 2);
    sock.destroy();
    // Both calls end (the first's answer has nowhere to go, the second's was queued on a closed connection).
    await until("every byte given back", async () => (await metric("rollgate_agent_body_bytes")) === 0);
    // Neither answer can reach the agent: both engine calls are cancelled and neither is recorded
    // (a recorded answer the agent never saw would be a turn of its trajectory it never took).
    await until("the engine idle", async () => (await running()) === 0);
    expect(await h.records(own.id)).toHaveLength(0);
    // The budget still takes a call that needs all of it.
    expect((await call(64 * MiB - 1_000)).status).toBe(200);
  });

  it("a chunked body holds the largest a body may be only until it has arrived: then its own bytes, and a call beside it is not held back", async () => {
    // A chunked body's size is known only once it has arrived: held at the largest a body may be
    // (the whole budget here) for the whole of its call, every other agent call on the gateway
    // waited for its answer (one sandbox sending its small bodies chunked stalled all the others).
    await until("the engine idle", async () => (await running()) === 0);
    const port = Number(new URL(h.url).port);
    const body = paddedBody(1_000);
    const sock = net.connect(port, "127.0.0.1");
    sock.on("error", () => undefined);
    let answer = "";
    sock.on("data", (d: Buffer) => (answer += d.toString()));
    const chunk = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
    sock.write(`POST /s/${session.id}/v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer ${session.token}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n${chunk}`);
    await until("the chunked call at the engine", async () => (await running()) === 1);
    await until("its bytes held as they came", async () => (await metric("rollgate_agent_body_bytes")) === body.length);
    const beside = call(1_000);
    await until("the call beside it at the engine", async () => (await running()) === 2);
    expect((await beside).status).toBe(200);
    await until("the chunked call answered", async () => answer.startsWith("HTTP/1.1 200") && answer.includes("chat.completion"));
    sock.destroy();
    await until("every byte given back", async () => (await metric("rollgate_agent_body_bytes")) === 0);
  });

  it("an agent that leaves while its call waits leaves the queue", async () => {
    const first = call(40 * MiB);
    await until("the first call at the engine", async () => (await running()) === 1);
    const leaving = new AbortController();
    call(40 * MiB, leaving.signal).catch(() => undefined);
    await until("the second call waiting", async () => (await metric("rollgate_agent_calls_waiting_for_body_budget")) === 1);
    leaving.abort();
    await until("the queue empty", async () => (await metric("rollgate_agent_calls_waiting_for_body_budget")) === 0);
    expect((await first).status).toBe(200);
    await until("every byte given back", async () => (await metric("rollgate_agent_body_bytes")) === 0);
  });
});
