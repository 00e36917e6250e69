import fastifySwagger from "@fastify/swagger";
import fastifySwaggerUi from "@fastify/swagger-ui";
import type { FastifyInstance } from "fastify";
import { createJsonSchemaTransform, createJsonSchemaTransformObject } from "fastify-type-provider-zod";
import { QUEUES_BASE_PATH } from "./queues.js";
import { apiSchemas } from "./schemas.js";

/**
 * Routes served but left out of the OpenAPI document, and why: each is an asset or the private
 * API of a page the document does list (`/docs`, `/dashboard`, `/admin/queues`).
 */
export const UNDOCUMENTED_PREFIXES = [
  // The dashboard page's own scripts and styles.
  "/dashboard/",
  // bull-board's JSON API and assets, called by its page only.
  "/admin/queues/",
];

/** Pages another package registers (hidden there), documented here. */
const PAGES: Record<string, object> = {
  [QUEUES_BASE_PATH]: {
    tags: ["operations"],
    summary: "bull-board: the BullMQ queues (rollouts, callbacks)",
    description: "An HTML UI. With ROLLGATE_API_KEY set, give the key as `Authorization: Bearer`, or once as `?key=` (a cookie keeps it for the UI's own requests).",
    security: [{ apiKey: [] }, { adminQueryKey: [] }, { adminCookie: [] }],
  },
};

const zodTransform = createJsonSchemaTransform({ schemaRegistry: apiSchemas, skipList: [] });
const transform: typeof zodTransform = (route) => {
  // bull-board's page route reaches the document as `/admin/queues/`: it is served without the slash too.
  const url = route.url.replace(/\/$/, "") || "/";
  const page = PAGES[url];
  if (page) return { schema: page, url };
  if (UNDOCUMENTED_PREFIXES.some((p) => route.url.startsWith(p))) return { schema: { hide: true }, url: route.url };
  return zodTransform(route);
};

/**
 * The OpenAPI 3.1 document, generated from every route's declared zod schemas
 * (fastify-type-provider-zod's transform), at `GET /docs/json` (and `/docs/yaml`), with Swagger UI
 * at `GET /docs`, its assets served from the npm package (nothing from a CDN, works offline).
 * Registered before any route: @fastify/swagger collects routes as they are added. Open to
 * everyone: the document holds no secret and describes only the public API.
 */
export async function registerDocs(app: FastifyInstance): Promise<void> {
  await app.register(fastifySwagger, {
    openapi: {
      openapi: "3.1.0",
      info: {
        title: "rollgate",
        version: "1",
        description:
          "A rollout gateway for agentic RL. Trainer and admin routes take `Authorization: Bearer <ROLLGATE_API_KEY>` when a key is configured; agent-facing routes (`/s/{sid}/…`) take the session's token. Errors of trainer and admin routes are `ErrorBody`; agent routes answer errors in their client's protocol shape.",
      },
      tags: [
        { name: "tasks", description: "Trainer-facing rollout tasks" },
        { name: "sessions", description: "Sessions: one rollout's window onto the engines" },
        { name: "stats", description: "Aggregates over recent tasks and the engines (what the dashboard shows)" },
        { name: "agent", description: "Agent-facing LLM endpoints of a session, in each client's protocol" },
        { name: "admin", description: "The RL loop: pause/resume, weight version, engines" },
        { name: "operations", description: "Health, metrics, docs, queues, dashboard" },
      ],
      components: {
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
    },
    transform,
    transformObject: createJsonSchemaTransformObject({ schemaRegistry: apiSchemas }),
  });
  await app.register(fastifySwaggerUi, { routePrefix: "/docs", staticCSP: true });
}
