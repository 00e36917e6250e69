import { readFile, readdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyPluginAsync, FastifyReply } from "fastify";
import { errorBody } from "../errors.js";
import { textResponse } from "./schemas.js";

/**
 * The web dashboard (`GET /dashboard`: plain HTML/CSS/JS from `apps/gateway/dashboard/`, no build
 * step, nothing fetched from elsewhere). The page itself needs no key; the JSON it reads (the task
 * and session API, routes/stats.ts) does: the page asks for the key and sends it as a Bearer token.
 */

const STATIC_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../dashboard");
const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
};

export function dashboardRoutes(): FastifyPluginAsync {
  return async (app) => {
    // ── the page and its static files (no key: the page asks for one) ──
    const files = new Set(await readdir(STATIC_DIR).catch(() => [] as string[]));
    async function sendStatic(name: string, reply: FastifyReply) {
      if (!files.has(name) || !CONTENT_TYPES[path.extname(name)]) return reply.code(404).send(errorBody("not_found", `no dashboard file ${name}`));
      const body = await readFile(path.join(STATIC_DIR, name));
      return reply.type(CONTENT_TYPES[path.extname(name)]!).header("cache-control", "no-cache").send(body);
    }
    const page = { schema: { tags: ["operations"], summary: "The web dashboard", response: { 200: textResponse("text/html", "the dashboard page") } } };
    app.get("/dashboard", page, (_req, reply) => sendStatic("index.html", reply));
    app.get("/dashboard/", (_req, reply) => sendStatic("index.html", reply));
    app.get("/dashboard/:file", (req, reply) => sendStatic((req.params as { file: string }).file, reply));
  };
}
