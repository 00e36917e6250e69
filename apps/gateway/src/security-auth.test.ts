/**
 * Authentication and isolation, in-process (Fastify inject, in-process engine-sim, real Redis):
 * a session token reaches its own session and nothing else, on every agent route and protocol,
 * in every place SDKs put a key, whatever session id is guessed; trainer and admin routes need the
 * API key when one is configured (and a session token is not one); comparisons are constant-time;
 * no token or key reaches a log line; the per-session rate limit answers 429 in each protocol.
 */
import { randomUUID } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { Writable } from "node:stream";
import { buildEngineSim } from "@rollgate/engine-sim";
import { secretsEqual } from "@rollgate/protocol";
import fc from "fast-check";
import type { FastifyInstance, InjectOptions } from "fastify";
import { Redis } from "ioredis";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildGateway } from "./app.js";
import { GatewayEnv } from "./env.js";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const API_KEY = `rk-${randomUUID()}`;
const prefixes: string[] = [];
let sim: FastifyInstance;
let simUrl = "";
let logText = "";

async function gateway(extra: Record<string, string> = {}, prefix = `test-sec-${randomUUID().slice(0, 8)}`): Promise<FastifyInstance> {
  prefixes.push(prefix);
  const env = GatewayEnv.parse({
    REDIS_URL,
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: simUrl, dp_size: 2 }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0",
    LOG_LEVEL: "debug",
    ...extra,
  });
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      logText += chunk.toString("utf8");
      done();
    },
  });
  return buildGateway({ env, logger: pino({ level: "debug" }, stream) });
}

beforeAll(async () => {
  sim = buildEngineSim({ dpSize: 2, model: "Qwen/Qwen3-8B", randomTokens: 4 });
  await sim.listen({ port: 0, host: "127.0.0.1" });
  const addr = sim.server.address();
  simUrl = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
});

afterAll(async () => {
  await sim.close();
  const redis = new Redis(REDIS_URL);
  for (const p of prefixes) {
    const found = [...(await redis.keys(`${p}:*`)), ...(await redis.keys(`{${p}:*`))];
    if (found.length) await redis.del(...found);
  }
  redis.disconnect();
});

type Sess = { id: string; token: string };
const key = { authorization: `Bearer ${API_KEY}` };

async function open(app: FastifyInstance, headers: Record<string, string> = key): Promise<Sess> {
  const res = await app.inject({ method: "POST", url: "/v1/sessions", headers, payload: {} });
  expect(res.statusCode).toBe(201);
  return res.json() as Sess;
}

type Family = "openai" | "anthropic" | "gemini";
interface AgentRoute {
  name: string;
  family: Family;
  method: "GET" | "POST";
  path: (sid: string) => string;
  body?: unknown;
}
const chat = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 4 };
const anthropic = { model: "m", max_tokens: 4, messages: [{ role: "user", content: "hi" }] };
const gemini = { contents: [{ role: "user", parts: [{ text: "hi" }] }], generationConfig: { maxOutputTokens: 4 } };
const AGENT_ROUTES: AgentRoute[] = [
  { name: "chat", family: "openai", method: "POST", path: (s) => `/s/${s}/v1/chat/completions`, body: chat },
  { name: "chat stream", family: "openai", method: "POST", path: (s) => `/s/${s}/v1/chat/completions`, body: { ...chat, stream: true } },
  { name: "responses", family: "openai", method: "POST", path: (s) => `/s/${s}/v1/responses`, body: { model: "m", input: "hi", max_output_tokens: 4 } },
  { name: "models", family: "openai", method: "GET", path: (s) => `/s/${s}/v1/models` },
  { name: "messages", family: "anthropic", method: "POST", path: (s) => `/s/${s}/v1/messages`, body: anthropic },
  { name: "count_tokens", family: "anthropic", method: "POST", path: (s) => `/s/${s}/v1/messages/count_tokens`, body: anthropic },
  { name: "generateContent", family: "gemini", method: "POST", path: (s) => `/s/${s}/v1beta/models/m:generateContent`, body: gemini },
  { name: "streamGenerateContent", family: "gemini", method: "POST", path: (s) => `/s/${s}/v1beta/models/m:streamGenerateContent?alt=sse`, body: gemini },
  { name: "countTokens", family: "gemini", method: "POST", path: (s) => `/s/${s}/v1beta/models/m:countTokens`, body: gemini },
  { name: "v1 generateContent", family: "gemini", method: "POST", path: (s) => `/s/${s}/v1/models/m:generateContent`, body: gemini },
  { name: "gemini models", family: "gemini", method: "GET", path: (s) => `/s/${s}/v1beta/models` },
  { name: "gemini model", family: "gemini", method: "GET", path: (s) => `/s/${s}/v1beta/models/m` },
];

/** The places an SDK puts its key. */
const PLACES: [string, (t: string) => { headers: Record<string, string>; query: string }][] = [
  ["Authorization: Bearer", (t) => ({ headers: { authorization: `Bearer ${t}` }, query: "" })],
  ["x-api-key", (t) => ({ headers: { "x-api-key": t }, query: "" })],
  ["x-goog-api-key", (t) => ({ headers: { "x-goog-api-key": t }, query: "" })],
  ["?key=", (t) => ({ headers: {}, query: `key=${encodeURIComponent(t)}` })],
];

function call(app: FastifyInstance, r: AgentRoute, sid: string, place: ReturnType<(typeof PLACES)[number][1]>) {
  const path = r.path(sid);
  const url = place.query ? `${path}${path.includes("?") ? "&" : "?"}${place.query}` : path;
  const opts: InjectOptions = { method: r.method, url, headers: { ...place.headers, ...(r.body ? { "content-type": "application/json" } : {}) } };
  if (r.body) opts.payload = JSON.stringify(r.body);
  return app.inject(opts);
}

function expectAuthError(family: Family, status: number, res: { statusCode: number; json: () => unknown }) {
  expect(res.statusCode).toBe(status);
  const b = res.json() as { type?: string; error: { type?: string; message: string; code?: unknown; status?: string } };
  if (family === "openai") expect(b.error).toMatchObject({ type: status === 401 ? "authentication_error" : "permission_error", code: expect.any(String) });
  if (family === "anthropic") expect(b).toMatchObject({ type: "error", error: { type: status === 401 ? "authentication_error" : "permission_error" } });
  if (family === "gemini") expect(b.error).toMatchObject({ code: status, status: status === 401 ? "UNAUTHENTICATED" : "PERMISSION_DENIED" });
  expect(b.error.message).toBeTruthy();
}

describe("a session token reaches only its own session", () => {
  let app: FastifyInstance;
  let a: Sess;
  let b: Sess;
  beforeAll(async () => {
    app = await gateway({ ROLLGATE_API_KEY: API_KEY });
    a = await open(app);
    b = await open(app);
  });
  afterAll(() => app.close());

  it("its own token works in every place, on every route", async () => {
    for (const r of AGENT_ROUTES) {
      // Google SDKs send x-goog-api-key or ?key=; OpenAI and Anthropic send Bearer / x-api-key: each place works on each route.
      for (const [place, make] of PLACES) {
        if (place === "?key=" && r.family !== "gemini") continue;
        const res = await call(app, r, a.id, make(a.token));
        expect(res.statusCode, `${r.name} via ${place}: ${res.body.slice(0, 200)}`).toBe(200);
      }
    }
  }, 60_000);

  it("another session's token, no token, an empty or mangled token: 401 in the route's protocol, and the other session is untouched", async () => {
    const before = (await app.inject({ url: `/v1/sessions/${b.id}`, headers: key })).json() as { counts: { llm_calls: number } };
    const tokens = [a.token, "", " ", `${b.token}x`, b.token.slice(0, -1), b.token.toUpperCase(), API_KEY, `Bearer ${b.token}`];
    for (const r of AGENT_ROUTES) {
      for (const [, make] of PLACES) {
        for (const t of tokens) {
          const res = await call(app, r, b.id, make(t));
          expectAuthError(r.family, 401, res);
        }
      }
      const none = await call(app, r, b.id, { headers: {}, query: "" });
      expectAuthError(r.family, 401, none);
    }
    const after = (await app.inject({ url: `/v1/sessions/${b.id}`, headers: key })).json() as { counts: { llm_calls: number } };
    expect(after.counts.llm_calls).toBe(before.counts.llm_calls);
    const recs = (await app.inject({ url: `/v1/sessions/${b.id}/completions`, headers: key })).json() as { completions: unknown[] };
    expect(recs.completions).toHaveLength(0);
  }, 60_000);

  it("an unknown session and a wrong token answer the same bytes (no oracle for guessing ids)", async () => {
    for (const r of AGENT_ROUTES.filter((x) => !x.name.includes("stream"))) {
      const unknown = await call(app, r, `s-${randomUUID()}`, PLACES[0]![1](a.token));
      const wrong = await call(app, r, b.id, PLACES[0]![1](a.token));
      expect(unknown.statusCode).toBe(401);
      expect(unknown.body).toBe(wrong.body);
    }
  });

  it("guessed and mangled session ids with a valid token never reach another session (fast-check)", async () => {
    const variants = (id: string) => [id.toUpperCase(), ` ${id}`, `${id}%20`, `${id}/`, `${id}%2F..%2F${a.id}`, encodeURIComponent(id), `${id}%00`, `..%2F${id}`];
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(fc.string({ minLength: 1, maxLength: 60 }).map(encodeURIComponent), fc.constantFrom(...variants(b.id)), fc.uuid().map((u) => `s-${u}`)),
        fc.constantFrom(...AGENT_ROUTES),
        async (sid, r) => {
          const res = await call(app, r, sid, PLACES[0]![1](a.token));
          // None of these ids is the caller's own session: nothing may answer 200.
          expect(res.statusCode, `${r.name} /s/${sid}`).not.toBe(200);
          expect(res.statusCode).toBeLessThan(500);
        },
      ),
      { numRuns: 300, seed: 4242 },
    );
    const recs = (await app.inject({ url: `/v1/sessions/${b.id}/completions`, headers: key })).json() as { completions: unknown[] };
    expect(recs.completions).toHaveLength(0);
  }, 60_000);

  it("a closed session refuses its own token (403) and still answers 401 to others", async () => {
    const c = await open(app);
    await app.inject({ method: "POST", url: `/v1/sessions/${c.id}/close`, headers: key });
    for (const r of AGENT_ROUTES) {
      expectAuthError(r.family, 403, await call(app, r, c.id, PLACES[0]![1](c.token)));
      expectAuthError(r.family, 401, await call(app, r, c.id, PLACES[0]![1](a.token)));
    }
  });
});

/** Every trainer and admin route (checked against the OpenAPI document, so a new route must be listed here). */
const TRAINER_ROUTES: { method: "GET" | "POST" | "DELETE"; url: string; doc?: string }[] = [
  { method: "POST", url: "/v1/tasks", doc: "/v1/tasks" },
  { method: "GET", url: "/v1/tasks", doc: "/v1/tasks" },
  { method: "POST", url: "/v1/tasks/batch", doc: "/v1/tasks/batch" },
  { method: "POST", url: "/v1/tasks/t-x/branches", doc: "/v1/tasks/{id}/branches" },
  { method: "GET", url: "/v1/tasks/t-x", doc: "/v1/tasks/{id}" },
  { method: "DELETE", url: "/v1/tasks/t-x", doc: "/v1/tasks/{id}" },
  { method: "GET", url: "/v1/tasks/t-x/events", doc: "/v1/tasks/{id}/events" },
  { method: "GET", url: "/v1/tasks/t-x/logs", doc: "/v1/tasks/{id}/logs" },
  { method: "POST", url: "/v1/sessions", doc: "/v1/sessions" },
  { method: "GET", url: "/v1/sessions/s-x", doc: "/v1/sessions/{id}" },
  { method: "DELETE", url: "/v1/sessions/s-x", doc: "/v1/sessions/{id}" },
  { method: "POST", url: "/v1/sessions/s-x/close", doc: "/v1/sessions/{id}/close" },
  { method: "GET", url: "/v1/sessions/s-x/completions", doc: "/v1/sessions/{id}/completions" },
  { method: "GET", url: "/v1/sessions/s-x/trajectory", doc: "/v1/sessions/{id}/trajectory" },
  { method: "GET", url: "/v1/sessions/s-x/trajectory/decoded", doc: "/v1/sessions/{id}/trajectory/decoded" },
  { method: "POST", url: "/admin/inference/pause", doc: "/admin/inference/pause" },
  { method: "POST", url: "/admin/inference/resume", doc: "/admin/inference/resume" },
  { method: "GET", url: "/admin/inference", doc: "/admin/inference" },
  { method: "POST", url: "/admin/weights", doc: "/admin/weights" },
  { method: "GET", url: "/admin/weights", doc: "/admin/weights" },
  { method: "POST", url: "/admin/inference/weights", doc: "/admin/inference/weights" },
  { method: "GET", url: "/admin/engines", doc: "/admin/engines" },
  { method: "GET", url: "/admin/queues", doc: "/admin/queues" },
  { method: "GET", url: "/admin/queues/api/queues" },
  { method: "GET", url: "/metrics", doc: "/metrics" },
  { method: "GET", url: "/v1/stats/overview", doc: "/v1/stats/overview" },
  { method: "GET", url: "/v1/stats/groups", doc: "/v1/stats/groups" },
  { method: "GET", url: "/v1/stats/timeseries", doc: "/v1/stats/timeseries" },
  { method: "GET", url: "/v1/stats/ranks", doc: "/v1/stats/ranks" },
];
/** Open on purpose: probes and the dashboard page (it asks for the key). The API reference (/docs, not in its own document) is open too. */
const PUBLIC = new Set(["/healthz", "/readyz", "/dashboard"]);

describe("trainer and admin routes need the API key when one is configured", () => {
  let app: FastifyInstance;
  let s: Sess;
  beforeAll(async () => {
    app = await gateway({ ROLLGATE_API_KEY: API_KEY });
    s = await open(app);
  });
  afterAll(() => app.close());

  it("every documented non-agent route is either listed here or public", async () => {
    const doc = (await app.inject({ url: "/docs/json" })).json() as { paths: Record<string, Record<string, unknown>> };
    const listed = new Set(TRAINER_ROUTES.map((r) => `${r.method} ${r.doc}`));
    for (const [p, ops] of Object.entries(doc.paths)) {
      if (p.startsWith("/s/") || PUBLIC.has(p)) continue;
      for (const m of Object.keys(ops)) expect(listed, `${m.toUpperCase()} ${p} is not in TRAINER_ROUTES`).toContain(`${m.toUpperCase()} ${p}`);
    }
  });

  it("without a key, with a wrong key, with a session token, or with the key elsewhere: 401 in our shape", async () => {
    const wrong: Record<string, string>[] = [
      {},
      { authorization: `Bearer ${API_KEY}x` },
      { authorization: `Bearer ${API_KEY.slice(0, -1)}` },
      { authorization: `Bearer ${s.token}` },
      { authorization: API_KEY },
      { authorization: `Basic ${Buffer.from(`x:${API_KEY}`).toString("base64")}` },
      { "x-api-key": API_KEY },
      { cookie: `rollgate_admin=${API_KEY}` },
    ];
    for (const r of TRAINER_ROUTES) {
      for (const h of wrong) {
        const res = await app.inject({ method: r.method, url: r.url, headers: { ...h, "content-type": "application/json" }, payload: r.method === "POST" ? "{}" : undefined });
        expect(res.statusCode, `${r.method} ${r.url} with ${JSON.stringify(h)}`).toBe(401);
        expect((res.json() as { error: { type: string; message: string } }).error).toMatchObject({ type: "unauthorized", message: expect.stringContaining("API key") });
      }
      // The right key gets past authentication (whatever the route then says).
      const ok = await app.inject({ method: r.method, url: r.method === "GET" && r.url.endsWith("/events") ? "/v1/tasks/t-none/events" : r.url, headers: { ...key, "content-type": "application/json" }, payload: r.method === "POST" ? "{}" : undefined });
      expect(ok.statusCode, `${r.method} ${r.url} with the key`).not.toBe(401);
    }
  }, 60_000);

  it("the public routes stay open", async () => {
    for (const url of PUBLIC) expect((await app.inject({ url })).statusCode, url).toBeLessThan(400);
    expect((await app.inject({ method: "HEAD", url: `/s/${s.id}` })).statusCode).toBe(200);
  });

  it("secrets are compared in constant time (timingSafeEqual on equal-length buffers, never ===)", () => {
    // One helper does it (the protocol's secretsEqual), and every key check goes through it.
    const helper = readFileSync(new URL("../../../packages/protocol/src/secrets.ts", import.meta.url), "utf8");
    expect(helper).toMatch(/export function secretsEqual\(/);
    expect(helper).toMatch(/\.length === \w+\.length && timingSafeEqual\(/);
    expect(secretsEqual("k-1", "k-1")).toBe(true);
    expect(secretsEqual("k-1", "k-2")).toBe(false);
    expect(secretsEqual("k-1", "k-12")).toBe(false);
    const sources = ["auth.ts", "routes/queues.ts"].map((f) => readFileSync(new URL(`./${f}`, import.meta.url), "utf8"));
    for (const src of sources) {
      expect(src).toContain("secretsEqual(");
      expect(src).not.toMatch(/(apiKey|token|key)\s*[!=]==\s*(apiKey|given|token|key)\b/);
    }
    // Session tokens are checked by hash (store): sha256 then the same helper.
    const agent = readFileSync(new URL("./routes/agent-common.ts", import.meta.url), "utf8");
    expect(agent).toContain("tokenMatches(");
    expect(readFileSync(new URL("../../../packages/store/src/sessions.ts", import.meta.url), "utf8")).toContain("secretsEqual(");
    // No second copy of the comparison anywhere in the apps' and packages' sources.
    const root = new URL("../../../", import.meta.url);
    const copies = ["apps", "packages"].flatMap((top) =>
      (readdirSync(new URL(top, root), { recursive: true }) as string[])
        .filter((f) => /\/src\/.*\.ts$/.test(f) && !f.includes("node_modules") && !f.endsWith(".test.ts"))
        .map((f) => `${top}/${f}`)
        .filter((f) => readFileSync(new URL(f, root), "utf8").includes("timingSafeEqual")),
    );
    expect(copies).toEqual(["packages/protocol/src/secrets.ts"]);
  });
});

describe("no token or key in any log line", () => {
  it("after calls on every protocol, in every key place, right and wrong, the logs hold none of them", async () => {
    logText = "";
    const app = await gateway({ ROLLGATE_API_KEY: API_KEY });
    try {
      const a = await open(app);
      const b = await open(app);
      for (const r of AGENT_ROUTES) {
        for (const [, make] of PLACES) {
          await call(app, r, a.id, make(a.token));
          await call(app, r, b.id, make(a.token));
        }
      }
      await app.inject({ url: "/v1/tasks", headers: { authorization: `Bearer ${API_KEY}` } });
      await app.inject({ url: "/v1/tasks", headers: { authorization: `Bearer ${API_KEY}-wrong` } });
      await app.inject({ url: `/admin/queues?key=${API_KEY}`, headers: { accept: "text/html" } });
      expect(logText.length).toBeGreaterThan(1000); // debug: every request was logged
      for (const secret of [a.token, b.token, API_KEY]) expect(logText).not.toContain(secret);
    } finally {
      await app.close();
    }
  }, 60_000);
});

describe("per-session call rate (ROLLGATE_SESSION_RATE)", () => {
  it("allows the burst, then answers 429 in the caller's protocol with retry-after; the bucket is shared by replicas and per session", async () => {
    const prefix = `test-sec-rate-${randomUUID().slice(0, 8)}`;
    const env = { ROLLGATE_SESSION_RATE: "1", ROLLGATE_SESSION_BURST: "3" };
    const r1 = await gateway(env, prefix);
    const r2 = await gateway(env, prefix);
    try {
      const s = await open(r1, {});
      const other = await open(r1, {});
      const place = (t: string) => PLACES[0]![1](t);
      const byName = (n: string) => AGENT_ROUTES.find((r) => r.name === n)!;
      // The burst: three calls, alternating replicas.
      for (const [app, r] of [[r1, "chat"], [r2, "messages"], [r1, "generateContent"]] as const) {
        expect((await call(app, byName(r), s.id, place(s.token))).statusCode).toBe(200);
      }
      // Over it, on each protocol, on either replica.
      const chatRes = await call(r2, byName("chat"), s.id, place(s.token));
      expect(chatRes.statusCode).toBe(429);
      expect(Number(chatRes.headers["retry-after"])).toBeGreaterThanOrEqual(1);
      expect(chatRes.json()).toMatchObject({ error: { code: "rate_limit_exceeded", message: expect.stringContaining("rate") } });
      const msgRes = await call(r1, byName("messages"), s.id, place(s.token));
      expect(msgRes.statusCode).toBe(429);
      expect(msgRes.headers["retry-after"]).toBeDefined();
      expect(msgRes.json()).toMatchObject({ type: "error", error: { type: "rate_limit_error" } });
      const gemRes = await call(r2, byName("generateContent"), s.id, place(s.token));
      expect(gemRes.statusCode).toBe(429);
      expect(gemRes.json()).toMatchObject({ error: { code: 429, status: "RESOURCE_EXHAUSTED" } });
      // Refused calls were not recorded.
      const recs = (await r1.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: unknown[] };
      expect(recs.completions).toHaveLength(3);
      // Another session has its own bucket.
      expect((await call(r1, byName("chat"), other.id, place(other.token))).statusCode).toBe(200);
      // Wrong tokens do not drain a session's bucket (authentication comes first).
      for (let i = 0; i < 5; i++) expect((await call(r1, byName("chat"), other.id, place(s.token))).statusCode).toBe(401);
      expect((await call(r1, byName("chat"), other.id, place(other.token))).statusCode).toBe(200);
      // After retry-after, the session may call again.
      await new Promise((r) => setTimeout(r, Number(chatRes.headers["retry-after"]) * 1000 + 100));
      expect((await call(r2, byName("chat"), s.id, place(s.token))).statusCode).toBe(200);
    } finally {
      await r1.close();
      await r2.close();
    }
  }, 30_000);

  it("is off by default: a quick run of calls all pass", async () => {
    const app = await gateway();
    try {
      const s = await open(app, {});
      const res = await Promise.all(Array.from({ length: 20 }, () => call(app, AGENT_ROUTES[0]!, s.id, PLACES[0]![1](s.token))));
      expect(res.map((r) => r.statusCode)).toEqual(Array(20).fill(200));
    } finally {
      await app.close();
    }
  });
});
