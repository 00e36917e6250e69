import { randomBytes } from "node:crypto";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { EngineError } from "../engine.js";
import type { Generation } from "../engine.js";
import { HttpError } from "../errors.js";
import { applyLimits } from "../limits.js";
import type { Completion } from "../limits.js";
import { extendPastEos, promptPolicy } from "../policy.js";
import { parseRankHeader, sglangRank } from "../ranks.js";
import { ScriptError } from "../script.js";
import { returnsRoutedExperts, sglangRoutedExperts, vllmRoutedExperts } from "./routed-experts.js";
import type { SimState } from "../state.js";
import { legacyLogprobs, promptTops, vllmPromptLogprobs } from "../wire-logprobs.js";
import type { LegacyStep } from "../wire-logprobs.js";
import { OPENAI_REQUEST_FIELDS, cutConnection, disconnectSignal, endedEarly, errorBody, formatZodError, runToEnd, sendEnvError } from "./common.js";
import type { Envelope } from "./common.js";
import { emitted } from "./openai-chat.js";

/**
 * `POST /v1/completions`. vLLM mode: v0.12-era `serving_completion.py` with the v0.10.2+ token
 * extensions: `prompt` as text, list of texts, token ids or list of token-id lists (one choice per
 * prompt, each its own engine request); `max_tokens` default 16; per choice `prompt_token_ids` and
 * `token_ids` (null unless `return_token_ids`); legacy logprobs `{text_offset, token_logprobs, tokens,
 * top_logprobs}` (`logprobs: k` ≤ 20 → k+1 entries per step); `echo` (prompt text + logprobs first;
 * `max_tokens: 0` returns just the prompt; with `return_token_ids` the echoed prompt text is "" as in
 * vLLM); stream chunks dumped with every field (`exclude_unset=False`, so `"usage":null`), the
 * finish on the last token's chunk, an optional `choices:[]` usage chunk, `[DONE]`. A pause abort
 * ends a choice with `finish_reason: "abort"` (vLLM ≥ v0.14 passes it through).
 *
 * SGLang mode: SGLang v0.5.x `serving_completions.py`: `id` = rid (uuid hex), choices
 * `{index, text, logprobs, finish_reason, matched_stop}`, `metadata.weight_version`, chunks with
 * `"usage":null`, its flat error envelope.
 */

const TokenIds = z.array(z.number().int());
const CompletionRequest = z.object({
  ...OPENAI_REQUEST_FIELDS,
  prompt: z.union([z.string(), z.array(z.string()).min(1), TokenIds.min(1), z.array(TokenIds.min(1)).min(1)]),
  echo: z.boolean().nullish(),
  logprobs: z.number().int().nullish(),
  ignore_eos: z.boolean().nullish(),
  add_special_tokens: z.boolean().nullish(),
  return_routed_experts: z.boolean().nullish(),
  no_stop_trim: z.boolean().nullish(),
});
type CompletionRequest = z.infer<typeof CompletionRequest>;

/** vLLM's default `--max-logprobs`. */
const MAX_LOGPROBS = 20;

interface PromptJob {
  index: number;
  promptIds: number[];
  promptText: string;
  completion: Completion;
}

interface Prepared {
  body: CompletionRequest;
  sglang: boolean;
  env: Envelope;
  requestId: string;
  created: number;
  jobs: PromptJob[];
  rank: number | undefined;
  /** `logprobs: k` (null: none). */
  k: number | null;
  asTokenIds: boolean;
  maxTokens: number;
}

function prepare(sim: SimState, req: FastifyRequest): Prepared {
  const o = sim.opts;
  const sglang = o.kind === "sglang";
  const parsed = CompletionRequest.safeParse(req.body);
  if (!parsed.success) throw new HttpError(400, formatZodError(parsed.error));
  const body = parsed.data;
  if (body.model && body.model !== o.model && !sglang) throw new HttpError(404, `The model \`${body.model}\` does not exist.`);
  if (body.stream_options && !body.stream) throw new HttpError(400, "Stream options can only be defined when `stream=True`.");
  if ((body.n ?? 1) !== 1) throw new HttpError(400, "engine-sim supports only n=1.");
  const k = body.logprobs ?? null;
  if (k !== null && (k < 0 || k > MAX_LOGPROBS)) throw new HttpError(400, `Requested sample logprobs of ${k}, which is greater than max allowed: ${MAX_LOGPROBS}`);
  const pl = body.prompt_logprobs;
  if (pl !== null && pl !== undefined) {
    if (pl < 0 && pl !== -1) throw new HttpError(400, "`prompt_logprobs` must be a positive value or -1.");
    if (body.stream && (pl > 0 || pl === -1)) throw new HttpError(400, "`prompt_logprobs` are not available when `stream=True`.");
  }
  const maxTokens = body.max_tokens ?? 16;
  if (maxTokens < 0 || (maxTokens === 0 && !body.echo)) throw new HttpError(400, `max_tokens must be at least 1, got ${maxTokens}.`);

  const p = body.prompt;
  const prompts: (string | number[])[] = typeof p === "string" ? [p] : typeof p[0] === "number" ? [p as number[]] : (p as (string | number[])[]);
  const jobs = prompts.map((one, index): PromptJob => {
    const promptIds = typeof one === "string" ? sim.tok.encode(one, body.add_special_tokens ?? true) : one;
    const bad = promptIds.find((id) => !sim.tok.isValidId(id));
    if (bad !== undefined) throw new HttpError(400, `Token id ${bad} is out of vocabulary`);
    if (promptIds.length === 0) throw new HttpError(400, "The prompt cannot be empty.");
    if (promptIds.length >= o.maxModelLen) {
      throw new HttpError(400, `This model's maximum context length is ${o.maxModelLen} tokens. However, your request has ${promptIds.length} input tokens. Please reduce the length of the input messages.`);
    }
    if (maxTokens > o.maxModelLen - promptIds.length) {
      throw new HttpError(400, `'max_tokens' is too large: ${maxTokens}. This model's maximum context length is ${o.maxModelLen} tokens and your request has ${promptIds.length} input tokens (${maxTokens} > ${o.maxModelLen} - ${promptIds.length}).`);
    }
    let policy;
    try {
      policy = promptPolicy(o.seed, o.randomTokens, promptIds, sim.model);
    } catch (e) {
      if (e instanceof ScriptError) throw new HttpError(400, `engine-sim: ${e.message}`);
      throw e;
    }
    if (body.ignore_eos) policy = extendPastEos(policy, maxTokens, o.seed, promptIds, sim.model);
    const stop = body.stop === null || body.stop === undefined ? [] : typeof body.stop === "string" ? [body.stop] : body.stop;
    const completion =
      maxTokens === 0
        ? { ids: [], finishReason: "length" as const, stopReason: null, text: "", ends: [] }
        : applyLimits(
            policy,
            {
              eosId: sim.model.eosId,
              extraStopIds: sim.model.extraStopIds,
              maxTokens,
              stop,
              stopTokenIds: body.stop_token_ids ?? [],
              includeStopStrInOutput: body.include_stop_str_in_output ?? body.no_stop_trim ?? false,
              skipSpecialTokens: body.skip_special_tokens ?? true,
              ignoreEos: body.ignore_eos ?? false,
            },
            sim.tok,
          );
    return { index, promptIds, promptText: typeof one === "string" ? one : sim.tok.decode(one), completion };
  });

  let rank: number | undefined;
  if (sglang) rank = sglangRank(body.routed_dp_rank ?? body.data_parallel_rank, req.headers["x-data-parallel-rank"], sim.ranks.size);
  else {
    const header = parseRankHeader(req.headers["x-data-parallel-rank"], sim.ranks.size);
    if (header.kind === "out_of_range") throw new HttpError(400, `data_parallel_rank ${header.rank} is out of range [0, ${sim.ranks.size}).`);
    rank = header.kind === "rank" ? header.rank : undefined;
  }
  const given = body.request_id ?? (req.headers["x-request-id"] as string | undefined);
  return {
    body,
    sglang,
    env: sglang ? "sglang-openai" : "vllm",
    requestId: sglang ? (body.rid ?? randomBytes(16).toString("hex")) : `cmpl-${given ?? randomBytes(16).toString("hex")}`,
    created: Math.floor(Date.now() / 1000),
    jobs,
    rank,
    k,
    asTokenIds: !sglang && (body.return_tokens_as_token_ids ?? sim.opts.returnTokensAsTokenIds),
    maxTokens,
  };
}

/** Admits every prompt; on refusal, stops the ones already admitted and rethrows. */
async function admitAll(sim: SimState, p: Prepared, signal: AbortSignal): Promise<Generation[]> {
  const gens: Generation[] = [];
  try {
    for (const j of p.jobs) {
      const topN = p.k === null ? 0 : p.k + 1;
      gens.push(await sim.engine.admit({ promptIds: j.promptIds, ids: j.completion.ids, topN, cacheSalt: p.body.cache_salt ?? undefined, rank: p.rank, signal }));
    }
    return gens;
  } catch (e) {
    for (const g of gens) {
      sim.engine.stop(g, "client");
      for await (const _ of sim.engine.run(g)) break;
    }
    throw e;
  }
}

function usage(p: Prepared, gens: Generation[], includeDetails: boolean) {
  const prompt = p.jobs.reduce((a, j) => a + j.promptIds.length, 0);
  const completion = gens.reduce((a, g) => a + g.tokens.length, 0);
  const u: Record<string, unknown> = { prompt_tokens: prompt, total_tokens: prompt + completion, completion_tokens: completion };
  if (includeDetails) u.prompt_tokens_details = { cached_tokens: gens.at(-1)?.cached ?? 0 };
  return u;
}

function finishOf(sim: SimState, j: PromptJob, g: Generation): { finish: string; stopReason: string | number | null; matched: string | number | null } {
  if (g.outcome === "abort") return { finish: g.finishAs, stopReason: null, matched: null };
  const c = j.completion;
  return { finish: c.finishReason, stopReason: c.stopReason, matched: c.finishReason === "stop" ? (c.stopReason ?? sim.model.eosId) : null };
}

/** Steps of the prompt for echo + logprobs: position 0 has no logprob. */
function promptSteps(sim: SimState, j: PromptJob, k: number): LegacyStep[] {
  const tops = promptTops(sim.weightVersion, j.promptIds, k, sim.tok.regularVocabSize);
  return j.promptIds.map((id, i) => ({ id, top: i === 0 ? null : tops[i - 1]! }));
}

async function respond(sim: SimState, p: Prepared, reply: FastifyReply) {
  const ac = disconnectSignal(reply);
  let gens: Generation[];
  try {
    gens = await admitAll(sim, p, ac.signal);
  } catch (e) {
    if (e instanceof EngineError) return sendEnvError(reply, p.env, e.status, e.message);
    throw e;
  }
  await runToEnd(sim, gens);
  const early = endedEarly(gens, reply);
  if (early) return early;
  reply.header("x-sim-dp-rank", String(gens[0]!.rank.index));
  const routed = returnsRoutedExperts(sim, p.body, p.sglang) ? p.jobs.map((j, i) => (p.sglang ? sglangRoutedExperts(sim, gens[i]!, j.promptIds) : vllmRoutedExperts(sim, gens[i]!, j.promptIds))) : null;
  const choices = p.jobs.map((j, i) => {
    const g = gens[i]!;
    const out = emitted(j.completion, g.tokens.length);
    const fin = finishOf(sim, j, g);
    const echoText = p.body.echo ? (p.body.return_token_ids ? "" : j.promptText) : "";
    const genSteps: LegacyStep[] = g.tokens.map((t) => ({ id: t.id, top: t.top }));
    const steps = p.body.echo && p.k !== null ? [...promptSteps(sim, j, p.k), ...genSteps] : genSteps;
    const logprobs = p.k === null ? null : legacyLogprobs(sim.tok, steps, p.k, p.asTokenIds);
    const r = routed?.[i];
    if (p.sglang) return { index: i, text: echoText + out.text, logprobs, finish_reason: fin.finish, matched_stop: fin.matched, ...(typeof r === "string" ? { sgl_ext: { routed_experts: r } } : {}) };
    const pl = p.body.prompt_logprobs;
    return {
      ...(r && typeof r !== "string" ? { routed_experts: r.output } : {}),
      index: i,
      text: echoText + out.text,
      logprobs,
      finish_reason: fin.finish,
      stop_reason: fin.stopReason,
      token_ids: p.body.return_token_ids ? out.ids : null,
      prompt_logprobs: pl === null || pl === undefined ? null : vllmPromptLogprobs(sim.tok, sim.weightVersion, j.promptIds, pl === -1 ? MAX_LOGPROBS : pl),
      prompt_token_ids: p.body.return_token_ids ? j.promptIds : null,
    };
  });
  if (p.sglang) {
    return reply.send({ id: p.requestId, object: "text_completion", created: p.created, model: p.body.model ?? sim.opts.model, choices, usage: usage(p, gens, true), metadata: { weight_version: sim.weightVersion } });
  }
  return reply.send({
    id: p.requestId,
    object: "text_completion",
    created: p.created,
    model: sim.opts.model,
    choices,
    service_tier: null,
    system_fingerprint: null,
    usage: usage(p, gens, true),
    // vLLM shares one prompt's routing across its choices, at the response level.
    ...(routed && typeof routed[0] !== "string" && routed.length === 1 ? { prompt_routed_experts: routed[0]!.prompt } : {}),
    kv_transfer_params: null,
  });
}

async function stream(sim: SimState, p: Prepared, reply: FastifyReply) {
  const ac = disconnectSignal(reply);
  let gens: Generation[];
  try {
    gens = await admitAll(sim, p, ac.signal);
  } catch (e) {
    if (e instanceof EngineError) return sendEnvError(reply, p.env, e.status, e.message);
    throw e;
  }
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "x-sim-dp-rank": String(gens[0]!.rank.index) });
  const send = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
  const model = p.sglang ? (p.body.model ?? sim.opts.model) : sim.opts.model;
  const base = { id: p.requestId, object: "text_completion", created: p.created, model };
  const includeUsage = p.body.stream_options?.include_usage === true;
  const continuous = includeUsage && p.body.stream_options?.continuous_usage_stats === true;
  let cut = false;

  const chunk = (i: number, text: string, logprobs: unknown, fin: ReturnType<typeof finishOf> | null, promptIds: number[] | null, ids: number[], done: number) => {
    const choice = p.sglang
      ? { index: i, text, logprobs, finish_reason: fin?.finish ?? null, matched_stop: fin?.matched ?? null }
      : { index: i, text, logprobs, finish_reason: fin?.finish ?? null, stop_reason: fin?.stopReason ?? null, prompt_token_ids: promptIds, token_ids: p.body.return_token_ids ? ids : null };
    const n = p.jobs[i]!.promptIds.length;
    send({ ...base, choices: [choice], usage: continuous ? { prompt_tokens: n, total_tokens: n + done, completion_tokens: done } : null });
  };

  const one = async (i: number) => {
    const j = p.jobs[i]!;
    const g = gens[i]!;
    const c = j.completion;
    let textOffset = 0;
    let first = true;
    const last = c.ids.length - 1;
    const emit = (deltaText: string, ids: number[], steps: LegacyStep[], fin: ReturnType<typeof finishOf> | null) => {
      let promptIds: number[] | null = null;
      if (first) {
        first = false;
        if (p.body.echo) {
          const echoText = p.body.return_token_ids ? "" : j.promptText;
          deltaText = echoText + deltaText;
          ids = [...j.promptIds, ...ids];
          if (p.k !== null) steps = [...promptSteps(sim, j, p.k), ...steps];
          promptIds = j.promptIds;
        } else if (p.body.return_token_ids) promptIds = j.promptIds;
      }
      const logprobs = p.k === null ? null : legacyLogprobs(sim.tok, steps, p.k, p.asTokenIds, textOffset);
      textOffset += [...deltaText].length;
      chunk(i, deltaText, logprobs, fin, promptIds, ids, g.tokens.length);
    };
    if (p.body.echo && p.maxTokens === 0) {
      emit("", [], [], finishOf(sim, j, g));
      for await (const _ of sim.engine.run(g)) break;
      return;
    }
    for await (const t of sim.engine.run(g)) {
      const from = t.index === 0 ? 0 : c.ends[t.index - 1]!;
      emit(c.text.slice(from, c.ends[t.index]!), [t.id], [{ id: t.id, top: t.top }], t.index === last ? finishOf(sim, j, g) : null);
    }
    if (g.outcome === "disconnect") cut = true;
    else if (g.outcome === "abort") emit("", [], [], finishOf(sim, j, g));
  };
  try {
    await Promise.all(p.jobs.map((_, i) => one(i)));
  } catch (e) {
    send(errorBody(p.env, 500, (e as Error).message));
    res.end("data: [DONE]\n\n");
    return;
  }
  if (cut) {
    for (const g of gens) sim.engine.stop(g, "client");
    cutConnection(reply);
    return;
  }
  if (gens.some((g) => g.outcome === "client")) return;
  if (includeUsage) send({ ...base, choices: [], usage: usage(p, gens, true) });
  res.end("data: [DONE]\n\n");
}

export function registerCompletionRoutes(app: FastifyInstance, sim: SimState): void {
  app.post("/v1/completions", async (req, reply) => {
    let p: Prepared;
    try {
      p = prepare(sim, req);
    } catch (e) {
      if (e instanceof HttpError) return sendEnvError(reply, sim.opts.kind === "sglang" ? "sglang-openai" : "vllm", e.status, e.message);
      throw e;
    }
    if (p.body.stream) return stream(sim, p, reply);
    return respond(sim, p, reply);
  });
}
