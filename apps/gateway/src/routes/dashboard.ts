import { readFile, readdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyPluginAsync, FastifyReply } from "fastify";
import { errorBody } from "../errors.js";
import { textResponse } from "./schemas.js";

/**
 * The web dashboard (`GET /dashboard`, nothing fetched from elsewhere): the HTML, CSS and icon from
 * `apps/gateway/dashboard/`, and its script, `dashboard/src/app.ts`, as the gateway's build compiled
 * it into `dist/dashboard/app.js`. The page itself needs no key; the JSON it reads (the task and
 * session API, routes/stats.ts) does: the page asks for the key and sends it as a Bearer token.
 */

const APP_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
/** Where each kind of file is served from: the script from the build, the rest as written. */
const STATIC_DIRS = [path.join(APP_DIR, "dist/dashboard"), path.join(APP_DIR, "dashboard")];
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
    // Each servable file name → its directory (the first directory that has it wins).
    const files = new Map<string, string>();
    for (const dir of STATIC_DIRS) {
      for (const name of await readdir(dir).catch(() => [] as string[])) if (CONTENT_TYPES[path.extname(name)] && !files.has(name)) files.set(name, dir);
    }
    async function sendStatic(name: string, reply: FastifyReply) {
      const dir = files.get(name);
      if (!dir) return reply.code(404).send(errorBody("not_found", `no dashboard file ${name}`));
      const body = await readFile(path.join(dir, name));
      return reply.type(CONTENT_TYPES[path.extname(name)]!).header("cache-control", "no-cache").send(body);
    }
    const page = { schema: { tags: ["operations"], summary: "The web dashboard", response: { 200: textResponse("text/html", "the dashboard page") } } };
    app.get("/dashboard", page, (_req, reply) => sendStatic("index.html", reply));
    app.get("/dashboard/", (_req, reply) => sendStatic("index.html", reply));
    app.get("/dashboard/:file", (req, reply) => sendStatic((req.params as { file: string }).file, reply));
  };
}
