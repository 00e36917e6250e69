import { createHash } from "node:crypto";
import { createBullBoard } from "@bull-board/api";
import { BullMQAdapter } from "@bull-board/api/bullMQAdapter";
import { FastifyAdapter } from "@bull-board/fastify";
import { secretsEqual } from "@rollgate/protocol";
import { callbackQueue } from "@rollgate/queue";
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import type { GatewayContext } from "../context.js";
import { errorBody } from "../errors.js";

export const QUEUES_BASE_PATH = "/admin/queues";
const COOKIE = "rollgate_admin";

/** The cookie holds a hash of the key, never the key itself. */
function cookieToken(apiKey: string): string {
  return createHash("sha256").update(`rollgate-admin-cookie\0${apiKey}`).digest("base64url");
}

function cookie(req: FastifyRequest, name: string): string | undefined {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const i = part.indexOf("=");
    if (i > 0 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim();
  }
  return undefined;
}

/**
 * The admin key for a browser UI: bull-board's page loads scripts and calls its JSON API itself,
 * so besides `Authorization: Bearer <key>` the key may be given once as `?key=<key>`. That sets an
 * HttpOnly, SameSite=Strict cookie scoped to /admin/queues (holding a hash of the key) and, for a
 * page load, redirects to the same URL without the key, so it stays out of the address bar.
 */
function requireAdminKey(apiKey: string | undefined) {
  return async (req: FastifyRequest, reply: FastifyReply) => {
    if (!apiKey) return;
    const auth = req.headers.authorization;
    if (auth?.startsWith("Bearer ") && secretsEqual(auth.slice(7).trim(), apiKey)) return;
    const expected = cookieToken(apiKey);
    const fromCookie = cookie(req, COOKIE);
    if (fromCookie && secretsEqual(fromCookie, expected)) return;
    const key = (req.query as Record<string, unknown> | undefined)?.key;
    if (typeof key === "string" && secretsEqual(key, apiKey)) {
      reply.header("set-cookie", `${COOKIE}=${expected}; Path=${QUEUES_BASE_PATH}; HttpOnly; SameSite=Strict`);
      if (req.method === "GET" && (req.headers.accept ?? "").includes("text/html")) {
        const url = new URL(req.url, "http://gateway");
        url.searchParams.delete("key");
        return reply.redirect(`${url.pathname}${url.search}`, 303);
      }
      return;
    }
    return reply
      .code(401)
      .send(errorBody("unauthorized", `missing or wrong API key (Authorization: Bearer <key>, or open ${QUEUES_BASE_PATH}?key=<key> once)`));
  };
}

/**
 * bull-board at `/admin/queues`: the rollouts queue read-only (removing a job there would strand
 * its task; cancel through DELETE /v1/tasks/:id), the callbacks queue with retries allowed.
 */
export function queueBoardRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    const callbacks = callbackQueue({ connection: ctx.queueRedis, keyPrefix: ctx.env.ROLLGATE_KEY_PREFIX, attempts: 1, backoffMs: 1000 });
    callbacks.on("error", (err) => ctx.log.warn({ err: err.message }, "callbacks queue error (bull-board)"));
    app.addHook("onClose", async () => {
      await callbacks.close().catch(() => undefined);
    });
    const serverAdapter = new FastifyAdapter();
    serverAdapter.setBasePath(QUEUES_BASE_PATH);
    createBullBoard({
      queues: [new BullMQAdapter(ctx.rollouts, { readOnlyMode: true }), new BullMQAdapter(callbacks, { allowRetries: true })],
      // @bull-board/fastify pins its own copy of @bull-board/api (9.10.1 vs our 9.10.2): same
      // shape, separately declared private fields, so the types need a cast.
      serverAdapter: serverAdapter as unknown as Parameters<typeof createBullBoard>[0]["serverAdapter"],
      options: { uiConfig: { boardTitle: "rollgate queues" } },
    });
    app.addHook("onRequest", requireAdminKey(ctx.env.ROLLGATE_API_KEY));
    await app.register(serverAdapter.registerPlugin(), { prefix: QUEUES_BASE_PATH });
  };
}
