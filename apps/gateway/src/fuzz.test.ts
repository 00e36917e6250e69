/**
 * Bad input on every public route (fast-check, Fastify inject, in-process engine-sim, real Redis):
 * malformed JSON, wrong types, unknown fields, deep nesting, invalid UTF-8, wrong content types,
 * bodies over the limit. Over 10,000 cases: none may crash the gateway or answer 5xx, and every
 * error is in the caller's protocol shape (ours, OpenAI, Anthropic, Gemini) with a message; a
 * field given the wrong type is named in the message. FUZZ_SEED reproduces a run (the seed is
 * printed on failure by fast-check); FUZZ_RUNS scales it.
 */
import { randomUUID } from "node:crypto";
import { buildEngineSim } from "@rollgate/engine-sim";
import fc from "fast-check";
import type { FastifyInstance, InjectOptions } from "fastify";
import { Redis } from "ioredis";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildGateway } from "./app.js";
import { GatewayEnv } from "./env.js";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const SEED = Number(process.env.FUZZ_SEED ?? 20240611);
const SCALE = Number(process.env.FUZZ_RUNS ?? 1);
const prefix = `test-fuzz-${randomUUID().slice(0, 8)}`;

type Family = "trainer" | "openai" | "anthropic" | "gemini";

let sim: FastifyInstance;
let app: FastifyInstance;
let sid = "";
let token = "";
let cases = 0;
const statuses = new Map<number, number>();

beforeAll(async () => {
  sim = buildEngineSim({ dpSize: 2, model: "Qwen/Qwen3-8B", randomTokens: 4 });
  await sim.listen({ port: 0, host: "127.0.0.1" });
  const addr = sim.server.address();
  const simUrl = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
  const env = GatewayEnv.parse({
    REDIS_URL,
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: simUrl, dp_size: 2 }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0",
  });
  app = await buildGateway({ env, logger: pino({ level: "silent" }) });
  const s = await app.inject({ method: "POST", url: "/v1/sessions", payload: {} });
  ({ id: sid, token } = s.json() as { id: string; token: string });
}, 60_000);

afterAll(async () => {
  await app?.close();
  await sim?.close();
  const redis = new Redis(REDIS_URL);
  for (const pattern of [`${prefix}:*`, `{${prefix}:*`]) {
    const found = await redis.keys(pattern);
    if (found.length) await redis.del(...found);
  }
  redis.disconnect();
  console.log(`fuzz: ${cases} cases, statuses ${JSON.stringify(Object.fromEntries([...statuses].sort((a, b) => a[0] - b[0])))}`);
});

// ── what a valid body of each route looks like ──
const chatBody = () => ({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 4 });
const responsesBody = () => ({ model: "m", input: "hi", max_output_tokens: 4 });
const anthropicBody = () => ({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "hi" }] });
const geminiBody = () => ({ contents: [{ role: "user", parts: [{ text: "hi" }] }], generationConfig: { maxOutputTokens: 4 } });
const taskBody = () => ({
  instruction: "do it",
  agent: { harness: "command", command: ["true"] },
  evaluator: { kind: "none" },
  limits: { timeout_s: 60 },
  metadata: { row: 1 },
});

interface Route {
  name: string;
  family: Family;
  method: "GET" | "POST" | "DELETE";
  url: () => string;
  body?: () => Record<string, unknown>;
  /** Top-level fields whose wrong type must be a 400 naming the field. */
  typed?: Record<string, "string" | "number" | "array" | "object" | "boolean">;
  /** Answers to undo after a case (a valid pause). */
  after?: (status: number) => Promise<void>;
  agent?: boolean;
  /** Cases for this route (default PER_ROUTE). */
  runs?: number;
}

const s = () => `/s/${sid}`;
const ROUTES: Route[] = [
  { name: "chat", family: "openai", method: "POST", url: () => `${s()}/v1/chat/completions`, body: chatBody, agent: true, typed: { messages: "array", model: "string", stream: "boolean", max_tokens: "number" } },
  { name: "responses", family: "openai", method: "POST", url: () => `${s()}/v1/responses`, body: responsesBody, agent: true, typed: { model: "string", stream: "boolean", max_output_tokens: "number" } },
  { name: "messages", family: "anthropic", method: "POST", url: () => `${s()}/v1/messages`, body: anthropicBody, agent: true, typed: { messages: "array", max_tokens: "number", stream: "boolean" } },
  { name: "count_tokens", family: "anthropic", method: "POST", url: () => `${s()}/v1/messages/count_tokens`, body: anthropicBody, agent: true, typed: { messages: "array" } },
  { name: "generateContent", family: "gemini", method: "POST", url: () => `${s()}/v1beta/models/m:generateContent`, body: geminiBody, agent: true, typed: { contents: "array" } },
  { name: "streamGenerateContent", family: "gemini", method: "POST", url: () => `${s()}/v1beta/models/m:streamGenerateContent?alt=sse`, body: geminiBody, agent: true, typed: { contents: "array" } },
  { name: "countTokens", family: "gemini", method: "POST", url: () => `${s()}/v1beta/models/m:countTokens`, body: geminiBody, agent: true },
  { name: "gemini unknown method", family: "gemini", method: "POST", url: () => `${s()}/v1beta/models/m:explode`, body: geminiBody, agent: true },
  { name: "models", family: "openai", method: "GET", url: () => `${s()}/v1/models`, agent: true },
  { name: "gemini models", family: "gemini", method: "GET", url: () => `${s()}/v1beta/models/x`, agent: true },
  { name: "tasks", family: "trainer", method: "POST", url: () => "/v1/tasks", body: taskBody, typed: { instruction: "string", agent: "object", runtime: "object", limits: "object", metadata: "object", callback: "object" } },
  { name: "batch", family: "trainer", method: "POST", url: () => "/v1/tasks/batch", body: () => ({ tasks: [taskBody()] }), typed: { tasks: "array" } },
  { name: "group batch", family: "trainer", method: "POST", url: () => "/v1/tasks/batch", body: () => ({ group_id: `g-${randomUUID().slice(0, 6)}`, n: 2, task: taskBody() }), typed: { n: "number", task: "object" } },
  { name: "sessions", family: "trainer", method: "POST", url: () => "/v1/sessions", body: () => ({ limits: { max_llm_calls: 3 }, metadata: {} }), typed: { limits: "object", metadata: "object", sampling: "object" } },
  { name: "close session", family: "trainer", method: "POST", url: () => `/v1/sessions/s-nope-${randomUUID()}/close`, body: () => ({ note: "x" }) },
  { name: "weights", family: "trainer", method: "POST", url: () => "/admin/weights", body: () => ({ version: "v1" }), typed: { version: "string" } },
  {
    name: "pause",
    family: "trainer",
    method: "POST",
    url: () => "/admin/inference/pause",
    body: () => ({ mode: "drain", timeout_s: 0 }),
    typed: { mode: "string", timeout_s: "number" },
    // A valid pause waits 200 ms for replicas to hear it: fewer cases.
    runs: 150,
    after: async (status) => {
      if (status === 200) await app.inject({ method: "POST", url: "/admin/inference/resume", payload: {} });
    },
  },
];

// Routes without a body, fuzzed through their path and query.
const QUERY_ROUTES: { name: string; family: Family; method: "GET" | "DELETE"; url: (junk: string) => string }[] = [
  { name: "task", family: "trainer", method: "GET", url: (j) => `/v1/tasks/${j}` },
  { name: "task logs", family: "trainer", method: "GET", url: (j) => `/v1/tasks/${j}/logs` },
  { name: "cancel", family: "trainer", method: "DELETE", url: (j) => `/v1/tasks/${j}` },
  { name: "list", family: "trainer", method: "GET", url: (j) => `/v1/tasks?status=${j}&limit=${j}&cursor=${j}&group_id=${j}` },
  { name: "session", family: "trainer", method: "GET", url: (j) => `/v1/sessions/${j}` },
  { name: "completions", family: "trainer", method: "GET", url: (j) => `/v1/sessions/${j}/completions` },
  { name: "trajectory", family: "trainer", method: "GET", url: (j) => `/v1/sessions/${sid}/trajectory?builder=${j}&format=${j}` },
  { name: "delete session", family: "trainer", method: "DELETE", url: (j) => `/v1/sessions/x${j}` },
];

// ── what an error must look like ──
function shapeProblem(family: Family, status: number, text: string): string | null {
  let b: Record<string, unknown>;
  try {
    b = JSON.parse(text) as Record<string, unknown>;
  } catch {
    return `not JSON: ${text.slice(0, 200)}`;
  }
  const e = b.error as Record<string, unknown> | undefined;
  if (!e || typeof e !== "object") return `no error object: ${text.slice(0, 200)}`;
  if (typeof e.message !== "string" || e.message.length === 0) return `no message: ${text.slice(0, 200)}`;
  switch (family) {
    case "trainer":
      return typeof e.type === "string" ? null : "trainer error without type";
    case "openai":
      return typeof e.type === "string" && "code" in e ? null : "OpenAI error without type/code";
    case "anthropic":
      return b.type === "error" && typeof e.type === "string" ? null : "Anthropic error without type:error";
    case "gemini":
      return e.code === status && typeof e.status === "string" ? null : "Gemini error without code/status";
  }
}

async function send(opts: InjectOptions, family: Family, route: string, note: string): Promise<{ status: number; body: string }> {
  cases++;
  const res = await app.inject(opts);
  statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
  const where = `${route} (${note}) → ${res.statusCode}: ${res.body.slice(0, 300)}`;
  if (res.statusCode >= 500) throw new Error(`5xx on ${where}`);
  if (res.statusCode >= 400) {
    const problem = shapeProblem(family, res.statusCode, res.body);
    if (problem) throw new Error(`${problem} on ${where}`);
  }
  return { status: res.statusCode, body: res.body };
}

// ── arbitraries ──
const json = fc.jsonValue({ maxDepth: 3 });
const wrongValue = (kind: string) =>
  fc.oneof(
    ...[
      kind !== "string" ? fc.string({ maxLength: 8 }) : null,
      kind !== "number" ? fc.oneof(fc.integer(), fc.double({ noNaN: true })) : null,
      kind !== "boolean" ? fc.boolean() : null,
      kind !== "array" ? fc.array(fc.integer(), { maxLength: 3 }) : null,
      kind !== "object" ? fc.dictionary(fc.string({ minLength: 1, maxLength: 5 }), fc.integer(), { maxKeys: 2 }) : null,
    ].filter((a): a is NonNullable<typeof a> => a !== null),
  );

/** Every path into an object (arrays by index), for mutations. */
function paths(v: unknown, at: (string | number)[] = []): (string | number)[][] {
  if (Array.isArray(v)) return [at, ...v.flatMap((x, i) => paths(x, [...at, i]))];
  if (v && typeof v === "object") return [at, ...Object.entries(v).flatMap(([k, x]) => paths(x, [...at, k]))];
  return [at];
}
function setAt(obj: unknown, p: (string | number)[], value: unknown): unknown {
  if (p.length === 0) return value;
  const copy = (Array.isArray(obj) ? [...obj] : { ...(obj as object) }) as Record<string | number, unknown>;
  copy[p[0]!] = setAt(copy[p[0]!], p.slice(1), value);
  return copy;
}
function nest(depth: number, leaf: unknown, kind: "array" | "object"): string {
  return kind === "array" ? `${"[".repeat(depth)}${JSON.stringify(leaf)}${"]".repeat(depth)}` : `${'{"a":'.repeat(depth)}${JSON.stringify(leaf)}${"}".repeat(depth)}`;
}

const CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", "application/octet-stream", "application/json; charset=latin1", "application/jsonx", "", "image/png"];

type Payload = { kind: string; payload: string | Buffer | undefined; contentType?: string; field?: string };

function payloads(route: Route): fc.Arbitrary<Payload> {
  const base = route.body!;
  const typed = Object.entries(route.typed ?? {});
  const options: fc.Arbitrary<Payload>[] = [
    json.map((v) => ({ kind: "any-json", payload: JSON.stringify(v) })),
    fc.tuple(fc.nat(), wrongValue("")).map(([i, v]) => {
      const ps = paths(base()).filter((p) => p.length > 0);
      const p = ps[i % ps.length]!;
      return { kind: `mutate ${p.join(".")}`, payload: JSON.stringify(setAt(base(), p, v)) };
    }),
    fc.tuple(fc.string({ minLength: 1, maxLength: 12 }), json).map(([k, v]) => ({ kind: "unknown field", payload: JSON.stringify({ ...base(), [k]: v }) })),
    fc.tuple(fc.nat(), fc.string({ maxLength: 3 })).map(([i, junk]) => {
      const text = JSON.stringify(base());
      const at = i % text.length;
      return { kind: "malformed", payload: text.slice(0, at) + junk + (i % 2 ? "" : text.slice(at + 1)) };
    }),
    fc.tuple(fc.integer({ min: 50, max: 100_000 }), fc.constantFrom("array", "object") as fc.Arbitrary<"array" | "object">, fc.nat()).map(([d, kind, i]) => {
      const ps = paths(base());
      const p = ps[i % ps.length]!;
      const marker = "__DEEP__";
      const text = JSON.stringify(setAt(base(), p, marker)).replace(`"${marker}"`, nest(d, 1, kind));
      return { kind: `deep ${d} at ${p.join(".") || "root"}`, payload: text };
    }),
    fc.tuple(fc.nat(), fc.constantFrom(Buffer.from([0xff]), Buffer.from([0xc3, 0x28]), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from([0xf8, 0x88, 0x80, 0x80, 0x80]), Buffer.from([0x00]))).map(([i, bad]) => {
      const text = Buffer.from(JSON.stringify(base()));
      const quotes = [...text.entries()].filter(([, b]) => b === 0x22).map(([k]) => k);
      const at = quotes[i % quotes.length]! + 1;
      return { kind: "invalid utf-8", payload: Buffer.concat([text.subarray(0, at), bad, text.subarray(at)]) };
    }),
    fc.constantFrom(...CONTENT_TYPES).map((ct) => ({ kind: `content-type ${ct || "(none)"}`, payload: JSON.stringify(base()), contentType: ct })),
    fc.constantFrom("", " ", "null", "[]", "0", '"x"', "true", "{}", "\n").map((p) => ({ kind: `tiny ${JSON.stringify(p)}`, payload: p })),
  ];
  if (typed.length > 0) {
    options.push(
      fc.tuple(fc.constantFrom(...typed), fc.nat()).chain(([[field, kind]]) =>
        wrongValue(kind).map((v) => ({ kind: `wrong type ${field}`, payload: JSON.stringify({ ...base(), [field]: v }), field })),
      ),
    );
  }
  return fc.oneof(...options);
}

const PER_ROUTE = Math.round(640 * SCALE);
const PER_QUERY_ROUTE = Math.round(130 * SCALE);

describe("fuzzing every public route", () => {
  for (const route of ROUTES) {
    it(`${route.method} ${route.name}: no 5xx, errors in the ${route.family} shape`, async () => {
      const headers = (ct?: string): Record<string, string> => ({
        ...(route.agent ? { authorization: `Bearer ${token}` } : {}),
        ...(ct === undefined ? { "content-type": "application/json" } : ct === "" ? {} : { "content-type": ct }),
      });
      if (!route.body) {
        await fc.assert(
          fc.asyncProperty(fc.string({ maxLength: 20 }), fc.constantFrom("", "?x=1", "?key=%ff", "?alt=sse&alt=json"), async (junk, q) => {
            await send({ method: route.method, url: route.url() + q, headers: { ...headers(), "x-junk": encodeURIComponent(junk) } }, route.family, route.name, `query ${q}`);
          }),
          { numRuns: PER_QUERY_ROUTE, seed: SEED },
        );
        return;
      }
      await fc.assert(
        fc.asyncProperty(payloads(route), async (p) => {
          const res = await send({ method: route.method, url: route.url(), headers: headers(p.contentType), payload: p.payload }, route.family, route.name, p.kind);
          await route.after?.(res.status);
          if (p.field) {
            // A wrong type for a known field: 400 naming it (a few are coerced or allowed, e.g. a nullable).
            if (res.status === 400) expect(res.body, `${route.name} ${p.kind}`).toContain(p.field);
          }
        }),
        { numRuns: route.runs ?? PER_ROUTE, seed: SEED },
      );
    }, 120_000);
  }

  for (const route of QUERY_ROUTES) {
    it(`${route.method} ${route.name}: junk ids and queries`, async () => {
      await fc.assert(
        fc.asyncProperty(fc.oneof(fc.string({ maxLength: 40 }), fc.constantFrom("..", "%2e%2e%2f", "%00", "%ff%fe", "a".repeat(300), "%E2%80%AE", "*", "1e309", "-1")), async (junk) => {
          const enc = /%/.test(junk) ? junk : encodeURIComponent(junk);
          await send({ method: route.method, url: route.url(enc) }, route.family, route.name, `junk ${JSON.stringify(junk)}`);
        }),
        { numRuns: PER_QUERY_ROUTE, seed: SEED },
      );
    }, 60_000);
  }

  it("bodies over the limit: 413 in each caller's shape (trainer routes 1 MiB, agent routes 64 MiB)", async () => {
    const mib = (n: number) => "x".repeat(n * 1024 * 1024);
    const big = JSON.stringify({ ...taskBody(), instruction: mib(1) });
    let r = await send({ method: "POST", url: "/v1/tasks", headers: { "content-type": "application/json" }, payload: big }, "trainer", "tasks", "1 MiB");
    expect(r.status).toBe(413);
    expect(JSON.parse(r.body).error).toMatchObject({ type: "payload_too_large", message: expect.stringMatching(/body/i) });
    r = await send({ method: "POST", url: "/v1/sessions", headers: { "content-type": "application/json" }, payload: JSON.stringify({ metadata: { x: mib(1) } }) }, "trainer", "sessions", "1 MiB");
    expect(r.status).toBe(413);
    // The batch route takes large batches.
    r = await send({ method: "POST", url: "/v1/tasks/batch", headers: { "content-type": "application/json" }, payload: JSON.stringify({ tasks: [{ ...taskBody(), metadata: { x: mib(2) } }] }) }, "trainer", "batch", "2 MiB");
    expect(r.status).toBe(202);

    const huge = Buffer.alloc(65 * 1024 * 1024, 0x20);
    const agent: [Family, string, (b: string) => unknown][] = [
      ["openai", `${s()}/v1/chat/completions`, (b) => JSON.parse(b).error.type],
      ["openai", `${s()}/v1/responses`, (b) => JSON.parse(b).error.type],
      ["anthropic", `${s()}/v1/messages`, (b) => JSON.parse(b).error.type],
      ["gemini", `${s()}/v1beta/models/m:generateContent`, (b) => JSON.parse(b).error.status],
    ];
    for (const [family, url, kind] of agent) {
      const res = await send({ method: "POST", url, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, payload: huge }, family, url, "65 MiB");
      expect(res.status).toBe(413);
      expect(kind(res.body)).toBeTruthy();
    }
    // Just under 64 MiB is read (and refused as a bad body, not as too large).
    const under = Buffer.concat([Buffer.from('{"messages": "'), Buffer.alloc(63 * 1024 * 1024, 0x61), Buffer.from('"}')]);
    const ok = await send({ method: "POST", url: `${s()}/v1/chat/completions`, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, payload: under }, "openai", "chat", "63 MiB");
    expect(ok.status).toBe(400);
    expect(JSON.parse(ok.body).error.message).toContain("messages");
  }, 120_000);

  it("a query string that is not valid percent-encoding is a 400 naming the parameter, in the caller's shape, on every documented route", async () => {
    const doc = (await app.inject({ url: "/docs/json" })).json() as { paths: Record<string, Record<string, unknown>> };
    const task = await app.inject({ method: "POST", url: "/v1/tasks", payload: taskBody() });
    const taskId = (task.json() as { id: string }).id;
    let routes = 0;
    for (const [p, ops] of Object.entries(doc.paths)) {
      const url = p
        .replace("{sid}", sid)
        .replace(/\{id\}/, p.startsWith("/v1/tasks") ? taskId : sid)
        .replace(/\{[^}]+\}/g, "m:generateContent");
      for (const m of Object.keys(ops)) {
        const method = m.toUpperCase() as "GET" | "POST" | "DELETE" | "HEAD";
        if (method === "DELETE" || url.includes("/admin/inference/pause")) continue; // would change state for later cases
        if (method === "HEAD") {
          // A HEAD answer has no body to name the parameter in: the status says it.
          expect((await app.inject({ method, url: `${url}?%zz=1` })).statusCode, `HEAD ${p}`).toBe(400);
          continue;
        }
        const family = (url.startsWith("/s/") ? (url.includes("/v1/messages") ? "anthropic" : url.includes("v1beta") || url.includes(":") ? "gemini" : "openai") : "trainer") as Family;
        for (const [q, param] of [["?cursor=%ZZ", "cursor"], ["?alt=sse&key=%E0%A4%A", "key"], ["?%zz=1", "%zz"], ["?limit=5&after=%", "after"]] as const) {
          const res = await send(
            { method, url: url + q, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, ...(method === "POST" ? { payload: "{}" } : {}) },
            family,
            `${method} ${p}`,
            `query ${q}`,
          );
          expect(res.status, `${method} ${p}${q}`).toBe(400);
          expect(JSON.parse(res.body).error.message, `${method} ${p}${q}`).toContain(param);
        }
        routes++;
      }
    }
    expect(routes).toBeGreaterThan(20);
  });

  it("a query value a route cannot use is a 400 naming the parameter (a cursor or event id never reaches Redis)", async () => {
    const cases: [string, Family, string][] = [
      ["/v1/tasks?cursor=%ZZ", "trainer", "cursor"],
      ["/v1/tasks?cursor=not-a-cursor", "trainer", "cursor"],
      ["/v1/tasks?cursor=12:", "trainer", "cursor"],
      ["/v1/tasks?limit=0", "trainer", "limit"],
      ["/v1/tasks?limit=1&limit=2", "trainer", "limit"],
      ["/v1/tasks?status=bogus", "trainer", "status"],
      [`/v1/sessions/${sid}/trajectory?builder=nope`, "trainer", "builder"],
      ["/v1/stats/timeseries?minutes=-1", "trainer", "minutes"],
      ["/v1/stats/groups?bins=1", "trainer", "bins"],
    ];
    for (const [url, family, param] of cases) {
      const res = await send({ method: "GET", url }, family, url, "bad value");
      expect(res.status, url).toBe(400);
      expect(JSON.parse(res.body).error.message, url).toContain(param);
    }
    // A real task's event stream with a bad Last-Event-ID: 400 before the stream starts.
    const id = (await app.inject({ method: "POST", url: "/v1/tasks", payload: taskBody() })).json().id as string;
    let res = await send({ method: "GET", url: `/v1/tasks/${id}/events`, headers: { "last-event-id": "0-0); flushall" } }, "trainer", "events", "bad Last-Event-ID");
    expect(res.status).toBe(400);
    expect(JSON.parse(res.body).error.message).toContain("Last-Event-ID");
    res = await send({ method: "GET", url: `/v1/tasks/${id}/events?after=garbage` }, "trainer", "events", "bad after");
    expect(res.status).toBe(400);
    expect(JSON.parse(res.body).error.message).toContain("after");
    // A real cursor still pages.
    const page = (await app.inject({ url: "/v1/tasks?limit=1" })).json() as { next_cursor: string | null };
    expect(page.next_cursor).toMatch(/^\d+:/);
    expect((await app.inject({ url: `/v1/tasks?limit=1&cursor=${encodeURIComponent(page.next_cursor!)}` })).statusCode).toBe(200);
  });

  it("prototype-poisoning keys are refused (400 in the caller's shape) wherever they sit, while the nesting limit holds", async () => {
    const poisons = [
      '{"__proto__": {"admin": true}}',
      '{"constructor": {"prototype": {"admin": true}}}',
      '{"zz_extra": {"a": [{"__proto__": {"x": 1}}]}}',
      '{ "__proto__" : null }',
      '{"\\u005f_proto__": {"x": 1}}',
    ];
    for (const route of ROUTES.filter((r) => r.body)) {
      for (const poison of poisons) {
        // The poison merged into a valid body (first key), so only the key can be the problem.
        const valid = JSON.stringify(route.body!());
        const payload = `{${poison.slice(1, -1)}, ${valid.slice(1)}`;
        const res = await send(
          { method: route.method, url: route.url(), headers: { ...(route.agent ? { authorization: `Bearer ${token}` } : {}), "content-type": "application/json" }, payload },
          route.family,
          route.name,
          `poison ${poison}`,
        );
        await route.after?.(res.status);
        expect(res.status, `${route.name} ${poison}`).toBe(400);
        expect(JSON.parse(res.body).error.message, `${route.name} ${poison}`).toMatch(/__proto__|constructor/);
      }
    }
    expect(({} as Record<string, unknown>).admin).toBeUndefined();
    // A string that merely says __proto__ is fine; deep nesting is still refused.
    const ok = await send({ method: "POST", url: `${s()}/v1/chat/completions`, headers: { authorization: `Bearer ${token}` }, payload: { ...chatBody(), messages: [{ role: "user", content: "__proto__ constructor.prototype" }] } }, "openai", "chat", "proto in a string");
    expect(ok.status).toBe(200);
    const deep = await send({ method: "POST", url: "/v1/tasks", headers: { "content-type": "application/json" }, payload: nest(600, 1, "array") }, "trainer", "tasks", "deep");
    expect(deep.status).toBe(400);
    expect(JSON.parse(deep.body).error.message).toMatch(/deeper than 512/);
  });

  it("ran at least 10,000 cases, and the gateway still answers", async () => {
    expect(cases).toBeGreaterThanOrEqual(10_000 * Math.min(1, SCALE));
    const res = await app.inject({ method: "POST", url: `${s()}/v1/chat/completions`, headers: { authorization: `Bearer ${token}` }, payload: chatBody() });
    expect(res.statusCode).toBe(200);
    expect((await app.inject({ url: "/healthz" })).statusCode).toBe(200);
  });
});
