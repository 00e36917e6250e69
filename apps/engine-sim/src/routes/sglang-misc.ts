import type { FastifyInstance, FastifyReply } from "fastify";
import { z } from "zod";
import type { PauseMode } from "../engine.js";
import { EngineError } from "../engine.js";
import { HttpError, sglangError } from "../errors.js";
import { SGLANG_REASONING_PARSERS, SGLANG_TOOL_PARSERS, parseFunctionCall, separateReasoning } from "../output/sglang-parse.js";
import type { SglangReasoningParser, SglangToolParser } from "../output/sglang-parse.js";
import { renderPrompt } from "../prompt.js";
import type { SimState } from "../state.js";
import { formatZodError, getRawBody } from "./common.js";

/** The SGLang version whose behaviour the SGLang mode follows (reported by /server_info). */
export const SIM_SGLANG_VERSION = "0.5.5+enginesim";

/**
 * SGLang's control and info routes (v0.5.x `http_server.py`):
 *   GET /health, GET /health_generate (a 1-token generation with input_ids [0]): 200 empty; 503 when a rank is down
 *   POST /pause_generation {mode: abort|in_place|retract} → {"message":"Generation paused successfully.","status":"ok"}
 *   POST /continue_generation → {"message":"Generation continued successfully.","status":"ok"}
 *   GET|POST /flush_cache → 200 text, or 400 (same text) while requests run, wait or are paused in place
 *   POST /abort_request {rid?, abort_all?} → 200 empty
 *   POST /tokenize {prompt: str|str[], add_special_tokens} or {messages, tools?, chat_template_kwargs?} → {tokens, count, max_model_len}
 *   POST /detokenize {tokens, skip_special_tokens=true} → {text}
 *   GET /model_info (/get_model_info), GET /server_info (/get_server_info), GET /v1/models (owned_by "sglang")
 *   (/update_weights_from_disk and the LoRA routes: routes/weights.ts)
 *   POST /update_weight_version {new_version} → {"success":true,"message":…,"new_version"}
 *   POST /parse_function_call {text, tools, tool_call_parser?} → {normal_text, calls: [{tool_index, name, parameters}]}
 *     (no parser named: the server's --tool-call-parser)
 *   POST /separate_reasoning {text, reasoning_parser} → {text, reasoning_text}
 */

const Pause = z.object({ mode: z.enum(["abort", "in_place", "retract"]).nullish() });
const Tokenize = z.object({ model: z.string().nullish(), prompt: z.union([z.string(), z.array(z.string())]), add_special_tokens: z.boolean().nullish() });
/** SGLang's chat form of /tokenize: messages rendered with the chat template (with tools and template kwargs). */
const TokenizeChat = z.object({
  model: z.string().nullish(),
  messages: z.array(z.record(z.string(), z.unknown())),
  tools: z.array(z.record(z.string(), z.unknown())).nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  add_special_tokens: z.boolean().nullish(),
});
const Detokenize = z.object({ model: z.string().nullish(), tokens: z.array(z.number().int()), skip_special_tokens: z.boolean().nullish() });
const UpdateVersion = z.object({ new_version: z.string(), abort_all_requests: z.boolean().nullish() });
const AbortRequest = z.object({ rid: z.string().nullish(), abort_all: z.boolean().nullish() });
const ParseFunctionCall = z.object({ text: z.string(), tools: z.array(z.record(z.string(), z.unknown())).nullish(), tool_call_parser: z.string().nullish() });
const SeparateReasoning = z.object({ text: z.string(), reasoning_parser: z.string() });

/** SGLang's names for the parsers of vLLM's flags. */
const SGLANG_NAME: Record<string, SglangToolParser> = { hermes: "qwen25", qwen3_coder: "qwen3_coder", llama3_json: "llama3", deepseek_v3: "deepseekv3", deepseek_v31: "deepseekv31", openai: "gpt-oss" };
const SGLANG_REASONING_NAME: Record<string, SglangReasoningParser> = { qwen3: "qwen3", deepseek_r1: "deepseek-r1", deepseek_v3: "deepseek-v3", openai_gptoss: "gpt-oss" };

const FLUSH_TEXT = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";

export function registerSglangMiscRoutes(app: FastifyInstance, sim: SimState): void {
  const o = sim.opts;
  const anyDown = () => sim.ranks.ranks.some((r) => r.down);

  app.get("/health", async (_req, reply) => reply.code(anyDown() ? 503 : 200).send(""));
  app.get("/health_generate", async (_req, reply) => {
    if (anyDown()) return reply.code(503).send("");
    try {
      const g = await sim.engine.admit({ promptIds: [0], ids: [0], topN: 0 });
      for await (const _ of sim.engine.run(g)) {
        // one token is enough
      }
    } catch (e) {
      if (e instanceof EngineError) return reply.code(503).send("");
      throw e;
    }
    return reply.code(200).send("");
  });

  app.post("/pause_generation", async (req, reply) => {
    const parsed = Pause.safeParse(req.body ?? {});
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    await sim.engine.pause((parsed.data.mode ?? "abort") as PauseMode);
    return { message: "Generation paused successfully.", status: "ok" };
  });
  app.post("/continue_generation", async () => {
    sim.engine.resume();
    return { message: "Generation continued successfully.", status: "ok" };
  });

  const flush = async (_req: unknown, reply: FastifyReply) => {
    if (sim.engine.busy) return reply.code(400).type("text/plain; charset=utf-8").send(FLUSH_TEXT);
    for (const r of sim.ranks.ranks) r.cache.clear();
    return reply.code(200).type("text/plain; charset=utf-8").send(FLUSH_TEXT);
  };
  app.get("/flush_cache", flush);
  app.post("/flush_cache", flush);

  app.post("/abort_request", async (req, reply) => {
    const parsed = AbortRequest.safeParse(req.body ?? {});
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    if (parsed.data.abort_all) for (const g of [...sim.engine.active]) sim.engine.stop(g, "abort");
    return reply.code(200).send("");
  });

  app.post("/tokenize", async (req, reply) => {
    sim.tokenizeRequests++;
    const body = req.body as Record<string, unknown> | null;
    if (body && typeof body === "object" && "messages" in body) {
      const chat = TokenizeChat.safeParse(body);
      if (!chat.success) return reply.code(400).send(sglangError(formatZodError(chat.error)));
      try {
        const { ids } = renderPrompt({ ...chat.data, add_generation_prompt: true }, getRawBody(req), sim.model);
        return { tokens: ids, count: ids.length, max_model_len: o.maxModelLen };
      } catch (e) {
        if (e instanceof HttpError) return reply.code(e.status).send(sglangError(e.message));
        throw e;
      }
    }
    const parsed = Tokenize.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const p = parsed.data.prompt;
    if (typeof p === "string") {
      const tokens = sim.tok.encode(p, parsed.data.add_special_tokens ?? true);
      return { tokens, count: tokens.length, max_model_len: o.maxModelLen };
    }
    const tokens = p.map((t) => sim.tok.encode(t, parsed.data.add_special_tokens ?? true));
    return { tokens, count: tokens.map((t) => t.length), max_model_len: o.maxModelLen };
  });
  app.post("/detokenize", async (req, reply) => {
    const parsed = Detokenize.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const bad = parsed.data.tokens.find((id) => !sim.tok.isValidId(id));
    if (bad !== undefined) return reply.code(400).send(sglangError(`Token id ${bad} is out of vocabulary`));
    return { text: sim.tok.decode(parsed.data.tokens, parsed.data.skip_special_tokens ?? true) };
  });

  app.post("/parse_function_call", async (req, reply) => {
    const parsed = ParseFunctionCall.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const name = parsed.data.tool_call_parser ?? (sim.model.toolParser ? SGLANG_NAME[sim.model.toolParser] : undefined);
    if (!name || !(SGLANG_TOOL_PARSERS as readonly string[]).includes(name)) {
      return reply.code(400).send(sglangError(`Unsupported tool_call_parser ${JSON.stringify(name ?? null)}; one of ${SGLANG_TOOL_PARSERS.join(", ")}`));
    }
    return parseFunctionCall(parsed.data.text, name as SglangToolParser, parsed.data.tools ?? []);
  });
  app.post("/separate_reasoning", async (req, reply) => {
    const parsed = SeparateReasoning.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const name = parsed.data.reasoning_parser;
    if (!(SGLANG_REASONING_PARSERS as readonly string[]).includes(name)) {
      return reply.code(400).send(sglangError(`Unsupported reasoning_parser ${JSON.stringify(name)}; one of ${SGLANG_REASONING_PARSERS.join(", ")}`));
    }
    return separateReasoning(parsed.data.text, name as SglangReasoningParser);
  });

  const modelInfo = async () => ({
    model_path: o.model,
    tokenizer_path: o.model,
    is_generation: true,
    preferred_sampling_params: null,
    weight_version: sim.weightVersion,
    has_image_understanding: false,
    has_audio_understanding: false,
    model_type: sim.model.family.modelType,
    architectures: sim.model.family.architectures,
  });
  app.get("/model_info", modelInfo);
  app.get("/get_model_info", modelInfo);
  const serverInfo = async () => ({
    model_path: o.model,
    served_model_name: o.model,
    dp_size: sim.ranks.size,
    tp_size: 1,
    context_length: o.maxModelLen,
    max_running_requests: o.maxRunning || null,
    incremental_streaming_output: o.incrementalStreamingOutput,
    reasoning_parser: sim.model.reasoningParser ? SGLANG_REASONING_NAME[sim.model.reasoningParser] : null,
    tool_call_parser: sim.model.toolParser ? SGLANG_NAME[sim.model.toolParser] : null,
    enable_cache_report: true,
    weight_version: sim.weightVersion,
    version: SIM_SGLANG_VERSION,
    internal_states: sim.ranks.ranks.map((r) => ({ dp_rank: r.index, num_running_reqs: r.running, num_waiting_reqs: r.waiting })),
  });
  app.get("/server_info", serverInfo);
  app.get("/get_server_info", serverInfo);

  app.get("/v1/models", async () => ({
    object: "list",
    data: [{ id: o.model, object: "model", created: sim.startedAt, owned_by: "sglang", root: o.model, parent: null, max_model_len: o.maxModelLen }],
  }));

  app.post("/update_weight_version", async (req, reply) => {
    const parsed = UpdateVersion.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    if (parsed.data.abort_all_requests) for (const g of [...sim.engine.active]) sim.engine.stop(g, "abort");
    sim.weightVersion = parsed.data.new_version;
    return { success: true, message: `Weight version updated to ${sim.weightVersion}`, new_version: sim.weightVersion };
  });
}
