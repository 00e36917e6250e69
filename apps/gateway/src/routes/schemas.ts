import {
  BatchRequest,
  ClosedSession,
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
  TaskRecord,
  TaskResult,
  Trace,
  Trajectory,
} from "@rollgate/protocol";
import type { FastifySchemaCompiler } from "fastify";
import { z } from "zod";

/**
 * What every route declares through: the zod schemas of its params, query, body and answers
 * (Fastify validates with them; @fastify/swagger documents them, routes/docs.ts), and the named
 * schemas the OpenAPI document lists once under `components.schemas` and `$ref`s everywhere else.
 */

/**
 * Named schemas: `components.schemas.<id>` (answers) and `<id>Input` (request bodies). zod's
 * global registry, because that is also where `.describe()` keeps field descriptions: the document
 * generator reads both from the one registry it is given.
 */
export const apiSchemas = z.globalRegistry;

/** Registers a schema under a component name and returns it. */
export function named<T extends z.ZodType>(id: string, schema: T): T {
  if (!apiSchemas.has(schema)) apiSchemas.add(schema, { id });
  return schema;
}

for (const [id, schema] of Object.entries({
  Task,
  BatchRequest,
  TaskAccepted,
  TaskRecord,
  TaskResult,
  TaskEvent,
  Session,
  ClosedSession,
  CreateSessionRequest,
  CreateSessionResponse,
  CompletionRecord,
  Trajectory,
  Trace,
  ErrorBody,
  Readiness,
  Preflight,
  DecodedTrajectory,
})) {
  named(id, schema as z.ZodType);
}

/**
 * Validation keeps zod's own error: each audience's error handler (errors.ts for trainer routes,
 * the agent protocols' in routes/agent-*.ts) names the bad fields in its own shape, descending
 * into unions, which the flattened list fastify-type-provider-zod's compiler returns cannot do.
 * Fastify marks the error 400 and passes it to the route's error handler.
 */
export const zodValidatorCompiler: FastifySchemaCompiler<z.ZodType> =
  ({ schema }) =>
  (data) => {
    const result = schema.safeParse(data);
    return result.success ? { value: result.data } : { error: result.error };
  };

const ERROR_TEXT = {
  400: "invalid request (error.details names each bad field)",
  401: "missing or wrong API key",
  404: "not found",
  409: "conflict",
  422: "the records violate a trajectory invariant",
  502: "an engine failed, is unreachable, or did not do what was asked (error.details says which)",
  503: "no engine rank is available, or the store (Redis) is unreachable",
} as const;
type ErrorCode = keyof typeof ERROR_TEXT;

/** The error answers of a trainer/admin route, each an ErrorBody. */
export function errorResponses<C extends ErrorCode>(...codes: C[]) {
  type Answer = { description: string; content: { "application/json": { schema: typeof ErrorBody } } };
  return Object.fromEntries(codes.map((c) => [c, { description: ERROR_TEXT[c] as string, content: { "application/json": { schema: ErrorBody } } }])) as unknown as Record<C, Answer>;
}

/** Security requirements, as the OpenAPI document names the schemes (routes/docs.ts). */
export const TRAINER_SECURITY: Record<string, string[]>[] = [{ apiKey: [] }];
export const AGENT_SECURITY: Record<string, string[]>[] = [{ sessionBearer: [] }, { sessionApiKey: [] }, { sessionGoogApiKey: [] }, { sessionQueryKey: [] }];

/** A task or session id in the path. */
export const IdParams = z.object({ id: z.string().min(1).max(256) });
/** The session id of an agent-facing route (its token authenticates it). */
export const SidParams = z.object({ sid: z.string().describe("session id (the session token authenticates it)") });

/** A text answer (logs, metrics, pages): documented by content type, sent as is. */
export function textResponse(contentType: string, description: string) {
  return { description, content: { [contentType]: { schema: z.string() } } };
}
