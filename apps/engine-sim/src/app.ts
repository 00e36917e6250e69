import Fastify from "fastify";
import type { FastifyInstance } from "fastify";
import { registerChatRoutes } from "./routes/openai-chat.js";
import { registerCompletionRoutes } from "./routes/completions.js";
import { registerMiscRoutes } from "./routes/misc.js";
import { registerSglangGenerateRoutes } from "./routes/sglang-generate.js";
import { registerSglangMiscRoutes } from "./routes/sglang-misc.js";
import { registerSimAdminRoutes } from "./routes/sim-admin.js";
import { registerVllmControlRoutes } from "./routes/vllm-control.js";
import { registerWeightRoutes } from "./routes/weights.js";
import { errorBody, setRawBody } from "./routes/common.js";
import { SimState } from "./state.js";
import type { EngineSimOptions } from "./state.js";

const states = new WeakMap<FastifyInstance, SimState>();

/** The simulator state behind an app (weight version, ranks, options), e.g. for tests. */
export function getSimState(app: FastifyInstance): SimState {
  const s = states.get(app);
  if (!s) throw new Error("not an engine-sim app");
  return s;
}

/**
 * Builds the simulator's Fastify app (not listening). The kind picks the wire flavour: vLLM's
 * OpenAI server, or SGLang's server (native /generate plus its OpenAI routes). The sim-only
 * `/sim/*` admin routes exist in both.
 */
export function buildEngineSim(options: EngineSimOptions = {}): FastifyInstance {
  const sim = new SimState(options);
  if (sim.opts.kind !== "vllm" && sim.opts.kind !== "sglang") throw new Error(`engine-sim kind "${String(sim.opts.kind)}" is unknown (vllm | sglang)`);
  const sglang = sim.opts.kind === "sglang";
  const app = Fastify({ logger: options.logger ?? false, bodyLimit: 256 * 1024 * 1024 });
  states.set(app, sim);

  // Keep the raw body (tool schemas are re-read with Python number semantics); a bad body is a 400
  // in vLLM's envelope, as FastAPI's validation handler answers.
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (req, body, done) => {
    const text = body as string;
    try {
      const json: unknown = text.length === 0 ? {} : JSON.parse(text);
      setRawBody(req, text);
      done(null, json);
    } catch (e) {
      const err = new Error(`JSON decode error: ${(e as Error).message}`) as Error & { statusCode: number };
      err.statusCode = 400;
      done(err, undefined);
    }
  });
  app.setErrorHandler((err: Error & { statusCode?: number }, req, reply) => {
    const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
    if (status >= 500) app.log.error(err);
    // vLLM's envelope; SGLang answers body errors with its flat OpenAI envelope or {"error":{"message"}}.
    const openai = req.url.startsWith("/v1/");
    return reply.code(status).send(errorBody(sglang ? (openai ? "sglang-openai" : "sglang") : "vllm", status, err.message));
  });
  // FastAPI's 404 shape.
  app.setNotFoundHandler((_req, reply) => reply.code(404).send({ detail: "Not Found" }));

  registerChatRoutes(app, sim);
  registerCompletionRoutes(app, sim);
  if (sglang) {
    registerSglangGenerateRoutes(app, sim);
    registerSglangMiscRoutes(app, sim);
  } else {
    registerMiscRoutes(app, sim);
    registerVllmControlRoutes(app, sim);
  }
  registerSimAdminRoutes(app, sim);
  registerWeightRoutes(app, sim);
  return app;
}
