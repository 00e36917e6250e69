import { randomBytes } from "node:crypto";
import type { FastifyInstance, FastifyReply } from "fastify";
import { z } from "zod";
import { EngineError } from "../engine.js";
import type { Generation } from "../engine.js";
import { sglangError } from "../errors.js";
import { applyLimits } from "../limits.js";
import type { Completion } from "../limits.js";
import { extendPastEos, promptPolicy } from "../policy.js";
import { sglangRank } from "../ranks.js";
import { ScriptError } from "../script.js";
import { returnsRoutedExperts, sglangRoutedExperts } from "./routed-experts.js";
import type { SimState } from "../state.js";
import { promptTops, sglangTriple } from "../wire-logprobs.js";
import { cutConnection, disconnectSignal, endedEarly, formatZodError, runToEnd } from "./common.js";
import { emitted } from "./openai-chat.js";

/**
 * SGLang's native `POST /generate` (GenerateReqInput, SGLang v0.5.x `tokenizer_manager.py`):
 * `text` or `input_ids` (a 2-D list or a list of texts is a batch: non-streaming only here),
 * `sampling_params` {max_new_tokens (128), stop, stop_token_ids, skip_special_tokens, no_stop_trim,
 * ignore_eos, …}, `return_logprob`, `logprob_start_len` (-1: output only), `top_logprobs_num`,
 * `return_text_in_logprobs`, `rid`, `routed_dp_rank` / `data_parallel_rank` (out of range → load
 * balancing). Response `{text, output_ids, meta_info}`; meta_info keys in SGLang's order: id,
 * finish_reason, prompt_tokens, weight_version, total_retractions, [input_token_logprobs,
 * output_token_logprobs, input_top_logprobs, output_top_logprobs], completion_tokens,
 * cached_tokens, dp_rank (dp > 1), e2e_latency (final only). Streaming: one `data:` event per token,
 * cumulative text / output_ids / logprob lists by default, deltas with
 * `--incremental-streaming-output`; `data: [DONE]` last; errors as `data: {"error":{"message"}}`.
 */

const Sampling = z
  .object({
    max_new_tokens: z.number().int().nullish(),
    stop: z.union([z.string(), z.array(z.string())]).nullish(),
    stop_token_ids: z.array(z.number().int()).nullish(),
    skip_special_tokens: z.boolean().nullish(),
    no_stop_trim: z.boolean().nullish(),
    ignore_eos: z.boolean().nullish(),
    n: z.number().int().nullish(),
  })
  .passthrough();
type Sampling = z.infer<typeof Sampling>;

const TokenIds = z.array(z.number().int());
const GenerateRequest = z.object({
  text: z.union([z.string(), z.array(z.string()).min(1)]).nullish(),
  input_ids: z.union([TokenIds, z.array(TokenIds).min(1)]).nullish(),
  sampling_params: Sampling.nullish(),
  return_logprob: z.boolean().nullish(),
  logprob_start_len: z.number().int().nullish(),
  top_logprobs_num: z.number().int().nullish(),
  return_text_in_logprobs: z.boolean().nullish(),
  stream: z.boolean().nullish(),
  rid: z.union([z.string(), z.array(z.string())]).nullish(),
  routed_dp_rank: z.number().int().nullish(),
  data_parallel_rank: z.number().int().nullish(),
  return_routed_experts: z.boolean().nullish(),
});
type GenerateRequest = z.infer<typeof GenerateRequest>;

class BadRequest extends Error {}

interface Item {
  rid: string;
  promptIds: number[];
  completion: Completion;
  maxNew: number;
}

/** SGLang's finish_reason object. */
function finishReason(sim: SimState, it: Item, g: Generation, message: string): Record<string, unknown> {
  if (g.outcome === "abort") return g.finishAs === "abort" ? { type: "abort", message } : { type: g.finishAs };
  const c = it.completion;
  if (c.finishReason === "length") return { type: "length", length: it.maxNew };
  return { type: "stop", matched: c.stopReason ?? sim.model.eosId };
}

function buildItems(sim: SimState, body: GenerateRequest): Item[] {
  const o = sim.opts;
  if ((body.text === null || body.text === undefined) === (body.input_ids === null || body.input_ids === undefined)) {
    throw new BadRequest("Either text or input_ids should be provided.");
  }
  const prompts: number[][] =
    body.text !== null && body.text !== undefined
      ? (typeof body.text === "string" ? [body.text] : body.text).map((t) => sim.tok.encode(t, true))
      : typeof body.input_ids![0] === "number"
        ? [body.input_ids as number[]]
        : (body.input_ids as number[][]);
  const sp: Sampling = body.sampling_params ?? {};
  if ((sp.n ?? 1) !== 1) throw new BadRequest("engine-sim supports only n=1.");
  const rids = body.rid === null || body.rid === undefined ? [] : typeof body.rid === "string" ? [body.rid] : body.rid;
  return prompts.map((promptIds, i) => {
    if (promptIds.length === 0) throw new BadRequest("The input_ids should not be empty.");
    const bad = promptIds.find((id) => !sim.tok.isValidId(id));
    if (bad !== undefined) throw new BadRequest(`The input_ids ${bad} is out of the vocabulary.`);
    if (promptIds.length >= o.maxModelLen) throw new BadRequest(`The input (${promptIds.length} tokens) is longer than the model's context length (${o.maxModelLen} tokens).`);
    const maxNew = sp.max_new_tokens ?? 128;
    if (maxNew < 0) throw new BadRequest(`max_new_tokens must be at least 0, got ${maxNew}.`);
    let policy;
    try {
      policy = promptPolicy(o.seed, o.randomTokens, promptIds, sim.model);
    } catch (e) {
      if (e instanceof ScriptError) throw new BadRequest(`engine-sim: ${e.message}`);
      throw e;
    }
    if (sp.ignore_eos) policy = extendPastEos(policy, maxNew, o.seed, promptIds, sim.model);
    const stop = sp.stop === null || sp.stop === undefined ? [] : typeof sp.stop === "string" ? [sp.stop] : sp.stop;
    const completion: Completion =
      maxNew === 0
        ? { ids: [], finishReason: "length", stopReason: null, text: "", ends: [] }
        : applyLimits(
            policy,
            { eosId: sim.model.eosId, extraStopIds: sim.model.extraStopIds, maxTokens: maxNew, stop, stopTokenIds: sp.stop_token_ids ?? [], includeStopStrInOutput: sp.no_stop_trim ?? false, skipSpecialTokens: sp.skip_special_tokens ?? true, ignoreEos: sp.ignore_eos ?? false },
            sim.tok,
          );
    return { rid: rids[i] ?? randomBytes(16).toString("hex"), promptIds, completion, maxNew };
  });
}

/** Builds `meta_info` (and text / output_ids) for the first `n` tokens, cumulative or from `from`. */
function output(sim: SimState, body: GenerateRequest, it: Item, g: Generation, final: boolean, from: number, abortMessage: string) {
  const n = g.tokens.length;
  const out = emitted(it.completion, n);
  const prev = emitted(it.completion, from);
  const withText = body.return_text_in_logprobs === true;
  const topK = body.top_logprobs_num ?? 0;
  const meta: Record<string, unknown> = {
    id: it.rid,
    finish_reason: final ? finishReason(sim, it, g, abortMessage) : null,
    prompt_tokens: it.promptIds.length,
    weight_version: sim.weightVersion,
    total_retractions: g.retractions,
  };
  if (body.return_logprob) {
    const start = body.logprob_start_len ?? -1;
    const tops = start >= 0 ? promptTops(sim.weightVersion, it.promptIds, Math.max(1, topK), sim.tok.regularVocabSize) : [];
    const inputPositions = start >= 0 ? it.promptIds.map((id, i) => ({ id, i })).slice(start) : [];
    const outTokens = g.tokens.slice(from);
    meta.input_token_logprobs = inputPositions.map(({ id, i }) => sglangTriple(sim.tok, i === 0 ? null : tops[i - 1]![0]!.logprob, id, withText));
    meta.output_token_logprobs = outTokens.map((t) => sglangTriple(sim.tok, t.logprob, t.id, withText));
    if (topK > 0) {
      meta.input_top_logprobs = inputPositions.map(({ i }) => (i === 0 ? null : tops[i - 1]!.slice(0, topK).map((a) => sglangTriple(sim.tok, a.logprob, a.id, withText))));
      meta.output_top_logprobs = outTokens.map((t) => t.top.slice(0, topK).map((a) => sglangTriple(sim.tok, a.logprob, a.id, withText)));
    }
  }
  meta.completion_tokens = n;
  meta.cached_tokens = g.cached;
  if (sim.ranks.size > 1) meta.dp_rank = g.rank.index;
  if (final) meta.e2e_latency = (performance.now() - g.startedAt) / 1000;
  // Known once the request is done: only the final output carries it.
  if (final && returnsRoutedExperts(sim, body, true)) meta.routed_experts = sglangRoutedExperts(sim, g, it.promptIds);
  return { text: out.text.slice(prev.text.length), output_ids: out.ids.slice(from), meta_info: meta };
}

const PAUSE_ABORT = "Abort by /pause_generation.";

export function registerSglangGenerateRoutes(app: FastifyInstance, sim: SimState): void {
  const handler = async (req: { body: unknown; headers: Record<string, string | string[] | undefined> }, reply: FastifyReply) => {
    const parsed = GenerateRequest.safeParse(req.body ?? {});
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const body = parsed.data;
    let items: Item[];
    try {
      items = buildItems(sim, body);
      if (body.stream && items.length > 1) throw new BadRequest("engine-sim: batch requests cannot stream.");
    } catch (e) {
      if (e instanceof BadRequest) return reply.code(400).send(sglangError(e.message));
      throw e;
    }
    const rank = sglangRank(body.routed_dp_rank ?? body.data_parallel_rank, undefined, sim.ranks.size);
    const topN = body.return_logprob ? Math.max(1, body.top_logprobs_num ?? 0) : 0;
    const ac = disconnectSignal(reply);
    const gens: Generation[] = [];
    try {
      for (const it of items) gens.push(await sim.engine.admit({ promptIds: it.promptIds, ids: it.completion.ids, topN, rank, signal: ac.signal }));
    } catch (e) {
      for (const g of gens) {
        sim.engine.stop(g, "client");
        for await (const _ of sim.engine.run(g)) break;
      }
      if (e instanceof EngineError) return reply.code(e.status).send(sglangError(e.message));
      throw e;
    }

    if (!body.stream) {
      await runToEnd(sim, gens);
      const early = endedEarly(gens, reply);
      if (early) return early;
      const outs = items.map((it, i) => output(sim, body, it, gens[i]!, true, 0, PAUSE_ABORT));
      reply.header("x-sim-dp-rank", String(gens[0]!.rank.index));
      const batch = Array.isArray(body.text) || (Array.isArray(body.input_ids) && Array.isArray(body.input_ids[0]));
      return reply.send(batch ? outs : outs[0]);
    }

    const it = items[0]!;
    const g = gens[0]!;
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "x-sim-dp-rank": String(g.rank.index) });
    const incremental = sim.opts.incrementalStreamingOutput;
    let sent = 0;
    const event = (final: boolean) => {
      const from = incremental ? sent : 0;
      res.write(`data: ${JSON.stringify(output(sim, body, it, g, final, from, PAUSE_ABORT))}\n\n`);
      sent = g.tokens.length;
    };
    const last = it.completion.ids.length - 1;
    try {
      for await (const t of sim.engine.run(g)) event(t.index === last);
      if (last < 0 && g.outcome === "finished") event(true);
    } catch (e) {
      res.write(`data: ${JSON.stringify(sglangError((e as Error).message))}\n\n`);
      res.end("data: [DONE]\n\n");
      return;
    }
    if (g.outcome === "client") return;
    if (g.outcome === "disconnect") {
      cutConnection(reply);
      return;
    }
    if (g.outcome === "abort") event(true);
    res.end("data: [DONE]\n\n");
  };
  app.post("/generate", handler);
  app.put("/generate", handler);
}
