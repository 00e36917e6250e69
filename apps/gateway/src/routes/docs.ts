import type { FastifyPluginAsync } from "fastify";
import { renderDocsHtml } from "../observability/docs-html.js";
import { openApiDocument } from "../observability/openapi.js";

/**
 * `GET /docs/openapi.json`: the OpenAPI 3.1 document generated from the protocol's zod schemas;
 * `GET /docs`: the same rendered as one self-contained HTML page (no script, nothing fetched).
 * Open to everyone: the document holds no secret and describes only the public API.
 */
export function docsRoutes(): FastifyPluginAsync {
  return async (app) => {
    let html: string | null = null;
    app.get("/docs/openapi.json", async () => openApiDocument());
    app.get("/docs", async (_req, reply) => {
      html ??= renderDocsHtml(openApiDocument());
      return reply.type("text/html; charset=utf-8").send(html);
    });
  };
}
