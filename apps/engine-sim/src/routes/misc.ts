import { randomBytes } from "node:crypto";
import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { HttpError } from "../errors.js";
import { renderPrompt } from "../prompt.js";
import type { SimState } from "../state.js";
import { formatZodError, getRawBody, sendError } from "./common.js";

const TokenizeChat = z.object({
  model: z.string().nullish(),
  messages: z.array(z.record(z.string(), z.unknown())),
  add_generation_prompt: z.boolean().nullish(),
  continue_final_message: z.boolean().nullish(),
  add_special_tokens: z.boolean().nullish(),
  return_token_strs: z.boolean().nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  tools: z.array(z.record(z.string(), z.unknown())).nullish(),
});
const TokenizeCompletion = z.object({
  model: z.string().nullish(),
  prompt: z.string(),
  add_special_tokens: z.boolean().nullish(),
  return_token_strs: z.boolean().nullish(),
});
const Detokenize = z.object({ model: z.string().nullish(), tokens: z.array(z.number().int()) });

/** vLLM's small routes: models, health, tokenize/detokenize, version. */
export function registerMiscRoutes(app: FastifyInstance, sim: SimState): void {
  const o = sim.opts;
  const checkModel = (model: string | null | undefined) => {
    if (model && model !== o.model) throw new HttpError(404, `The model \`${model}\` does not exist.`);
  };

  app.get("/v1/models", async () => ({
    object: "list",
    data: [
      {
        id: o.model,
        object: "model",
        created: sim.startedAt,
        owned_by: "vllm",
        root: o.model,
        parent: null,
        max_model_len: o.maxModelLen,
        permission: [
          {
            id: `modelperm-${randomBytes(16).toString("hex")}`,
            object: "model_permission",
            created: sim.startedAt,
            allow_create_engine: false,
            allow_sampling: true,
            allow_logprobs: true,
            allow_search_indices: false,
            allow_view: true,
            allow_fine_tuning: false,
            organization: "*",
            group: null,
            is_blocking: false,
          },
        ],
      },
    ],
  }));

  // vLLM: 200 with an empty body; 503 (empty) when the engine is dead — here, when a rank is down.
  app.get("/health", async (_req, reply) => reply.code(sim.ranks.ranks.some((r) => r.down) ? 503 : 200).send(""));
  app.get("/ping", async (_req, reply) => reply.code(200).send(""));
  app.post("/ping", async (_req, reply) => reply.code(200).send(""));
  // The release engine-sim behaves as (`--vllm-version`), reported as vLLM does.
  app.get("/version", async () => ({ version: o.vllmVersion }));

  app.post("/tokenize", async (req, reply) => {
    sim.tokenizeRequests++;
    if (o.tokenizeMs > 0) await new Promise((r) => setTimeout(r, o.tokenizeMs));
    try {
      const body = req.body as Record<string, unknown> | null;
      if (body && typeof body === "object" && "messages" in body) {
        const parsed = TokenizeChat.safeParse(body);
        if (!parsed.success) throw new HttpError(400, formatZodError(parsed.error));
        checkModel(parsed.data.model);
        if (parsed.data.add_generation_prompt !== false && parsed.data.continue_final_message === true) {
          throw new HttpError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
        }
        const { ids } = renderPrompt(parsed.data, getRawBody(req), sim.model);
        return tokenizeResponse(ids, parsed.data.return_token_strs === true);
      }
      const parsed = TokenizeCompletion.safeParse(body);
      if (!parsed.success) throw new HttpError(400, formatZodError(parsed.error));
      checkModel(parsed.data.model);
      return tokenizeResponse(sim.tok.encode(parsed.data.prompt, parsed.data.add_special_tokens ?? true), parsed.data.return_token_strs === true);
    } catch (e) {
      if (e instanceof HttpError) return sendError(reply, e.status, e.message);
      throw e;
    }
  });

  const tokenizeResponse = (ids: number[], strs: boolean) => ({
    count: ids.length,
    max_model_len: o.maxModelLen,
    tokens: ids,
    token_strs: strs ? ids.map((id) => sim.tok.tokenStr(id)) : null,
  });

  app.post("/detokenize", async (req, reply) => {
    const parsed = Detokenize.safeParse(req.body);
    if (!parsed.success) return sendError(reply, 400, formatZodError(parsed.error));
    if (parsed.data.model && parsed.data.model !== o.model) return sendError(reply, 404, `The model \`${parsed.data.model}\` does not exist.`);
    const bad = parsed.data.tokens.find((id) => !sim.tok.isValidId(id));
    if (bad !== undefined) return sendError(reply, 400, `Token id ${bad} is out of vocabulary`);
    return { prompt: sim.tok.decode(parsed.data.tokens) };
  });
}
