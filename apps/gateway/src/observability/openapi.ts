import {
  BatchRequest,
  CompletionRecord,
  CreateSessionRequest,
  CreateSessionResponse,
  DecodedTrajectory,
  ErrorBody,
  Preflight,
  Readiness,
  Session,
  Task,
  TaskAccepted,
  TaskEvent,
  TaskListQuery,
  TaskRecord,
  TaskResult,
  Trace,
  Trajectory,
  TrajectoryBuilderName,
} from "@rollgate/protocol";
import { TRAINER_FORMATS } from "@rollgate/trajectory";
import { z } from "zod";
import { WeightLoad } from "../ops/weight-loading.js";

/**
 * The OpenAPI 3.1 document of the public API (docs/http-api.md), generated from the zod schemas of
 * `@rollgate/protocol` with `z.toJSONSchema` (JSON Schema 2020-12, which OpenAPI 3.1 uses as is).
 * Request bodies are the schemas' input side (defaults make fields optional), responses their
 * output side. Agent-facing routes speak their client's protocol (OpenAI, Anthropic, Gemini):
 * their bodies are documented as open objects, since the vendors' own specs are the reference.
 *
 * The few envelopes below (lists, admin bodies) are not in `protocol` yet; they mirror the routes
 * that answer them (routes/tasks.ts, routes/sessions.ts, routes/admin.ts).
 */

const SCHEMA_REF = "#/components/schemas/";
const ref = (name: string) => ({ $ref: `${SCHEMA_REF}${name}` });

// Envelopes the routes answer (see the files named above).
const TaskPage = z.object({ tasks: z.array(TaskRecord), next_cursor: z.string().nullable() });
const BatchAccepted = z.object({ tasks: z.array(TaskAccepted) });
const CancelAnswer = z.object({ id: z.string(), status: z.enum(["cancelled", "cancelling"]) });
const CompletionList = z.object({ session_id: z.string(), completions: z.array(CompletionRecord) });
const PauseRequest = z
  .object({
    mode: z
      .enum(["drain", "abort"])
      .default("drain")
      .describe(
        "drain: in-flight calls finish; abort: each engine pauses at once, the way its preflight says (keep: frozen in place and resumed on the new weights; abort_continue: cut and continued token-in by the gateway; drain when neither is possible)",
      ),
    timeout_s: z.number().nonnegative().max(3600).default(60).describe("how long to wait for in-flight calls of every replica"),
  })
  .strict();
const PauseAnswer = z.object({
  paused: z.literal(true),
  mode: z.enum(["drain", "abort"]),
  id: z.string(),
  inflight_at_pause: z.number().int(),
  drained: z.boolean(),
  still_inflight: z.number().int(),
  frozen: z.number().int().describe("calls frozen in place on engines that keep them (they go on after resume)"),
  engines: z.array(z.record(z.string(), z.unknown())).describe("per engine: the pause route's answer, the plan (keep, abort_continue, drain) and why"),
});
const ResumeAnswer = z.object({ paused: z.literal(false), was_paused: z.boolean(), engines: z.array(z.record(z.string(), z.unknown())) });
const InferenceState = z.object({ paused: z.record(z.string(), z.unknown()).nullable(), inflight: z.number().int() });
const WeightsRequest = z.object({ version: z.union([z.string().min(1).max(128), z.number().int().nonnegative()]) }).strict();
const WeightsAnswer = z.object({ version: z.string().nullable() });
const InferenceWeightsRequest = z
  .object({
    version: z.union([z.string().min(1).max(128), z.number().int().nonnegative()]),
    load: WeightLoad.optional().describe("`{path}`: a checkpoint folder every engine can read; `{lora: {name, path}}`: a LoRA adapter, loaded (or replaced) under `name`. Needs inference paused."),
  })
  .strict();
const EngineLoad = z.object({
  index: z.number().int(),
  kind: z.string(),
  url: z.string(),
  ok: z.boolean(),
  ranks: z.array(z.object({ dp_rank: z.number().int(), loaded: z.boolean().describe("true only when the engine confirmed this rank loaded"), detail: z.string() })),
  steps: z.array(z.object({ route: z.string(), status: z.number().int().nullable(), detail: z.string() })).describe("the engine routes called, in order"),
  engine_weight_version: z.string().nullable(),
});
const InferenceWeightsAnswer = z.object({
  version: z.string(),
  previous_version: z.string().nullable(),
  load: z.record(z.string(), z.unknown()).nullable(),
  engines: z.array(EngineLoad),
});
const EnginesAnswer = z.object({
  engines: z.array(
    z.object({
      index: z.number().int(),
      kind: z.string(),
      url: z.string(),
      dp_size: z.number().int(),
      profile: z.string().describe("the engine's model profile"),
      preflight: Preflight.nullable().describe("what will hold on the engine before a run; null while still running"),
      ranks: z.array(
        z.object({
          dp_rank: z.number().int(),
          healthy: z.boolean(),
          sessions: z.number().describe("open sessions assigned to the rank"),
          inflight: z.number().int().describe("engine calls in flight on the rank, all replicas"),
          recent_calls: z
            .object({ calls: z.number().int(), p50_ms: z.number(), p95_ms: z.number() })
            .nullable()
            .describe("latency of the rank's last calls (up to 100) through this replica; null before the first"),
          last_probe_latency_ms: z.number().nullable(),
          last_probe: z.string().nullable(),
          detail: z.string().nullable(),
        }),
      ),
    }),
  ),
  inflight_this_replica: z.number().int(),
});

const INPUT_SCHEMAS: Record<string, z.ZodType> = { Task, BatchRequest, CreateSessionRequest, PauseRequest, WeightsRequest, InferenceWeightsRequest };
const OUTPUT_SCHEMAS: Record<string, z.ZodType> = {
  TaskAccepted,
  TaskRecord,
  TaskResult,
  TaskEvent,
  TaskPage,
  BatchAccepted,
  CancelAnswer,
  Session,
  CreateSessionResponse,
  CompletionRecord,
  CompletionList,
  Trajectory,
  Trace,
  ErrorBody,
  PauseAnswer,
  ResumeAnswer,
  InferenceState,
  WeightsAnswer,
  InferenceWeightsAnswer,
  EngineLoad,
  EnginesAnswer,
  Readiness,
  Preflight,
  DecodedTrajectory,
};

type Json = Record<string, unknown>;

/** One registry of named schemas → `components.schemas` entries that `$ref` each other. */
function componentSchemas(named: Record<string, z.ZodType>, io: "input" | "output"): Record<string, Json> {
  const registry = z.registry<{ id: string }>();
  for (const [id, schema] of Object.entries(named)) registry.add(schema, { id });
  const out = z.toJSONSchema(registry, { target: "draft-2020-12", io, unrepresentable: "any", uri: (id) => `${SCHEMA_REF}${id}` });
  const schemas: Record<string, Json> = {};
  for (const [id, schema] of Object.entries(out.schemas)) {
    const { $schema: _s, $id: _i, ...rest } = schema as Json;
    schemas[id] = rest;
  }
  return schemas;
}

/** `$defs` nested in a component would resolve against the document root: hoist them into components. */
function hoistDefs(schemas: Record<string, Json>): void {
  for (const [name, schema] of Object.entries(schemas)) {
    const defs = schema.$defs as Record<string, Json> | undefined;
    if (!defs) continue;
    delete schema.$defs;
    const rename = (def: string) => `${name}_${def}`;
    for (const [def, s] of Object.entries(defs)) schemas[rename(def)] = s;
    const rewrite = (node: unknown): void => {
      if (Array.isArray(node)) return node.forEach(rewrite);
      if (!node || typeof node !== "object") return;
      const o = node as Json;
      if (typeof o.$ref === "string" && o.$ref.startsWith("#/$defs/")) o.$ref = `${SCHEMA_REF}${rename(o.$ref.slice(8))}`;
      Object.values(o).forEach(rewrite);
    };
    rewrite(schema);
    for (const def of Object.keys(defs)) rewrite(schemas[rename(def)]);
  }
}

const json = (schema: Json) => ({ "application/json": { schema } });
const errors = (...codes: number[]) =>
  Object.fromEntries(codes.map((c) => [String(c), { description: ERROR_TEXT[c] ?? "error", content: json(ref("ErrorBody")) }]));
const ERROR_TEXT: Record<number, string> = {
  400: "invalid request (error.details names each bad field)",
  401: "missing or wrong API key",
  404: "not found",
  409: "conflict",
  422: "the records violate a trajectory invariant",
  502: "an engine failed, is unreachable, or did not do what was asked (error.details says which)",
  503: "no engine rank is available",
};
const pathParam = (name: string, description: string) => ({ name, in: "path", required: true, schema: { type: "string" }, description });
const TASK_ID = pathParam("id", "task id");
const SESSION_ID = pathParam("id", "session id");
const SID = pathParam("sid", "session id (the session token authenticates it)");
const TRAINER = [{ apiKey: [] }];
const AGENT = [{ sessionBearer: [] }, { sessionApiKey: [] }, { sessionGoogApiKey: [] }, { sessionQueryKey: [] }];
const OPEN_OBJECT = { type: "object", additionalProperties: true };

/** Query parameters from a zod object schema (input side: coercions and defaults as a client sees them). */
function queryParams(schema: z.ZodObject, descriptions: Record<string, string> = {}) {
  const js = z.toJSONSchema(schema, { target: "draft-2020-12", io: "input", unrepresentable: "any" }) as Json;
  const props = (js.properties ?? {}) as Record<string, Json>;
  const required = new Set((js.required ?? []) as string[]);
  return Object.entries(props).map(([name, s]) => ({
    name,
    in: "query",
    required: required.has(name),
    schema: s,
    ...(descriptions[name] ? { description: descriptions[name] } : {}),
  }));
}

function agentOp(summary: string, description: string, extra: Json = {}) {
  return {
    tags: ["agent"],
    summary,
    description,
    security: AGENT,
    parameters: [SID],
    requestBody: { required: true, content: json({ ...OPEN_OBJECT, description: "the client protocol's request body" }) },
    responses: {
      "200": {
        description: "the client protocol's answer (Server-Sent Events when the request streams)",
        content: { ...json({ ...OPEN_OBJECT }), "text/event-stream": { schema: { type: "string" } } },
      },
      "400": { description: "invalid request, in the client protocol's error shape", content: json(OPEN_OBJECT) },
      "401": { description: "invalid session token, in the client protocol's error shape", content: json(OPEN_OBJECT) },
      "403": { description: "the session is closed", content: json(OPEN_OBJECT) },
      "502": { description: "the engine failed", content: json(OPEN_OBJECT) },
    },
    ...extra,
  };
}

function geminiOp(action: string, summary: string) {
  return {
    post: agentOp(summary, `Gemini \`models/{model}:${action}\` (also served under \`/s/{sid}/v1/…\`). The token may be given as \`?key=\`.`, {
      parameters: [SID, pathParam("model", "any model name: the session's model answers")],
    }),
  };
}

const html = (description: string) => ({ "200": { description, content: { "text/html": { schema: { type: "string" } } } } });

function buildPaths(): Json {
  return {
    "/v1/tasks": {
      post: {
        tags: ["tasks"],
        summary: "Submit a task",
        description: "Validates and enqueues one task. Re-submitting the same `id` is idempotent.",
        security: TRAINER,
        requestBody: { required: true, content: json(ref("Task")) },
        responses: { "202": { description: "accepted", content: json(ref("TaskAccepted")) }, ...errors(400, 401) },
      },
      get: {
        tags: ["tasks"],
        summary: "List tasks",
        description: "Newest first; `cursor` is the `next_cursor` of the previous page.",
        security: TRAINER,
        parameters: queryParams(TaskListQuery),
        responses: { "200": { description: "a page of tasks", content: json(ref("TaskPage")) }, ...errors(400, 401) },
      },
    },
    "/v1/tasks/batch": {
      post: {
        tags: ["tasks"],
        summary: "Submit tasks or a GRPO group",
        description: "`{tasks: [...]}`, or `{group_id, n, task}` expanding into `n` tasks `<group_id>-<k>` sharing one routing affinity.",
        security: TRAINER,
        requestBody: { required: true, content: json(ref("BatchRequest")) },
        responses: { "202": { description: "accepted", content: json(ref("BatchAccepted")) }, ...errors(400, 401) },
      },
    },
    "/v1/tasks/{id}": {
      get: {
        tags: ["tasks"],
        summary: "A task",
        description: "Status, timings, attempts, callback delivery state, and the result when terminal.",
        security: TRAINER,
        parameters: [TASK_ID],
        responses: { "200": { description: "the task", content: json(ref("TaskRecord")) }, ...errors(401, 404) },
      },
      delete: {
        tags: ["tasks"],
        summary: "Cancel a task",
        description: "A queued task never starts (200 `cancelled`); a running one has its sandbox killed (202 `cancelling`).",
        security: TRAINER,
        parameters: [TASK_ID],
        responses: {
          "200": { description: "cancelled", content: json(ref("CancelAnswer")) },
          "202": { description: "cancelling", content: json(ref("CancelAnswer")) },
          ...errors(401, 404, 409),
        },
      },
    },
    "/v1/tasks/{id}/events": {
      get: {
        tags: ["tasks"],
        summary: "A task's lifecycle as Server-Sent Events",
        description: "One `TaskEvent` per SSE message (`event:` is its type); ends after `terminal`. Resumes after `Last-Event-ID` or `?after=`.",
        security: TRAINER,
        parameters: [TASK_ID, { name: "after", in: "query", required: false, schema: { type: "string" }, description: "event id to resume after" }],
        responses: {
          "200": { description: "an SSE stream of TaskEvent", content: { "text/event-stream": { schema: ref("TaskEvent") } } },
          ...errors(401, 404),
        },
      },
    },
    "/v1/tasks/{id}/logs": {
      get: {
        tags: ["tasks"],
        summary: "The agent's output so far",
        security: TRAINER,
        parameters: [TASK_ID],
        responses: { "200": { description: "the log tail", content: { "text/plain": { schema: { type: "string" } } } }, ...errors(401, 404) },
      },
    },
    "/v1/sessions": {
      post: {
        tags: ["sessions"],
        summary: "Open a session",
        description: "Assigns an engine rank; the answer holds the session token (shown once) and the base URLs for each client protocol.",
        security: TRAINER,
        requestBody: { required: false, content: json(ref("CreateSessionRequest")) },
        responses: { "201": { description: "opened", content: json(ref("CreateSessionResponse")) }, ...errors(400, 401, 409, 503) },
      },
    },
    "/v1/sessions/{id}": {
      get: {
        tags: ["sessions"],
        summary: "A session",
        description: "State, assigned (engine, dp_rank), counts.",
        security: TRAINER,
        parameters: [SESSION_ID],
        responses: { "200": { description: "the session", content: json(ref("Session")) }, ...errors(401, 404) },
      },
      delete: {
        tags: ["sessions"],
        summary: "Drop a session and its records",
        security: TRAINER,
        parameters: [SESSION_ID],
        responses: { "204": { description: "dropped" }, ...errors(401, 404) },
      },
    },
    "/v1/sessions/{id}/close": {
      post: {
        tags: ["sessions"],
        summary: "Close a session",
        description: "No further LLM calls are accepted.",
        security: TRAINER,
        parameters: [SESSION_ID],
        responses: { "200": { description: "the closed session", content: json(ref("Session")) }, ...errors(401, 404) },
      },
    },
    "/v1/sessions/{id}/completions": {
      get: {
        tags: ["sessions"],
        summary: "The raw completion records",
        security: TRAINER,
        parameters: [SESSION_ID],
        responses: { "200": { description: "records in order", content: json(ref("CompletionList")) }, ...errors(401, 404) },
      },
    },
    "/v1/sessions/{id}/trajectory": {
      get: {
        tags: ["sessions"],
        summary: "The session's trajectory",
        description: "Traces and stats (`format=rollgate`), or `{builder, format, samples}` in a trainer's format.",
        security: TRAINER,
        parameters: [
          SESSION_ID,
          { name: "builder", in: "query", required: false, schema: { type: "string", enum: TrajectoryBuilderName.options, default: "prefix_merging" } },
          { name: "format", in: "query", required: false, schema: { type: "string", enum: [...TRAINER_FORMATS], default: "rollgate" } },
        ],
        responses: {
          "200": { description: "the trajectory", content: json({ oneOf: [ref("Trajectory"), OPEN_OBJECT] }) },
          ...errors(400, 401, 404, 422),
        },
      },
    },
    "/v1/sessions/{id}/trajectory/decoded": {
      get: {
        tags: ["sessions"],
        summary: "The session's trajectory as text",
        description:
          "Each trace decoded by the engine that produced its tokens (its own `/detokenize`, cached): the prompt, and the response as runs of trainable (loss_mask 1) and masked tokens. What the dashboard and `rollgate trajectory --decode` show.",
        security: TRAINER,
        parameters: [SESSION_ID, { name: "builder", in: "query", required: false, schema: { type: "string", enum: TrajectoryBuilderName.options, default: "prefix_merging" } }],
        responses: {
          "200": { description: "the decoded trajectory", content: json(ref("DecodedTrajectory")) },
          ...errors(400, 401, 404, 409, 422, 502),
        },
      },
    },
    "/s/{sid}/v1/chat/completions": { post: agentOp("OpenAI Chat Completions", "OpenAI Chat Completions, streamed (`stream: true`) or not.") },
    "/s/{sid}/v1/responses": { post: agentOp("OpenAI Responses", "OpenAI Responses API, streamed or not.") },
    "/s/{sid}/v1/messages": { post: agentOp("Anthropic Messages", "Anthropic Messages, streamed or not.") },
    "/s/{sid}/v1/messages/count_tokens": { post: agentOp("Anthropic count_tokens", "Prompt tokens of a Messages request on the session's engine; records nothing.") },
    "/s/{sid}/v1beta/models/{model}:generateContent": geminiOp("generateContent", "Gemini generateContent"),
    "/s/{sid}/v1beta/models/{model}:streamGenerateContent": geminiOp("streamGenerateContent", "Gemini streamGenerateContent"),
    "/s/{sid}/v1beta/models/{model}:countTokens": geminiOp("countTokens", "Gemini countTokens"),
    "/s/{sid}/v1/models": {
      get: {
        tags: ["agent"],
        summary: "The served model (OpenAI shape)",
        security: AGENT,
        parameters: [SID],
        responses: { "200": { description: "model list", content: json(OPEN_OBJECT) }, "401": { description: "invalid session token", content: json(OPEN_OBJECT) } },
      },
    },
    "/s/{sid}/v1beta/models": {
      get: {
        tags: ["agent"],
        summary: "The served model (Gemini shape)",
        security: AGENT,
        parameters: [SID],
        responses: { "200": { description: "model list", content: json(OPEN_OBJECT) }, "401": { description: "invalid session token", content: json(OPEN_OBJECT) } },
      },
    },
    "/admin/inference/pause": {
      post: {
        tags: ["admin"],
        summary: "Pause inference on every replica",
        description: "New engine calls wait (agents are not failed). drain: in-flight calls finish, then the engines' own pause routes are called. abort: the engines are paused at once, cutting in-flight calls, which the gateway continues from their tokens after resume (one answer per call; records keep each token's weight version).",
        security: TRAINER,
        requestBody: { required: false, content: json(ref("PauseRequest")) },
        responses: { "200": { description: "paused", content: json(ref("PauseAnswer")) }, ...errors(400, 401) },
      },
    },
    "/admin/inference/resume": {
      post: {
        tags: ["admin"],
        summary: "Resume inference",
        security: TRAINER,
        responses: { "200": { description: "resumed", content: json(ref("ResumeAnswer")) }, ...errors(401) },
      },
    },
    "/admin/inference": {
      get: {
        tags: ["admin"],
        summary: "Pause state and calls in flight",
        security: TRAINER,
        responses: { "200": { description: "state", content: json(ref("InferenceState")) }, ...errors(401) },
      },
    },
    "/admin/weights": {
      post: {
        tags: ["admin"],
        summary: "Set the policy weight version",
        description: "Stamped on every completion (and token) from now on.",
        security: TRAINER,
        requestBody: { required: true, content: json(ref("WeightsRequest")) },
        responses: { "200": { description: "set", content: json(ref("WeightsAnswer")) }, ...errors(400, 401) },
      },
      get: {
        tags: ["admin"],
        summary: "The policy weight version",
        security: TRAINER,
        responses: { "200": { description: "the version", content: json(ref("WeightsAnswer")) }, ...errors(401) },
      },
    },
    "/admin/inference/weights": {
      post: {
        tags: ["admin"],
        summary: "Set the weight version, loading new weights on every engine",
        description:
          "Without `load`: the same as `POST /admin/weights`. With `load` (only while paused, else 409): every engine loads the weights through its own route (vLLM `/collective_rpc` update_config + reload_weights or `/v1/load_lora_adapter`; SGLang `/update_weights_from_disk` or `/load_lora_adapter`), and the version moves only when every engine confirmed it. Otherwise 502 `weights_load_failed` whose `details.engines` says per engine and rank what loaded; the version stays and inference stays paused.",
        security: TRAINER,
        requestBody: { required: true, content: json(ref("InferenceWeightsRequest")) },
        responses: { "200": { description: "loaded (if asked) and set", content: json(ref("InferenceWeightsAnswer")) }, ...errors(400, 401, 409, 502) },
      },
    },
    "/admin/engines": {
      get: {
        tags: ["admin"],
        summary: "Engines, their preflight and their ranks",
        description:
          "Per engine: its model profile and preflight (what will hold before a run: vocabulary, token-in and its route, whether tool-calling turns re-render to their ids, whether the template drops reasoning at new user turns, what an abort-mode pause does). Per (engine, dp_rank): health, open sessions, in-flight calls, recent call latency and the last probe.",
        security: TRAINER,
        parameters: [
          { name: "refresh", in: "query", required: false, schema: { type: "string", enum: ["true", "false"] }, description: "run every engine's preflight again" },
          { name: "wait_s", in: "query", required: false, schema: { type: "number", minimum: 0, maximum: 120, default: 30 }, description: "how long to wait for a preflight still running (null after)" },
        ],
        responses: { "200": { description: "engines", content: json(ref("EnginesAnswer")) }, ...errors(400, 401) },
      },
    },
    "/admin/queues": {
      get: {
        tags: ["operations"],
        summary: "bull-board: the BullMQ queues (rollouts, callbacks)",
        description: "An HTML UI. With ROLLGATE_API_KEY set, give the key as `Authorization: Bearer`, or once as `?key=` (a cookie keeps it for the UI's own requests).",
        security: [{ apiKey: [] }, { adminQueryKey: [] }, { adminCookie: [] }],
        responses: { ...html("the bull-board UI"), ...errors(401) },
      },
    },
    "/healthz": { get: { tags: ["operations"], summary: "Liveness", responses: { "200": { description: "alive", content: json(OPEN_OBJECT) } } } },
    "/readyz": {
      get: {
        tags: ["operations"],
        summary: "Readiness: Redis answers and every engine has a rank that answers and a known model",
        description: "503 until then, with the reason per engine. Workers take no tasks while it is 503 (the queue holds them).",
        responses: { "200": { description: "ready", content: json(ref("Readiness")) }, "503": { description: "not ready, and why", content: json(ref("Readiness")) } },
      },
    },
    "/metrics": {
      get: {
        tags: ["operations"],
        summary: "Prometheus metrics",
        description: "Text exposition format. Requires the API key when ROLLGATE_API_KEY is set.",
        security: TRAINER,
        responses: { "200": { description: "metrics", content: { "text/plain": { schema: { type: "string" } } } }, ...errors(401) },
      },
    },
    "/docs": { get: { tags: ["operations"], summary: "This document, rendered", responses: html("the API reference page") } },
    "/docs/openapi.json": {
      get: { tags: ["operations"], summary: "This document", responses: { "200": { description: "OpenAPI 3.1", content: json(OPEN_OBJECT) } } },
    },
    "/dashboard": { get: { tags: ["operations"], summary: "The web dashboard", responses: html("the dashboard page") } },
  };
}

let cached: Json | null = null;

/** The OpenAPI document (built once per process: it depends on nothing but the schemas). */
export function openApiDocument(): Json {
  if (cached) return cached;
  const schemas = { ...componentSchemas(INPUT_SCHEMAS, "input"), ...componentSchemas(OUTPUT_SCHEMAS, "output") };
  hoistDefs(schemas);
  cached = {
    openapi: "3.1.0",
    info: {
      title: "rollgate",
      version: "1",
      description:
        "A rollout gateway for agentic RL. Trainer and admin routes take `Authorization: Bearer <ROLLGATE_API_KEY>` when a key is configured; agent-facing routes (`/s/{sid}/…`) take the session's token. Errors of trainer and admin routes are `ErrorBody`; agent routes answer errors in their client's protocol shape.",
    },
    jsonSchemaDialect: "https://json-schema.org/draft/2020-12/schema",
    tags: [
      { name: "tasks", description: "Trainer-facing rollout tasks" },
      { name: "sessions", description: "Sessions: one rollout's window onto the engines" },
      { name: "agent", description: "Agent-facing LLM endpoints of a session, in each client's protocol" },
      { name: "admin", description: "The RL loop: pause/resume, weight version, engines" },
      { name: "operations", description: "Health, metrics, docs, queues, dashboard" },
    ],
    paths: buildPaths(),
    components: {
      schemas,
      securitySchemes: {
        apiKey: { type: "http", scheme: "bearer", description: "ROLLGATE_API_KEY (only when one is configured)" },
        adminQueryKey: { type: "apiKey", in: "query", name: "key", description: "ROLLGATE_API_KEY, for /admin/queues only" },
        adminCookie: { type: "apiKey", in: "cookie", name: "rollgate_admin", description: "set by /admin/queues after a valid ?key=" },
        sessionBearer: { type: "http", scheme: "bearer", description: "the session token (OpenAI SDKs)" },
        sessionApiKey: { type: "apiKey", in: "header", name: "x-api-key", description: "the session token (Anthropic SDKs)" },
        sessionGoogApiKey: { type: "apiKey", in: "header", name: "x-goog-api-key", description: "the session token (Gemini SDKs)" },
        sessionQueryKey: { type: "apiKey", in: "query", name: "key", description: "the session token (Gemini SDKs)" },
      },
    },
  };
  return cached;
}
