/**
 * GET /docs and /docs/openapi.json (the OpenAPI document generated from the protocol's zod
 * schemas), and bull-board at /admin/queues behind the admin key.
 */
import { randomUUID } from "node:crypto";
import { GatewayEnv } from "@rollgate/protocol";
import type { FastifyInstance, HTTPMethods } from "fastify";
import { Redis } from "ioredis";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { buildGateway } from "./app.js";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const prefixes: string[] = [];

async function gateway(extra: Record<string, string> = {}): Promise<FastifyInstance> {
  const prefix = `test-docs-${randomUUID().slice(0, 8)}`;
  prefixes.push(prefix);
  // Nothing here calls an engine: a closed port is enough.
  const env = GatewayEnv.parse({ REDIS_URL, ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1, model: "m" }]), ...extra });
  return buildGateway({ env, logger: pino({ level: "silent" }) });
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
const METHODS = ["get", "post", "put", "patch", "delete"];

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

/** An OpenAPI path as the Fastify route that serves it (`{x}` → `:x`; Gemini's `{model}:action` → `*`). */
function fastifyPattern(path: string): string {
  return path
    .split("/")
    .map((seg) => (/^\{[^}]+\}:/.test(seg) ? "*" : seg.replace(/^\{([^}]+)\}$/, ":$1")))
    .join("/");
}

describe("GET /docs/openapi.json", () => {
  it("documents every public route of docs/http-api.md with schemas from protocol, and every $ref resolves", async () => {
    const app = await gateway();
    const res = await app.inject({ url: "/docs/openapi.json" });
    expect(res.statusCode).toBe(200);
    const doc = res.json() as Json & { paths: Record<string, Record<string, Json>>; components: { schemas: Record<string, Json> } };
    expect(doc.openapi).toBe("3.1.0");
    expect((doc.info as Json).title).toBe("rollgate");

    const expected: [string, string][] = [
      ["post", "/v1/tasks"],
      ["post", "/v1/tasks/batch"],
      ["get", "/v1/tasks"],
      ["get", "/v1/tasks/{id}"],
      ["delete", "/v1/tasks/{id}"],
      ["get", "/v1/tasks/{id}/events"],
      ["post", "/v1/sessions"],
      ["get", "/v1/sessions/{id}"],
      ["post", "/v1/sessions/{id}/close"],
      ["get", "/v1/sessions/{id}/completions"],
      ["get", "/v1/sessions/{id}/trajectory"],
      ["delete", "/v1/sessions/{id}"],
      ["post", "/s/{sid}/v1/chat/completions"],
      ["post", "/s/{sid}/v1/responses"],
      ["post", "/s/{sid}/v1/messages"],
      ["post", "/s/{sid}/v1/messages/count_tokens"],
      ["post", "/s/{sid}/v1beta/models/{model}:generateContent"],
      ["post", "/s/{sid}/v1beta/models/{model}:streamGenerateContent"],
      ["get", "/s/{sid}/v1/models"],
      ["post", "/admin/inference/pause"],
      ["post", "/admin/inference/resume"],
      ["post", "/admin/weights"],
      ["get", "/admin/engines"],
      ["get", "/healthz"],
      ["get", "/readyz"],
      ["get", "/metrics"],
      ["get", "/docs"],
      ["get", "/admin/queues"],
    ];
    for (const [method, path] of expected) expect(doc.paths[path]?.[method], `${method.toUpperCase()} ${path}`).toBeTruthy();

    // Structure: every operation answers something; path parameters are declared; every
    // documented operation is a route the gateway really serves.
    for (const [path, item] of Object.entries(doc.paths)) {
      const templated = [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]);
      for (const method of Object.keys(item)) {
        expect(METHODS, `${path}: ${method}`).toContain(method);
        const op = item[method]!;
        expect(Object.keys(op.responses as Json).length, `${method} ${path} responses`).toBeGreaterThan(0);
        const params = ((op.parameters ?? []) as Json[]).filter((p) => p.in === "path").map((p) => p.name);
        expect(new Set(params), `${method} ${path} path parameters`).toEqual(new Set(templated));
        expect(app.hasRoute({ method: method.toUpperCase() as HTTPMethods, url: fastifyPattern(path) }), `${method} ${path} is served`).toBe(true);
      }
    }

    // The protocol's schemas are the components, and the trainer bodies point at them.
    const schemas = doc.components.schemas;
    for (const name of ["Task", "BatchRequest", "TaskRecord", "TaskResult", "TaskEvent", "Session", "CreateSessionRequest", "CreateSessionResponse", "CompletionRecord", "Trajectory", "Trace", "ErrorBody"]) {
      expect(schemas[name], name).toBeTruthy();
    }
    expect((doc.paths["/v1/tasks"]!.post!.requestBody as Json).content).toEqual({ "application/json": { schema: { $ref: "#/components/schemas/Task" } } });
    const task = schemas.Task as { properties: Record<string, Json>; required?: string[] };
    expect(Object.keys(task.properties)).toEqual(expect.arrayContaining(["id", "group_id", "instruction", "agent", "runtime", "evaluator", "sampling", "limits", "callback", "metadata"]));
    // Request bodies are the input side: fields with defaults are optional.
    expect(task.required).toEqual(expect.arrayContaining(["instruction", "agent"]));
    for (const defaulted of ["runtime", "sampling", "limits", "metadata"]) expect(task.required).not.toContain(defaulted);
    const record = schemas.TaskRecord as { properties: Record<string, Json> };
    expect(record.properties.result).toBeTruthy();
    expect(JSON.stringify(schemas.TaskResult)).toContain("#/components/schemas/Trajectory");
    // Agent routes: open request bodies, the client protocol's own shape.
    const chat = doc.paths["/s/{sid}/v1/chat/completions"]!.post!;
    expect(((chat.requestBody as Json).content as Json)["application/json"]).toMatchObject({ schema: { type: "object", additionalProperties: true } });

    // Every $ref resolves inside the document; no schema carries its own $schema/$id/$defs.
    const all = refs(doc);
    expect(all.length).toBeGreaterThan(20);
    for (const { ref, at } of all) expect(resolvePointer(doc, ref), `${ref} at ${at}`).toBeDefined();
    for (const [name, s] of Object.entries(schemas)) {
      expect(s.$schema, name).toBeUndefined();
      expect(s.$id, name).toBeUndefined();
      expect(s.$defs, name).toBeUndefined();
    }
    // Security schemes used by operations exist.
    const schemes = Object.keys((doc.components as Json).securitySchemes as Json);
    for (const item of Object.values(doc.paths)) {
      for (const op of Object.values(item)) for (const req of (op.security ?? []) as Json[]) for (const k of Object.keys(req)) expect(schemes).toContain(k);
    }
    await app.close();
  });

  it("renders a self-contained HTML page at /docs", async () => {
    const app = await gateway({ ROLLGATE_API_KEY: "docs-key" });
    // Public even with a key: the document holds no secret.
    const res = await app.inject({ url: "/docs" });
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toMatch(/^text\/html/);
    const html = res.body;
    expect(html).toMatch(/^<!doctype html>/);
    for (const path of ["/v1/tasks", "/v1/sessions/{id}/trajectory", "/s/{sid}/v1/messages", "/admin/inference/pause", "/metrics"]) expect(html).toContain(path);
    expect(html).toContain('id="schema-Task"');
    expect(html).toContain('href="#schema-TaskResult"');
    // Offline machines: nothing loaded from elsewhere, no script at all.
    expect(html).not.toMatch(/<script/i);
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//i);
    expect((await app.inject({ url: "/docs/openapi.json" })).statusCode).toBe(200);
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
