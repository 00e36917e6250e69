import { randomBytes } from "node:crypto";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { EngineError } from "../engine.js";
import type { Generation } from "../engine.js";
import { HttpError } from "../errors.js";
import { applyLimits } from "../limits.js";
import type { Completion } from "../limits.js";
import { makeToolCallId } from "../output/types.js";
import type { Delta, ParsedOutput, ParseRequest, StreamingParser } from "../output/types.js";
import { continueOpenAnswer, randomOutput, scriptedOutput } from "../policy.js";
import { renderPrompt } from "../prompt.js";
import { parseRankHeader, sglangRank } from "../ranks.js";
import { ScriptError, findScriptInText, findScriptStep } from "../script.js";
import { GuidedError, GuidedStreamer, forcedChoice, guidedCalls, guidedStep } from "../guided.js";
import type { ForcedChoice } from "../guided.js";
import { PyDict } from "@rollgate/pyjson";
import { returnsRoutedExperts, sglangRoutedExperts, vllmRoutedExperts } from "./routed-experts.js";
import type { SimState } from "../state.js";
import { vllmHas } from "../versions.js";
import { chatLogprobEntry, vllmPromptLogprobs } from "../wire-logprobs.js";
import { OPENAI_REQUEST_FIELDS, cutConnection, disconnectSignal, endedEarly, errorBody, formatZodError, getRawBody, runToEnd, sendEnvError } from "./common.js";
import type { Envelope } from "./common.js";

/**
 * `POST /v1/chat/completions` with vLLM's wire format (v0.10.2+ token extensions: `return_token_ids`,
 * top-level `prompt_token_ids`, `choices[].token_ids`; reasoning under `reasoning` (v0.11+, PR
 * #27752) or `reasoning_content`). The prompt is rendered with the served family's chat template,
 * or taken as given when the simulated release accepts a pre-tokenised prompt (versions.ts); the
 * answer is parsed by the server's `--reasoning-parser` / `--tool-call-parser` (output/).
 * Test-only extra: every response carries `x-sim-dp-rank: <rank>` (the DP rank that served it).
 *
 * In SGLang mode the same route answers as SGLang v0.5.x's `serving_chat.py` (`--enable-cache-report`)
 * plus the token-id fields of PR #30917 (`return_token_ids` → `choices[].token_ids`,
 * `return_prompt_token_ids` → `choices[].prompt_token_ids`, rejected when streaming), `input_ids`
 * and PR #34488's `sglext` ids: `id` is the request's rid (uuid hex), `message.reasoning_content`,
 * `tool_calls: null` when none, `matched_stop`, logprob entries without ids, `metadata.weight_version`,
 * the flat `{object:"error",…}` envelope, `routed_dp_rank` / `X-Data-Parallel-Rank` with out-of-range
 * falling back to load balancing.
 */

const ChatRequest = z.object({
  ...OPENAI_REQUEST_FIELDS,
  messages: z.array(z.record(z.string(), z.unknown())).min(1),
  max_completion_tokens: z.number().int().nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().nullish(),
  include_reasoning: z.boolean().nullish(),
  tools: z.array(z.record(z.string(), z.unknown())).nullish(),
  tool_choice: z.union([z.string(), z.record(z.string(), z.unknown())]).nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  add_generation_prompt: z.boolean().nullish(),
  continue_final_message: z.boolean().nullish(),
  return_prompt_token_ids: z.boolean().nullish(),
  separate_reasoning: z.boolean().nullish(),
  // Token-in: vLLM's kv_transfer_params.prompt_token_ids (PR #48145) and prompt_token_ids (PR #55771);
  // SGLang's input_ids. Read only when the simulated server has them (an old server ignores them).
  kv_transfer_params: z.unknown().optional(),
  prompt_token_ids: z.unknown().optional(),
  input_ids: z.unknown().optional(),
  // SGLang PR #34488: response-level sglext.input_ids / sglext.output_ids.
  return_input_ids: z.boolean().nullish(),
  return_output_ids: z.boolean().nullish(),
  // SGLang PR #17434: routed experts (needs --enable-return-routed-experts).
  return_routed_experts: z.boolean().nullish(),
  chat_template: z.string().nullish(),
  reasoning_effort: z.string().nullish(),
});
type ChatRequest = z.infer<typeof ChatRequest>;

/** top_logprobs -1 means "the whole vocabulary" in vLLM; the simulator caps it. */
const MAX_TOP_LOGPROBS = 20;

interface Prepared {
  body: ChatRequest;
  sglang: boolean;
  requestId: string;
  created: number;
  promptIds: number[];
  completion: Completion;
  /** Pinned DP rank (undefined: the engine load-balances). */
  rank: number | undefined;
  topN: number;
  wantLogprobs: boolean;
  asTokenIds: boolean;
  returnTokenIds: boolean;
  returnPromptTokenIds: boolean;
  /** SGLang sglext ids (request fields, x-sglext-* headers). */
  sglextInputIds: boolean;
  sglextOutputIds: boolean;
  /** The answer carries routed experts (routed-experts.ts). */
  routedExperts: boolean;
  toolParsing: boolean;
  /** tool_choice "required" or a named function: the answer is guided JSON (guided.ts), not the family's markup. */
  forced: ForcedChoice | null;
  reasoningField: string;
  parseRequest: ParseRequest;
}

function requestId(body: ChatRequest, req: FastifyRequest, sglang: boolean): string {
  if (sglang) return body.rid ?? randomBytes(16).toString("hex");
  const given = body.request_id ?? (req.headers["x-request-id"] as string | undefined);
  return `chatcmpl-${given ?? randomBytes(16).toString("hex")}`;
}

function headerOn(req: FastifyRequest, name: string): boolean {
  const v = req.headers[name];
  return typeof v === "string" && /^(1|true|yes)$/i.test(v.trim());
}

const TokenIds = z.array(z.number().int());

/**
 * A pre-tokenised prompt the simulated server honours, or null (render the messages). vLLM reads
 * `prompt_token_ids` (≥ the release with PR #55771) before `kv_transfer_params.prompt_token_ids`
 * (≥ the release with PR #48145); SGLang reads `input_ids`. Messages still drive tools and parsers.
 */
function tokenInPrompt(sim: SimState, body: ChatRequest): number[] | null {
  const pick = (field: string, v: unknown): number[] | null => {
    if (v === undefined || v === null) return null;
    const parsed = TokenIds.safeParse(v);
    if (!parsed.success) throw new HttpError(400, `${field} must be a list of token ids`);
    return parsed.data;
  };
  if (sim.opts.kind === "sglang") return pick("input_ids", body.input_ids);
  const v = sim.opts.vllmVersion;
  if (vllmHas(v, "chatPromptTokenIds")) {
    const ids = pick("prompt_token_ids", body.prompt_token_ids);
    if (ids) return ids;
  }
  if (vllmHas(v, "chatKvTransferPromptIds")) {
    const kv = body.kv_transfer_params;
    if (kv !== null && typeof kv === "object" && !Array.isArray(kv)) return pick("kv_transfer_params.prompt_token_ids", (kv as Record<string, unknown>).prompt_token_ids);
  }
  return null;
}

/** Validation, prompt, policy and stopping rules: everything before the first token. */
function prepare(sim: SimState, req: FastifyRequest): Prepared {
  const parsed = ChatRequest.safeParse(req.body);
  if (!parsed.success) throw new HttpError(400, formatZodError(parsed.error));
  const body = parsed.data;
  const o = sim.opts;
  const sglang = o.kind === "sglang";
  if (body.model && body.model !== o.model && !sglang) throw new HttpError(404, `The model \`${body.model}\` does not exist.`);
  if (body.add_generation_prompt !== false && body.continue_final_message === true) {
    throw new HttpError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  }
  const top = body.top_logprobs;
  if (top !== null && top !== undefined) {
    if (top < 0 && top !== -1) throw new HttpError(400, "`top_logprobs` must be a positive value or -1.");
    if ((top === -1 || top > 0) && !body.logprobs) throw new HttpError(400, "when using `top_logprobs`, `logprobs` must be set to true.");
  }
  const pl = body.prompt_logprobs;
  if (pl !== null && pl !== undefined) {
    if (pl < 0 && pl !== -1) throw new HttpError(400, "`prompt_logprobs` must be a positive value or -1.");
    if (body.stream && (pl > 0 || pl === -1)) throw new HttpError(400, "`prompt_logprobs` are not available when `stream=True`.");
  }
  if ((body.n ?? 1) !== 1) throw new HttpError(400, "engine-sim supports only n=1.");
  if (body.tools && body.tools.length === 0) throw new HttpError(400, "`tools` must not be an empty list.");
  if (sglang && body.stream && (body.return_token_ids || body.return_prompt_token_ids)) {
    throw new HttpError(400, "return_token_ids / return_prompt_token_ids are not supported with stream=True for chat completions.");
  }

  const tokenIn = tokenInPrompt(sim, body);
  let prompt: { text: string; ids: number[] };
  if (tokenIn) {
    const bad = tokenIn.find((id) => !sim.tok.isValidId(id));
    if (bad !== undefined) throw new HttpError(400, `Token id ${bad} is out of vocabulary`);
    if (tokenIn.length === 0) throw new HttpError(400, "The prompt cannot be empty.");
    prompt = { text: sim.tok.decode(tokenIn), ids: tokenIn };
  } else prompt = renderPrompt(body, getRawBody(req), sim.model);
  const promptIds = prompt.ids;
  const requested = body.max_completion_tokens ?? body.max_tokens;
  if (promptIds.length >= o.maxModelLen) {
    throw new HttpError(400, `This model's maximum context length is ${o.maxModelLen} tokens. However, your request has ${promptIds.length} input tokens. Please reduce the length of the input messages.`);
  }
  if (requested !== null && requested !== undefined) {
    if (requested < 1) throw new HttpError(400, `max_tokens must be at least 1, got ${requested}.`);
    if (requested > o.maxModelLen - promptIds.length) {
      throw new HttpError(
        400,
        `'max_tokens' or 'max_completion_tokens' is too large: ${requested}. This model's maximum context length is ${o.maxModelLen} tokens and your request has ${promptIds.length} input tokens (${requested} > ${o.maxModelLen} - ${promptIds.length}).`,
      );
    }
  }
  const maxTokens = requested ?? o.maxModelLen - promptIds.length;

  // The DP rank. vLLM: the header; out of range is a 400 (input processor). SGLang: body or header; out of range → load balancing.
  let rank: number | undefined;
  if (sglang) rank = sglangRank(body.routed_dp_rank ?? body.data_parallel_rank, req.headers["x-data-parallel-rank"], sim.ranks.size);
  else {
    const header = parseRankHeader(req.headers["x-data-parallel-rank"], sim.ranks.size);
    if (header.kind === "out_of_range") throw new HttpError(400, `data_parallel_rank ${header.rank} is out of range [0, ${sim.ranks.size}).`);
    rank = header.kind === "rank" ? header.rank : undefined;
  }

  let forced: ForcedChoice | null;
  try {
    const harmony = sim.model.toolParser === "openai" || sim.model.reasoningParser === "openai_gptoss";
    forced = forcedChoice(body.tool_choice, body.tools, harmony);
  } catch (e) {
    if (e instanceof GuidedError) throw new HttpError(400, e.message);
    throw e;
  }
  let found;
  try {
    // A token-in prompt is what the model sees: its step is read from those ids, as on a raw prompt
    // (the messages only drive tools and parsers, and may be shaped for the template).
    found = tokenIn ? findScriptInText(prompt.text, sim.model.family) : findScriptStep(body.messages);
  } catch (e) {
    if (e instanceof ScriptError) throw new HttpError(400, `engine-sim: ${e.message}`);
    throw e;
  }
  let policy;
  try {
    if (forced) {
      // Guided decoding: the model writes the calls' JSON. Unscripted, it calls the named (else the first) tool with {}.
      const fallback = { tool_calls: [{ name: forced.kind === "named" ? forced.name : String((body.tools![0]!.function as { name?: unknown } | undefined)?.name), arguments: new PyDict([]) }] };
      const step = guidedStep(found ? (found.step ?? null) : fallback, forced, sglang);
      policy = continueOpenAnswer(scriptedOutput(step, sim.model, prompt.text), promptIds, sim.model);
    } else {
      policy = found ? continueOpenAnswer(scriptedOutput(found.step, sim.model, prompt.text), promptIds, sim.model) : randomOutput(o.seed, promptIds, o.randomTokens, sim.model);
    }
  } catch (e) {
    if (e instanceof ScriptError) throw new HttpError(400, `engine-sim: ${forced && found ? `step ${found.index}: ` : ""}${e.message}`);
    throw e;
  }
  const stop = body.stop === null || body.stop === undefined ? [] : typeof body.stop === "string" ? [body.stop] : body.stop;
  const completion = applyLimits(
    policy,
    {
      eosId: sim.model.eosId,
      extraStopIds: sim.model.extraStopIds,
      maxTokens,
      stop,
      stopTokenIds: body.stop_token_ids ?? [],
      includeStopStrInOutput: body.include_stop_str_in_output ?? false,
      skipSpecialTokens: body.skip_special_tokens ?? true,
    },
    sim.tok,
  );
  const wantLogprobs = body.logprobs === true;
  const topN = !wantLogprobs ? 0 : top === -1 ? MAX_TOP_LOGPROBS : Math.min(top ?? 0, MAX_TOP_LOGPROBS);
  const toolChoice = body.tool_choice ?? (body.tools ? "auto" : "none");
  const toolParsing = !!body.tools && toolChoice !== "none";
  return {
    body,
    sglang,
    requestId: requestId(body, req, sglang),
    created: Math.floor(Date.now() / 1000),
    promptIds,
    completion,
    rank,
    topN,
    wantLogprobs,
    asTokenIds: !sglang && (body.return_tokens_as_token_ids ?? o.returnTokensAsTokenIds),
    returnTokenIds: body.return_token_ids === true,
    returnPromptTokenIds: sglang && body.return_prompt_token_ids === true,
    sglextInputIds: sglang && (body.return_input_ids === true || headerOn(req, "x-sglext-return-input-ids") || o.returnInputIds),
    sglextOutputIds: sglang && (body.return_output_ids === true || headerOn(req, "x-sglext-return-output-ids") || o.returnOutputIds),
    routedExperts: returnsRoutedExperts(sim, body, sglang),
    toolParsing,
    forced,
    reasoningField: sglang ? "reasoning_content" : o.reasoningField,
    parseRequest: { tok: sim.tok, toolParsing, tools: body.tools ?? [], chatTemplateKwargs: body.chat_template_kwargs ?? {} },
  };
}

const envOf = (p: { sglang: boolean }): Envelope => (p.sglang ? "sglang-openai" : "vllm");

/** SGLang's `matched_stop`: the EOS / stop token id or the stop string; null on length or abort. */
function matchedStop(c: Completion, outcome: string, eosId: number): number | string | null {
  if (outcome === "abort" || c.finishReason !== "stop") return null;
  return c.stopReason ?? eosId;
}

function usage(promptTokens: number, completionTokens: number, cached: number) {
  return {
    prompt_tokens: promptTokens,
    total_tokens: promptTokens + completionTokens,
    completion_tokens: completionTokens,
    prompt_tokens_details: { cached_tokens: cached },
  };
}

/** SGLang tool-call ids are `call_` + 24 hex digits. */
function sglangToolId(id: string): string {
  return id.startsWith("call_") ? id : `call_${id.replace(/^chatcmpl-tool-/, "").slice(0, 24)}`;
}

/** The ids and text of what actually went out (all of it, or an aborted request's partial tokens). */
export function emitted(c: Completion, n: number): { ids: number[]; text: string } {
  if (n >= c.ids.length) return { ids: c.ids, text: c.text };
  return { ids: c.ids.slice(0, n), text: n === 0 ? "" : c.text.slice(0, c.ends[n - 1]!) };
}

/**
 * The answer as the server reads it: the family's parsers, or under a forced tool choice the
 * reasoning parser alone and the calls built from the guided JSON (guided.ts). `toolsCalled`: the
 * finish is "tool_calls" (vLLM: required only, when the answer stopped; SGLang: any built call).
 */
function answerOf(sim: SimState, p: Prepared, out: { ids: number[]; text: string }): ParsedOutput {
  const f = p.forced;
  if (!f) return sim.model.parser.parse(out.text, out.ids, p.parseRequest);
  const split = sim.model.parser.parse(out.text, out.ids, { ...p.parseRequest, toolParsing: false });
  const calls = guidedCalls(split.content ?? "", f, p.sglang);
  if (!calls) return { reasoning: split.reasoning, content: split.content, toolCalls: [], toolsCalled: false };
  const toolsCalled = p.completion.finishReason === "stop" && (p.sglang || f.kind === "required");
  return { reasoning: split.reasoning, content: p.sglang ? null : "", toolCalls: calls, toolsCalled };
}

/** Admission in the route's envelope: undefined when an error answer was sent. */
async function admitOrFail(sim: SimState, p: Prepared, reply: FastifyReply, signal: AbortSignal): Promise<Generation | undefined> {
  try {
    return await sim.engine.admit({ promptIds: p.promptIds, ids: p.completion.ids, topN: p.topN, cacheSalt: p.body.cache_salt ?? undefined, rank: p.rank, signal });
  } catch (e) {
    if (e instanceof EngineError) {
      sendEnvError(reply, envOf(p), e.status, e.message);
      return undefined;
    }
    throw e;
  }
}

async function respond(sim: SimState, p: Prepared, reply: FastifyReply) {
  const ac = disconnectSignal(reply);
  const g = await admitOrFail(sim, p, reply, ac.signal);
  if (!g) return reply;
  await runToEnd(sim, [g]);
  const early = endedEarly([g], reply);
  if (early) return early;
  const aborted = g.outcome === "abort";
  const c = p.completion;
  const out = emitted(c, g.tokens.length);
  const parsed = answerOf(sim, p, out);
  const { reasoning, content, toolsCalled } = parsed;
  const toolCalls = parsed.toolCalls.map((t) => ({ id: makeToolCallId(), type: "function" as const, function: { name: t.name, arguments: t.arguments } }));
  const finishReason = aborted ? g.finishAs : toolsCalled ? "tool_calls" : c.finishReason;
  const logprobs = p.wantLogprobs ? { content: g.tokens.map((t) => chatLogprobEntry(sim.tok, t, p.asTokenIds, p.sglang)) } : null;
  reply.header("x-sim-dp-rank", String(g.rank.index));
  if (p.sglang) {
    const message = {
      role: "assistant",
      content,
      reasoning_content: p.body.separate_reasoning === false ? null : reasoning,
      tool_calls: toolCalls.length > 0 ? toolCalls.map((t) => ({ ...t, id: sglangToolId(t.id), index: toolCalls.indexOf(t) })) : null,
    };
    const choice: Record<string, unknown> = { index: 0, message, logprobs, finish_reason: finishReason, matched_stop: matchedStop(c, g.outcome ?? "", sim.model.eosId) };
    if (p.returnTokenIds) choice.token_ids = out.ids;
    if (p.returnPromptTokenIds) choice.prompt_token_ids = p.promptIds;
    if (p.routedExperts) choice.sgl_ext = { routed_experts: sglangRoutedExperts(sim, g, p.promptIds) };
    const resp: Record<string, unknown> = {
      id: p.requestId,
      object: "chat.completion",
      created: p.created,
      model: p.body.model ?? sim.opts.model,
      choices: [choice],
      usage: usage(p.promptIds.length, out.ids.length, g.cached),
      metadata: { weight_version: sim.weightVersion },
    };
    const ext = sglext(p, out.ids);
    if (ext) resp.sglext = ext;
    return reply.send(resp);
  }
  const message: Record<string, unknown> = {
    role: "assistant",
    content,
    refusal: null,
    annotations: null,
    audio: null,
    function_call: null,
  };
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  message[p.reasoningField] = p.body.include_reasoning === false ? null : reasoning;
  const choice: Record<string, unknown> = {
    index: 0,
    message,
    logprobs,
    finish_reason: finishReason,
    stop_reason: aborted ? null : c.stopReason,
  };
  if (p.returnTokenIds) choice.token_ids = [...out.ids];
  const routed = p.routedExperts ? vllmRoutedExperts(sim, g, p.promptIds) : null;
  if (routed) choice.routed_experts = routed.output;
  const pl = p.body.prompt_logprobs;
  const body: Record<string, unknown> = {
    id: p.requestId,
    object: "chat.completion",
    created: p.created,
    model: sim.opts.model,
    choices: [choice],
    service_tier: null,
    system_fingerprint: null,
    usage: usage(p.promptIds.length, out.ids.length, g.cached),
    prompt_logprobs: pl === null || pl === undefined ? null : vllmPromptLogprobs(sim.tok, sim.weightVersion, p.promptIds, pl === -1 ? MAX_TOP_LOGPROBS : pl),
  };
  if (p.returnTokenIds) body.prompt_token_ids = p.promptIds;
  if (routed) body.prompt_routed_experts = routed.prompt;
  body.kv_transfer_params = null;
  return reply.send(body);
}

/** SGLang PR #34488's response-level ids: the prompt, and one output list per choice. */
function sglext(p: Prepared, outputIds: number[]): Record<string, unknown> | null {
  if (!p.sglextInputIds && !p.sglextOutputIds) return null;
  const ext: Record<string, unknown> = {};
  if (p.sglextInputIds) ext.input_ids = p.promptIds;
  if (p.sglextOutputIds) ext.output_ids = [outputIds];
  return ext;
}

/** SGLang's DeltaMessage as model_dump_json() writes it (every field, nulls included). */
function sglangDelta(d: { role?: string; content?: string; reasoning?: string; tool_calls?: unknown[] }) {
  return { role: d.role ?? null, content: d.content ?? null, reasoning_content: d.reasoning ?? null, tool_calls: d.tool_calls ?? null };
}

async function stream(sim: SimState, p: Prepared, reply: FastifyReply) {
  const o = sim.opts;
  const c = p.completion;
  const ac = disconnectSignal(reply);
  const g = await admitOrFail(sim, p, reply, ac.signal);
  if (!g) return reply;
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "x-sim-dp-rank": String(g.rank.index) });
  const send = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
  const base = { id: p.requestId, object: "chat.completion.chunk", created: p.created, model: p.sglang ? (p.body.model ?? o.model) : o.model };
  const includeUsage = p.body.stream_options?.include_usage === true;
  const continuous = includeUsage && p.body.stream_options?.continuous_usage_stats === true;
  const partialUsage = (n: number) => ({ prompt_tokens: p.promptIds.length, completion_tokens: n, total_tokens: p.promptIds.length + n });
  const sg = p.sglang;

  const roleChunk: Record<string, unknown> = sg
    ? { ...base, choices: [{ index: 0, delta: sglangDelta({ role: "assistant", content: "" }), logprobs: null, finish_reason: null, matched_stop: null }], usage: null }
    : { ...base, choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }] };
  if (continuous) roleChunk.usage = partialUsage(0);
  if (p.returnTokenIds && !sg) roleChunk.prompt_token_ids = p.promptIds;
  send(roleChunk);

  const parser: StreamingParser = p.forced
    ? new GuidedStreamer(sim.model.parser.stream({ ...p.parseRequest, toolParsing: false }), p.forced, p.sglang, makeToolCallId)
    : sim.model.parser.stream(p.parseRequest);
  // vLLM names "tool_calls" as the finish of streamed calls, except for a named function (then "stop").
  const streamedFinish = () => {
    if (!p.forced) return parser.toolsStreamed > 0 ? "tool_calls" : c.finishReason;
    return parser.toolsStreamed > 0 && p.forced.kind === "required" && c.finishReason === "stop" ? "tool_calls" : c.finishReason;
  };
  const last = c.ids.length - 1;
  try {
    for await (const t of sim.engine.run(g)) {
      const from = t.index === 0 ? 0 : c.ends[t.index - 1]!;
      const deltaText = c.text.slice(from, c.ends[t.index]!);
      const isLast = t.index === last;
      let delta: Delta | null = parser.push(t.id, deltaText, isLast);
      if (delta && delta.reasoning !== undefined && (p.body.include_reasoning === false || p.body.separate_reasoning === false)) {
        const { reasoning: _drop, ...rest } = delta;
        delta = Object.keys(rest).length > 0 ? rest : null;
      }
      const logprobs = p.wantLogprobs ? { content: [chatLogprobEntry(sim.tok, t, p.asTokenIds, sg)] } : null;
      if (sg) {
        // SGLang sends a chunk only when a parser produced text; the finish chunk follows separately.
        // A step whose text a parser swallowed still sends its logprobs, on a chunk of their own,
        // when a parser is active (serving_chat.py flushes them so none is dropped).
        if (delta === null) {
          if (logprobs && (sim.model.reasoningParser !== null || sim.model.toolParser !== null)) {
            send({ ...base, choices: [{ index: 0, delta: sglangDelta({}), logprobs, finish_reason: null, matched_stop: null }], usage: continuous ? partialUsage(t.index + 1) : null });
          }
          continue;
        }
        const tc = delta.tool_calls?.map((x) => (x.id ? { ...x, id: sglangToolId(x.id) } : x));
        const chunk = { ...base, choices: [{ index: 0, delta: sglangDelta({ ...delta, ...(tc ? { tool_calls: tc } : {}) }), logprobs, finish_reason: null, matched_stop: null }], usage: continuous ? partialUsage(t.index + 1) : null };
        send(chunk);
        continue;
      }
      // A token a parser swallowed goes out (as an empty delta) only with return_token_ids, as in vLLM.
      if (delta === null && !isLast && !p.returnTokenIds) continue;
      const wire: Record<string, unknown> = {};
      if (delta?.content !== undefined) wire.content = delta.content;
      if (delta?.reasoning !== undefined) wire[p.reasoningField] = delta.reasoning;
      if (delta?.tool_calls !== undefined) wire.tool_calls = delta.tool_calls;
      const choice: Record<string, unknown> = {
        index: 0,
        delta: wire,
        logprobs,
        finish_reason: isLast ? streamedFinish() : null,
      };
      if (isLast) choice.stop_reason = c.stopReason;
      if (p.returnTokenIds) choice.token_ids = [t.id];
      const chunk: Record<string, unknown> = { ...base, choices: [choice] };
      if (continuous) chunk.usage = partialUsage(t.index + 1);
      send(chunk);
    }
  } catch (e) {
    if (!ac.signal.aborted) {
      send(errorBody(envOf(p), 500, (e as Error).message));
      res.end("data: [DONE]\n\n");
    }
    return;
  }
  if (g.outcome === "client") return;
  if (g.outcome === "disconnect") {
    cutConnection(reply);
    return;
  }
  const n = g.tokens.length;
  if (sg) {
    const fr = g.outcome === "abort" ? g.finishAs : parser.toolsStreamed > 0 && c.finishReason === "stop" ? "tool_calls" : c.finishReason;
    const finish: Record<string, unknown> = { index: 0, delta: sglangDelta({}), logprobs: null, finish_reason: fr, matched_stop: matchedStop(c, g.outcome ?? "", sim.model.eosId) };
    // The routing is known once the request is done: it rides on the finishing chunk.
    if (p.routedExperts) finish.sgl_ext = { routed_experts: sglangRoutedExperts(sim, g, p.promptIds) };
    send({ ...base, choices: [finish], usage: null });
    // PR #34488: the ids arrive once, in a response-level chunk before [DONE].
    const ext = sglext(p, g.tokens.map((t) => t.id));
    if (ext) send({ ...base, choices: [], usage: null, sglext: ext });
  } else if (g.outcome === "abort") {
    // vLLM: the abort output carries no new token; its chunk has an empty delta and finish_reason "abort".
    const choice: Record<string, unknown> = { index: 0, delta: {}, logprobs: null, finish_reason: g.finishAs, stop_reason: null };
    if (p.returnTokenIds) choice.token_ids = [];
    send({ ...base, choices: [choice] });
  }
  if (includeUsage) send({ ...base, choices: [], usage: usage(p.promptIds.length, n, g.cached) });
  res.end("data: [DONE]\n\n");
}

export function registerChatRoutes(app: FastifyInstance, sim: SimState): void {
  app.post("/v1/chat/completions", async (req, reply) => {
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
