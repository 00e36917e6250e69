/**
 * The worker's gateway client against the real gateway (its built app, as a process on a free
 * port, on the real Redis): what it refuses (4xx) fails a task at once, what fails on the
 * gateway's side or never answers (5xx, transport) is retried. Decided by status and the error
 * type the gateway sends, never by message text.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { randomUUID } from "node:crypto";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { GatewayClient, GatewayRefused, GatewayUnavailable, classifyAnswer } from "./gateway-client.js";

const REDIS_URL = process.env.REDIS_URL || "redis://127.0.0.1:6379";
const GATEWAY_MAIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../gateway/dist/main.js");
const prefix = `test-gwclient-${randomUUID().slice(0, 8)}`;
const KEY = "worker-key";
let proc: ChildProcess;
let url = "";

beforeAll(async () => {
  // An engine that never answers, probed often: its only rank is drained within a second, so
  // opening a session is the gateway's own 503.
  proc = spawn(process.execPath, [GATEWAY_MAIN, "--port", "0"], {
    env: {
      ...process.env,
      REDIS_URL,
      LOG_LEVEL: "warn",
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_API_KEY: KEY,
      ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1, model: "m" }]),
      ROLLGATE_HEALTH_INTERVAL_S: "0.2",
      ROLLGATE_HEALTH_FAILURES: "1",
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  url = await new Promise<string>((resolve, reject) => {
    readline.createInterface({ input: proc.stdout! }).on("line", (l) => {
      const m = /^gateway ready: (\S+)/.exec(l);
      if (m) resolve(m[1]!);
    });
    proc.once("exit", (code) => reject(new Error(`gateway exited (${code})`)));
  });
}, 30_000);

afterAll(async () => {
  await new Promise<void>((resolve) => {
    if (proc.exitCode !== null) return resolve();
    proc.once("exit", () => resolve());
    proc.kill("SIGTERM");
  });
  const redis = new Redis(REDIS_URL);
  for (const pattern of [`${prefix}:*`, `{${prefix}:*`]) {
    const found = await redis.keys(pattern);
    if (found.length) await redis.del(...found);
  }
  redis.disconnect();
});

async function failure(p: Promise<unknown>): Promise<GatewayRefused | GatewayUnavailable> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  );
  if (!(err instanceof GatewayRefused) && !(err instanceof GatewayUnavailable)) throw new Error(`expected a gateway error, got ${String(err)}`);
  return err;
}

describe("GatewayClient", () => {
  it("a wrong API key is refused (401, unauthorized): not retried", async () => {
    const err = await failure(new GatewayClient(url, "wrong").session("s-1"));
    expect(err).toBeInstanceOf(GatewayRefused);
    expect(err).toMatchObject({ status: 401, code: "unauthorized" });
    expect(err.message).toMatch(/^GET \/v1\/sessions\/s-1 answered 401 \(unauthorized: /);
  });

  it("a bad request and an unknown session are refused with the gateway's status and error type", async () => {
    const client = new GatewayClient(url, KEY);
    const bad = await failure(client.openSession({ sampling: { temperature: "hot" } } as never));
    expect(bad).toBeInstanceOf(GatewayRefused);
    expect(bad).toMatchObject({ status: 400, code: "invalid_request" });
    const missing = await failure(client.closeSession("no-such-session"));
    expect(missing).toMatchObject({ status: 404, code: "not_found" });
  });

  it("the gateway failing on its side (5xx) and a gateway nobody answers for are unavailable: retried", async () => {
    const client = new GatewayClient(url, KEY);
    // Once the only rank is drained, there is no rank to open a session on.
    const deadline = Date.now() + 10_000;
    let err: unknown = null;
    while (Date.now() < deadline) {
      err = await client.openSession({}).then(
        () => null,
        (e: unknown) => e,
      );
      if (err instanceof GatewayUnavailable) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(err).toBeInstanceOf(GatewayUnavailable);
    expect(err).toMatchObject({ status: 503, code: "no_engine" });
    const nobody = await failure(new GatewayClient("http://127.0.0.1:9", KEY).session("s-1"));
    expect(nobody).toBeInstanceOf(GatewayUnavailable);
    expect(nobody.status).toBeNull();
    expect(nobody.message).toMatch(/unreachable/);
  });

  it("reads /readyz whether the gateway is ready or not", async () => {
    const r = await new GatewayClient(url, undefined).readiness();
    expect(r.status).toBe("unavailable");
    expect(r.engines[0]).toMatchObject({ ready: false, url: "http://127.0.0.1:9" });
  });
});

describe("GatewayClient with an answer it cannot use", () => {
  // A server that answers 200/201 with whatever body the test sets: what a broken or foreign
  // gateway could send. The worker never crashes on it: each is a GatewayRefused (bad_response)
  // naming what is wrong, which fails the task with the reason instead of losing the rollout.
  let body = "";
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(req.method === "POST" && req.url === "/v1/sessions" ? 201 : 200, { "content-type": "application/json" });
      res.end(body);
    });
  });
  let base = "";
  beforeAll(async () => {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const stats = { records: 1, traces: 1, response_tokens: 3, trainable_tokens: 3, breaks: [], weight_versions: [], merged_records: 0, weight_changes: 0, traces_with_weight_change: 0, per_trace: [], failed_calls: [], lost_calls: { count: 0, first: null } };
  const session = { id: "s-1", state: "closed", counts: { llm_calls: 1, prompt_tokens: 2, completion_tokens: 3, cached_tokens: 0 }, lost_calls: { count: 0, first: null }, replay_diverged: null };

  it("a body that is not JSON, or lacks or mistypes a field the worker reads, is refused as bad_response, naming the field", async () => {
    const client = new GatewayClient(base, undefined);
    const cases: [string, () => Promise<unknown>, RegExp][] = [
      ["<html>oops</html>", () => client.openSession({}), /^POST \/v1\/sessions answered 201 with a body that is not JSON: <html>oops/],
      [JSON.stringify({ id: 5, token: "t", base_url: "u" }), () => client.openSession({}), /cannot read: id: Invalid input: expected string, received number$/],
      [JSON.stringify([]), () => client.session("s-1"), /cannot read: body: Invalid input: expected object, received array$/],
      [JSON.stringify({ ...session, lost_calls: { count: "1", first: null } }), () => client.session("s-1"), /cannot read: lost_calls\.count: Invalid input: expected number, received string$/],
      [JSON.stringify({ ...session, counts: { ...session.counts, llm_calls: null } }), () => client.closeSession("s-1"), /cannot read: counts\.llm_calls: Invalid input: expected number, received null$/],
      [JSON.stringify({ ...session, trajectory: { builder: "per_request", traces: {}, stats } }), () => client.closeSession("s-1", "per_request"), /cannot read: trajectory\.traces: Invalid input: expected array, received object$/],
      [JSON.stringify({ ...session, trajectory_error: "broken" }), () => client.closeSession("s-1", "per_request"), /cannot read: trajectory_error: Invalid input: expected object, received string$/],
      [JSON.stringify({ builder: "per_request", traces: [] }), () => client.trajectory("s-1", "per_request"), /cannot read: stats: Invalid input: expected object, received undefined$/],
    ];
    for (const [answer, call, message] of cases) {
      body = answer;
      const err = await failure(call());
      expect(err).toBeInstanceOf(GatewayRefused);
      expect(err).toMatchObject({ code: "bad_response" });
      expect(err.message).toMatch(message);
    }
  });

  it("a usable answer is passed on as the gateway sent it; what an older gateway leaves out gets the protocol's default", async () => {
    const client = new GatewayClient(base, undefined);
    // The traces are passed on as the gateway built them (not walked again), the fields read are checked.
    const trajectory = { builder: "per_request", traces: [{ kind: "main", tokens: [1, 2, 3] }], stats };
    body = JSON.stringify({ ...session, trajectory });
    expect(await client.closeSession("s-1", "per_request")).toEqual({ ...session, trajectory });
    // Byte for byte (the stored result, and so the signed callback body, is its JSON): the keys in
    // the order the gateway sent them, which is the protocol's (builder, traces, stats, tree).
    const tree = { root: 0 };
    const withTree = { ...trajectory, tree };
    body = JSON.stringify({ ...session, trajectory: withTree });
    expect(JSON.stringify((await client.closeSession("s-1", "per_request")).trajectory)).toBe(JSON.stringify(withTree));
    body = JSON.stringify(withTree);
    expect(JSON.stringify(await client.trajectory("s-1", "per_request"))).toBe(JSON.stringify(withTree));
    const { lost_calls: _l, replay_diverged: _r, ...old } = session;
    body = JSON.stringify(old);
    expect(await client.session("s-1")).toMatchObject({ lost_calls: { count: 0, first: null }, replay_diverged: null });
  });
});

describe("classifyAnswer", () => {
  it("sorts by status; the code comes from the error envelope, and a body that has none is quoted", () => {
    expect(classifyAnswer("GET /x", 502, "<html>bad gateway</html>")).toMatchObject({ name: "GatewayUnavailable", status: 502, code: null, message: "GET /x answered 502 (<html>bad gateway</html>)" });
    expect(classifyAnswer("POST /y", 409, '{"error":{"type":"conflict","message":"session s exists"}}')).toMatchObject({
      name: "GatewayRefused",
      status: 409,
      code: "conflict",
      message: "POST /y answered 409 (conflict: session s exists)",
    });
    expect(classifyAnswer("GET /z", 503, "")).toBeInstanceOf(GatewayUnavailable);
  });
});
