/**
 * The OpenAPI document at GET /docs/json is generated from the routes' own schemas: every route
 * the gateway serves is in it (save the few listed below, each with why), and every documented
 * operation is served. Swagger UI at /docs works offline. And bull-board at /admin/queues behind
 * the admin key.
 */
import { randomUUID } from "node:crypto";
import type { FastifyInstance, RouteOptions } from "fastify";
import { Redis } from "ioredis";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { buildGateway } from "./app.js";
import { GatewayEnv } from "./env.js";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const prefixes: string[] = [];

async function gateway(extra: Record<string, string> = {}, onRoute?: (route: RouteOptions) => void): Promise<FastifyInstance> {
  const prefix = `test-docs-${randomUUID().slice(0, 8)}`;
  prefixes.push(prefix);
  // Nothing here calls an engine: a closed port is enough.
  const env = GatewayEnv.parse({ REDIS_URL, ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1, model: "m" }]), ...extra });
  return buildGateway({ env, logger: pino({ level: "silent" }), ...(onRoute ? { onRoute } : {}) });
}

afterAll(async () => {
  const redis = new Redis(REDIS_URL);
  for (const p of prefixes) {
    const found = [...(await redis.keys(`${p}:*`)), ...(await redis.keys(`{${p}:*`))];
    if (found.length) await redis.del(...found);
  }
  redis.disconnect();
});

type Json = Record<string, unknown>;
type Doc = Json & { paths: Record<string, Record<string, Json>>; components: { schemas: Record<string, Json>; securitySchemes: Json } };

/** Every `$ref` in the document, with where it was found. */
function refs(node: unknown, at = "#", out: { ref: string; at: string }[] = []): { ref: string; at: string }[] {
  if (Array.isArray(node)) node.forEach((n, i) => refs(n, `${at}/${i}`, out));
  else if (node && typeof node === "object") {
    for (const [k, v] of Object.entries(node)) {
      if (k === "$ref" && typeof v === "string") out.push({ ref: v, at });
      else refs(v, `${at}/${k}`, out);
    }
  }
  return out;
}

function resolvePointer(doc: unknown, ref: string): unknown {
  if (!ref.startsWith("#/")) return undefined;
  let node: unknown = doc;
  for (const raw of ref.slice(2).split("/")) {
    const key = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    if (!node || typeof node !== "object" || !(key in node)) return undefined;
    node = (node as Json)[key];
  }
  return node;
}

/** A Fastify route URL as its OpenAPI path (`:x` → `{x}`, `*` → `{*}`). */
const openApiPath = (url: string) => url.replace(/:([A-Za-z0-9_]+)/g, "{$1}").replace(/\*/g, "{*}");

/** An OpenAPI path with a value for each parameter, to request it. */
const concrete = (path: string) => path.replace(/\{\*\}/g, "any-model:generateContent").replace(/\{[^}]+\}/g, "x");

/**
 * Served but not documented, and why. Anything else the gateway serves must be in the document.
 */
type Route = { method: string; url: string };
const UNDOCUMENTED: { match: (method: string, url: string, all: Route[]) => boolean; why: string }[] = [
  { match: (_m, url) => url.startsWith("/dashboard/"), why: "the dashboard page's own scripts and styles (GET /dashboard is documented)" },
  { match: (_m, url) => url.startsWith("/admin/queues/"), why: "bull-board's private JSON API and assets, called by its page (GET /admin/queues is documented)" },
  { match: (_m, url) => url === "/docs" || url.startsWith("/docs/"), why: "Swagger UI, its assets, and this document itself" },
  { match: (m, url, all) => m === "HEAD" && all.some((r) => r.method === "GET" && r.url === url), why: "the HEAD twin Fastify adds to every GET route" },
];

describe("GET /docs/json: the OpenAPI document generated from the routes", () => {
  it("lists every route the gateway serves, and every operation it lists is served", async () => {
    const registered: Route[] = [];
    const app = await gateway({}, (route) => {
      for (const method of [route.method].flat()) registered.push({ method, url: route.url });
    });
    await app.listen({ port: 0, host: "127.0.0.1" });
    const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
    try {
      const res = await fetch(`${base}/docs/json`);
      expect(res.status).toBe(200);
      const doc = (await res.json()) as Doc;
      expect(doc.openapi).toBe("3.1.0");
      expect((doc.info as Json).title).toBe("rollgate");

      // Routes → document.
      expect(registered.length).toBeGreaterThan(40);
      const documented = new Set(Object.entries(doc.paths).flatMap(([path, item]) => Object.keys(item).map((m) => `${m.toUpperCase()} ${path}`)));
      const missing = registered.filter(({ method, url }) => !documented.has(`${method} ${openApiPath(url)}`) && !UNDOCUMENTED.some((u) => u.match(method, url, registered)));
      expect(missing, "served but not in /docs/json").toEqual([]);
      // The routes this gateway is about are there (a regression that hid them all would pass the check above).
      for (const op of ["POST /v1/tasks", "GET /v1/stats/overview", "GET /v1/sessions/{id}/trajectory/decoded", "POST /s/{sid}/v1/chat/completions", "POST /s/{sid}/v1beta/models/{*}", "HEAD /s/{sid}", "GET /admin/queues", "GET /metrics"]) {
        expect(documented, op).toContain(op);
      }

      // Document → routes: each operation answers something other than "no route" on a real port.
      for (const op of documented) {
        const [method, path] = op.split(" ") as [string, string];
        const r = await fetch(`${base}${concrete(path)}`, { method, ...(method === "POST" || method === "PUT" ? { body: "{}", headers: { "content-type": "application/json" } } : {}) });
        const text = await r.text();
        expect(r.status === 404 && /no route/.test(text), `${op} is served (got ${r.status} ${text.slice(0, 120)})`).toBe(false);
      }
    } finally {
      await app.close();
    }
  });

  it("declares each operation's parameters, answers and security, with the protocol's schemas as components", async () => {
    const app = await gateway();
    const doc = (await app.inject({ url: "/docs/json" })).json() as Doc;
    for (const [path, item] of Object.entries(doc.paths)) {
      const templated = [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]);
      for (const [method, op] of Object.entries(item)) {
        expect(Object.keys(op.responses as Json).length, `${method} ${path} responses`).toBeGreaterThan(0);
        const params = ((op.parameters ?? []) as Json[]).filter((p) => p.in === "path").map((p) => p.name);
        expect(new Set(params), `${method} ${path} path parameters`).toEqual(new Set(templated));
      }
    }

    const schemas = doc.components.schemas;
    // Request bodies are the schemas' input side (`<Name>Input`: defaults make fields optional), answers their output side.
    for (const name of ["TaskInput", "BatchRequestInput", "CreateSessionRequestInput", "PauseRequestInput", "TaskRecord", "TaskResult", "Session", "CreateSessionResponse", "CompletionRecord", "Trajectory", "Trace", "ErrorBody", "DecodedTrajectory", "EnginesAnswer"]) {
      expect(schemas[name], name).toBeTruthy();
    }
    const submit = doc.paths["/v1/tasks"]!.post!;
    expect((submit.requestBody as Json).content).toEqual({ "application/json": { schema: { $ref: "#/components/schemas/TaskInput" } } });
    expect(submit.security).toEqual([{ apiKey: [] }]);
    expect(((submit.responses as Json)["400"] as Json).description).toMatch(/invalid request/);
    const task = schemas.TaskInput as { properties: Record<string, Json>; required?: string[] };
    expect(Object.keys(task.properties)).toEqual(expect.arrayContaining(["id", "group_id", "instruction", "agent", "runtime", "evaluator", "sampling", "limits", "callback", "metadata"]));
    expect(task.required).toEqual(expect.arrayContaining(["instruction", "agent"]));
    for (const defaulted of ["runtime", "sampling", "limits", "metadata"]) expect(task.required).not.toContain(defaulted);
    expect(JSON.stringify(schemas.TaskResult)).toContain("#/components/schemas/Trajectory");
    // Field descriptions written on the schemas (`.describe()`) reach the document.
    expect(((schemas.PauseRequestInput as { properties: Record<string, Json> }).properties.mode!.description as string)).toMatch(/^drain: in-flight calls finish/);
    // Query parameters come from the route's query schema.
    const list = doc.paths["/v1/tasks"]!.get!;
    expect(((list.parameters ?? []) as Json[]).filter((p) => p.in === "query").map((p) => p.name)).toEqual(expect.arrayContaining(["limit", "status", "group_id", "cursor"]));
    // Agent routes: the client protocol's own request schema, open to fields the gateway does not use.
    const chat = doc.paths["/s/{sid}/v1/chat/completions"]!.post!;
    const chatBody = (((chat.requestBody as Json).content as Json)["application/json"] as Json).schema as Json;
    expect(chatBody).toMatchObject({ type: "object", additionalProperties: {} });
    expect(Object.keys(chatBody.properties as Json)).toEqual(expect.arrayContaining(["messages", "tools", "stream"]));
    expect(chat.security).toEqual(expect.arrayContaining([{ sessionBearer: [] }, { sessionApiKey: [] }]));

    // Every $ref resolves inside the document; every security scheme used exists.
    const all = refs(doc);
    expect(all.length).toBeGreaterThan(20);
    for (const { ref, at } of all) expect(resolvePointer(doc, ref), `${ref} at ${at}`).toBeDefined();
    const schemes = Object.keys(doc.components.securitySchemes);
    for (const item of Object.values(doc.paths)) {
      for (const op of Object.values(item)) for (const req of (op.security ?? []) as Json[]) for (const k of Object.keys(req)) expect(schemes).toContain(k);
    }
    await app.close();
  });

  it("serves Swagger UI at /docs from the package itself, open even with an API key", async () => {
    const app = await gateway({ ROLLGATE_API_KEY: "docs-key" });
    const page = await app.inject({ url: "/docs/" });
    expect(page.statusCode).toBe(200);
    expect(page.headers["content-type"]).toMatch(/^text\/html/);
    // Offline machines: every script and style comes from the gateway.
    const assets = [...page.body.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!);
    expect(assets.length).toBeGreaterThan(0);
    for (const a of assets) expect(a, a).not.toMatch(/^(https?:)?\/\//);
    for (const a of assets.filter((x) => x.endsWith(".js") || x.endsWith(".css"))) {
      expect((await app.inject({ url: new URL(a, "http://gw/docs/").pathname })).statusCode, a).toBe(200);
    }
    expect((await app.inject({ url: "/docs/json" })).statusCode).toBe(200);
    await app.close();
  });
});

describe("bull-board at /admin/queues", () => {
  it("requires the admin key: Bearer, or ?key= once (then a cookie), never without", async () => {
    const key = `k-${randomUUID()}`;
    const app = await gateway({ ROLLGATE_API_KEY: key });
    expect((await app.inject({ url: "/admin/queues" })).statusCode).toBe(401);
    expect((await app.inject({ url: "/admin/queues/api/queues" })).statusCode).toBe(401);
    expect((await app.inject({ url: "/admin/queues?key=wrong" })).statusCode).toBe(401);
    expect((await app.inject({ url: "/admin/queues", headers: { authorization: "Bearer wrong" } })).statusCode).toBe(401);
    expect((await app.inject({ url: "/admin/queues/api/queues", headers: { cookie: "rollgate_admin=forged" } })).statusCode).toBe(401);

    const page = await app.inject({ url: "/admin/queues", headers: { authorization: `Bearer ${key}` } });
    expect(page.statusCode).toBe(200);
    expect(page.headers["content-type"]).toMatch(/^text\/html/);

    // A browser: ?key= sets the cookie and redirects to the URL without the key.
    const login = await app.inject({ url: `/admin/queues?key=${key}`, headers: { accept: "text/html" } });
    expect(login.statusCode).toBe(303);
    expect(login.headers.location).toBe("/admin/queues");
    const setCookie = String(login.headers["set-cookie"]);
    expect(setCookie).toMatch(/^rollgate_admin=[^;]+; Path=\/admin\/queues; HttpOnly; SameSite=Strict$/);
    expect(setCookie).not.toContain(key);
    const cookie = setCookie.split(";")[0]!;
    const api = await app.inject({ url: "/admin/queues/api/queues", headers: { cookie } });
    expect(api.statusCode).toBe(200);
    const names = (api.json() as { queues: { name: string }[] }).queues.map((q) => q.name).sort();
    expect(names).toEqual(["callbacks", "rollouts"]);
    // The page's own assets load with the cookie (the browser sends it, not the key).
    const page2 = await app.inject({ url: "/admin/queues", headers: { cookie } });
    expect(page2.statusCode).toBe(200);
    const asset = /src="(static\/js\/[^"]+)"/.exec(page2.body)?.[1];
    expect(asset).toBeTruthy();
    expect((await app.inject({ url: `/admin/queues/${asset}` })).statusCode).toBe(401);
    expect((await app.inject({ url: `/admin/queues/${asset}`, headers: { cookie } })).statusCode).toBe(200);
    // The cookie is only good for bull-board.
    expect((await app.inject({ url: "/v1/tasks", headers: { cookie } })).statusCode).toBe(401);
    await app.close();
  });

  it("is open when no API key is configured", async () => {
    const app = await gateway();
    expect((await app.inject({ url: "/admin/queues" })).statusCode).toBe(200);
    await app.close();
  });
});
