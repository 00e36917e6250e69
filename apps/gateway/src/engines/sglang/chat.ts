import { templateFields, type ModelProfile } from "@rollgate/models";
import { definedSampling, type CanonicalChatRequest, type ChatMessage } from "@rollgate/protocol";
import { StreamAccumulator, resultAsEvents, splitToolCallTurns, type EngineResult, type EngineStreamEvent } from "@rollgate/transforms";
import { request, type Dispatcher } from "undici";
import { z } from "zod";
import { stopStringFinish } from "../answer-check.js";
import { EngineError, outputAfterFinish, unreachable } from "../errors.js";
import { ChatLogprob, checkedChunk, engineJson, OpenAIUsage, isIntArray, isLogprob, isObj, isUsage, nullishInt, nullishIntArray, nullishStr, rejectUnlessOk, toTokenLogprob, usageOf } from "../openai-wire.js";
import { sseJson } from "../sse.js";
import { postForStream, type StreamedResponse } from "../stream-request.js";
import { engineUrl, promptIdsFields, type EngineCall } from "../call.js";
import { fromSglang } from "./routed-experts.js";

/**
 * The SGLang adapter, on SGLang's OpenAI chat route with its token-id extensions: PR #30917's
 * `return_token_ids` / `return_prompt_token_ids` (→ `choices[].token_ids` / `prompt_token_ids`)
 * and PR #34488's `return_input_ids` / `return_output_ids` (→ `sglext.input_ids` / `output_ids`,
 * whichever the server has), `logprobs` (token text only: values line up with the ids by
 * position), `separate_reasoning` (→ `reasoning_content`) and `routed_dp_rank` in the body.
 *
 * SGLang refuses PR #30917's ids on streamed chat. A streamed agent call is streamed from the
 * engine when its chat stream carries PR #34488's ids (probed: capabilities.ts `streamedIds`): the
 * text and each token's logprob come as they are generated, the prompt's and the answer's ids
 * once, in the response-level `sglext` chunk before `[DONE]`. On an SGLang without them, the call
 * is answered from one non-streamed engine call replayed as events: the record is the same, but
 * time-to-first-token is the whole generation.
 */

function toSglangMessage(m: ChatMessage): Record<string, unknown> {
  if (m.role !== "assistant" || m.reasoning == null) return m;
  return { ...m, reasoning_content: m.reasoning };
}

/** The request body SGLang gets. Pure, so it has golden tests. */
export function buildSglangChatBody(
  model: string,
  req: CanonicalChatRequest,
  dpRank: number,
  profile: ModelProfile,
  promptIds?: EngineCall["promptIds"],
  routedExperts = false,
): Record<string, unknown> {
  const s = req.sampling;
  const body: Record<string, unknown> = {
    model,
    messages: splitToolCallTurns(req.messages, profile.tool_calls_per_turn).map(toSglangMessage),
    stream: false,
    logprobs: true,
    top_logprobs: req.client_logprobs?.top_logprobs ?? 0,
    return_token_ids: true,
    return_prompt_token_ids: true,
    separate_reasoning: true,
    return_input_ids: true,
    return_output_ids: true,
    routed_dp_rank: dpRank,
  };
  if (routedExperts) body.return_routed_experts = true;
  if (req.tools) body.tools = req.tools;
  if (req.tool_choice) body.tool_choice = req.tool_choice;
  Object.assign(body, templateFields(profile, req), promptIdsFields(promptIds));
  Object.assign(body, definedSampling(s));
  return body;
}



/** PR #34488's response-level ids: the prompt, and one output list per choice. */
const SglExt = z
  .object({ input_ids: z.array(z.number().int()).nullish(), output_ids: z.array(z.array(z.number().int())).nullish() })
  .loose()
  .nullish();

const SglangToolCallDelta = z.object({
  id: z.string().nullish(),
  index: z.number().int().nullish(),
  function: z.object({ name: z.string().nullish(), arguments: z.string().nullish() }).nullish(),
});

/** One chunk of SGLang's streamed chat: the fields read. */
const SglangStreamChunk = z.object({
  choices: z
    .array(
      z.object({
        delta: z
          .object({ content: z.string().nullish(), reasoning_content: z.string().nullish(), tool_calls: z.array(SglangToolCallDelta).nullish() })
          .nullish(),
        logprobs: z.object({ content: z.array(ChatLogprob).nullable() }).nullish(),
        finish_reason: z.string().nullish(),
        matched_stop: z.union([z.string(), z.number()]).nullish(),
      }),
    )
    .nullish(),
  usage: OpenAIUsage.nullish(),
  sglext: SglExt,
});

type SglangStreamChunk = z.infer<typeof SglangStreamChunk>;

// The checks below accept exactly what SglangStreamChunk accepts, field by field, without zod's
// per-chunk cost (one chunk per token); a chunk they refuse is parsed by the schema for its error.
const nullish = (x: unknown) => x === undefined || x === null;
function isToolCallDelta(t: unknown): boolean {
  if (!isObj(t) || !nullishStr(t.id) || !nullishInt(t.index)) return false;
  const f = t.function;
  return nullish(f) || (isObj(f) && nullishStr(f.name) && nullishStr(f.arguments));
}
function isStreamChoice(c: unknown): boolean {
  if (!isObj(c)) return false;
  const d = c.delta;
  if (!nullish(d)) {
    if (!isObj(d) || !nullishStr(d.content) || !nullishStr(d.reasoning_content)) return false;
    if (!nullish(d.tool_calls)) {
      if (!Array.isArray(d.tool_calls)) return false;
      for (const t of d.tool_calls) if (!isToolCallDelta(t)) return false;
    }
  }
  const lp = c.logprobs;
  if (!nullish(lp)) {
    if (!isObj(lp)) return false;
    if (lp.content !== null) {
      if (!Array.isArray(lp.content)) return false;
      for (const l of lp.content) if (!isLogprob(l)) return false;
    }
  }
  const ms = c.matched_stop;
  return nullishStr(c.finish_reason) && (nullish(ms) || typeof ms === "string" || typeof ms === "number");
}
function isSglExt(x: unknown): boolean {
  if (nullish(x)) return true;
  if (!isObj(x) || !nullishIntArray(x.input_ids)) return false;
  const out = x.output_ids;
  if (nullish(out)) return true;
  if (!Array.isArray(out)) return false;
  for (const ids of out) if (!isIntArray(ids)) return false;
  return true;
}
function isSglangStreamChunk(x: unknown): x is SglangStreamChunk {
  if (!isObj(x) || !isUsage(x.usage) || !isSglExt(x.sglext)) return false;
  if (nullish(x.choices)) return true;
  if (!Array.isArray(x.choices)) return false;
  for (const c of x.choices) if (!isStreamChoice(c)) return false;
  return true;
}

/** One SSE chunk of SGLang's chat stream, checked (an EngineError names what is wrong with a bad one). */
export function readSglangChunk(json: unknown): SglangStreamChunk {
  return checkedChunk(json, isSglangStreamChunk, SglangStreamChunk);
}

const SglangChatResponse = z.object({
  choices: z
    .array(
      z.object({
        message: z.object({
          content: z.string().nullable().optional(),
          reasoning_content: z.string().nullable().optional(),
          tool_calls: z
            .array(z.object({ id: z.string().nullable().optional(), function: z.object({ name: z.string().nullable().optional(), arguments: z.string().nullable().optional() }) }))
            .nullable()
            .optional(),
        }),
        logprobs: z.object({ content: z.array(ChatLogprob).nullable() }).nullable().optional(),
        finish_reason: z.string().nullable(),
        matched_stop: z.union([z.string(), z.number()]).nullable().optional(),
        token_ids: z.array(z.number().int()).nullable().optional(),
        prompt_token_ids: z.array(z.number().int()).nullable().optional(),
        sgl_ext: z.object({ routed_experts: z.string().nullish() }).loose().nullish(),
      }),
    )
    .min(1),
  usage: OpenAIUsage.nullable().optional(),
  sglext: SglExt,
  /** SGLang v0.5.x: the engine's weight version when it answered (later releases: `sglext.weight_version`). */
  metadata: z.object({ weight_version: z.string().nullish() }).loose().nullish(),
});


type SglangCall = Omit<EngineCall, "requestId"> & { requestId?: string };

function sglangHeaders(call: SglangCall): Record<string, string> {
  return {
    "content-type": "application/json",
    "x-data-parallel-rank": String(call.target.dpRank),
    ...(call.requestId ? { "x-request-id": call.requestId } : {}),
  };
}

/** POSTs JSON to an SGLang route on the call's rank; a non-200 answer is an EngineError with SGLang's message. */
export async function sglangPost(call: SglangCall, path: string, body: unknown): Promise<Dispatcher.ResponseData> {
  const url = call.target.engine.url;
  let res: Dispatcher.ResponseData;
  try {
    res = await request(engineUrl(url, path), { method: "POST", dispatcher: call.dispatcher, signal: call.signal, headers: sglangHeaders(call), body: JSON.stringify(body) });
  } catch (err) {
    throw unreachable(url, err, call.signal);
  }
  await rejectUnlessOk(res, url);
  return res;
}

/** sglangPost for a streamed agent's answer (stream-request.ts: sent sooner). */
async function sglangPostStreamed(call: SglangCall, path: string, body: unknown): Promise<StreamedResponse> {
  const url = call.target.engine.url;
  const json = JSON.stringify(body);
  let res: StreamedResponse;
  try {
    res = await postForStream(call.dispatcher, engineUrl(url, path), sglangHeaders(call), json, call.signal);
  } catch (err) {
    throw unreachable(url, err, call.signal);
  }
  await rejectUnlessOk(res, url);
  return res;
}


const MISSING_IDS =
  "the engine returned no token ids: rollgate needs an SGLang with return_token_ids / return_prompt_token_ids (or return_input_ids / return_output_ids) on its chat route";

export async function sglangChat(call: EngineCall): Promise<EngineResult> {
  // Stamped (a freeze-in-place pause may fall inside it): read as a stream, so each token carries
  // the weight version current when it came.
  if (call.stamp && call.streamedIds && call.target.engine.routed_experts !== true) {
    const acc = new StreamAccumulator();
    for await (const event of sglangChatStream({ ...call, request: { ...call.request, stream: true } })) acc.push(event);
    return acc.result();
  }
  const res = await sglangPost(call, "/v1/chat/completions", buildSglangChatBody(call.model, call.request, call.target.dpRank, call.target.profile, call.promptIds, call.target.engine.routed_experts === true));
  const parsed = SglangChatResponse.safeParse(await engineJson(res, call.target.engine.url, call.signal));
  if (!parsed.success) throw new EngineError(`engine response is not a chat completion: ${parsed.error.message}`, 502, "bad_response");
  const choice = parsed.data.choices[0]!;
  const promptIds = choice.prompt_token_ids ?? parsed.data.sglext?.input_ids;
  const outputIds = choice.token_ids ?? parsed.data.sglext?.output_ids?.[0];
  if (!outputIds || !promptIds) throw new EngineError(MISSING_IDS, 502, "bad_response");
  const lps = (choice.logprobs?.content ?? []).map(toTokenLogprob);
  if (lps.length !== outputIds.length) {
    throw new EngineError(`engine returned ${outputIds.length} token ids but ${lps.length} logprobs`, 502, "bad_response");
  }
  const usage = parsed.data.usage;
  const routed = fromSglang(call.target, choice.sgl_ext?.routed_experts, promptIds.length, outputIds.length);
  const ext = parsed.data.sglext?.weight_version;
  const engineVersion = parsed.data.metadata?.weight_version ?? (typeof ext === "string" ? ext : null);
  return {
    prompt_ids: promptIds,
    output_ids: outputIds,
    output_logprobs: lps.map((l) => l.logprob),
    logprobs: lps,
    message: {
      content: choice.message.content ?? null,
      reasoning: choice.message.reasoning_content ?? null,
      tool_calls: (choice.message.tool_calls ?? []).map((t, i) => ({
        id: t.id ?? `call_${i}`,
        type: "function" as const,
        function: { name: t.function.name ?? "", arguments: t.function.arguments ?? "" },
      })),
    },
    finish_reason: stopStringFinish(choice.finish_reason ?? "stop", choice.matched_stop),
    stop_reason: choice.matched_stop ?? null,
    usage: usageOf(usage, promptIds.length, outputIds.length),
    ...(routed ? { routed_experts: routed } : {}),
    ...(engineVersion !== null ? { engine_weight_version: engineVersion } : {}),
  };
}

/** The body of a streamed chat call: PR #34488's ids only (SGLang refuses PR #30917's on streams). */
export function buildSglangChatStreamBody(model: string, req: CanonicalChatRequest, dpRank: number, profile: ModelProfile, promptIds?: EngineCall["promptIds"]): Record<string, unknown> {
  const { return_token_ids: _ids, return_prompt_token_ids: _promptIds, ...body } = buildSglangChatBody(model, req, dpRank, profile, promptIds);
  return { ...body, stream: true, stream_options: { include_usage: true } };
}

/**
 * A streaming call: streamed from the engine when its stream carries the ids, else answered from
 * one non-streaming engine call (see the module comment; also for routed experts, which come
 * whole, and for a call whose tokens are stamped as they arrive, which goes through /generate).
 *
 * Text deltas carry their tokens' logprobs but no ids (SGLang sends those once, at the end): the
 * ids follow as one token-only delta, and the prompt's ids ride on the finish.
 */
export async function* sglangChatStream(call: EngineCall): AsyncGenerator<EngineStreamEvent> {
  if (!call.streamedIds || call.target.engine.routed_experts === true) {
    yield* resultAsEvents(await sglangChat(call));
    return;
  }
  /** With stamps: each token's weight version, taken as its logprob arrives (one logprob per token). */
  const versions: (string | null)[] = [];
  const res = await sglangPostStreamed(call, "/v1/chat/completions", buildSglangChatStreamBody(call.model, call.request, call.target.dpRank, call.target.profile, call.promptIds));
  let started = false;
  let logprobCount = 0;
  let finish: Extract<EngineStreamEvent, { type: "finish" }> | null = null;
  let usage: z.infer<typeof OpenAIUsage> | null = null;
  let inputIds: number[] | null = null;
  let outputIds: number[] | null = null;
  for await (const json of sseJson(res.body, { url: call.target.engine.url, signal: call.signal })) {
    const c = readSglangChunk(json);
    if (!started) {
      started = true;
      yield { type: "start", prompt_ids: [] };
    }
    const choice = c.choices?.[0];
    if (choice) {
      const d = choice.delta;
      const lps = (choice.logprobs?.content ?? []).map(toTokenLogprob);
      // After the finish only the ids (sglext) and usage chunks, with no choice, may come.
      if (finish && (lps.length > 0 || d?.content || d?.reasoning_content || (d?.tool_calls?.length ?? 0) > 0 || choice.finish_reason)) throw outputAfterFinish();
      logprobCount += lps.length;
      if (call.stamp && lps.length > 0) {
        const version = call.stamp();
        for (let i = 0; i < lps.length; i++) versions.push(version);
      }
      const toolCalls = (d?.tool_calls ?? []).map((t, i) => ({
        index: t.index ?? i,
        ...(t.id ? { id: t.id, type: "function" as const } : {}),
        function: {
          ...(t.function?.name ? { name: t.function.name } : {}),
          ...(t.function?.arguments ? { arguments: t.function.arguments } : {}),
        },
      }));
      if (d?.content || d?.reasoning_content || toolCalls.length > 0 || lps.length > 0) {
        yield {
          type: "delta",
          ...(d?.content ? { content: d.content } : {}),
          ...(d?.reasoning_content ? { reasoning: d.reasoning_content } : {}),
          ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
          token_ids: [],
          logprobs: lps,
        };
      }
      if (choice.finish_reason) finish = { type: "finish", finish_reason: stopStringFinish(choice.finish_reason, choice.matched_stop), stop_reason: choice.matched_stop ?? null };
    }
    if (c.usage) usage = c.usage;
    if (c.sglext?.input_ids) inputIds = c.sglext.input_ids;
    if (c.sglext?.output_ids?.[0]) outputIds = c.sglext.output_ids[0];
  }
  if (!inputIds || !outputIds) throw new EngineError(MISSING_IDS, 502, "bad_response");
  if (logprobCount !== outputIds.length) throw new EngineError(`engine streamed ${outputIds.length} token ids but ${logprobCount} logprobs`, 502, "bad_response");
  if (!finish) throw new EngineError("the engine stream ended without a finish reason", 502, "bad_response");
  if (outputIds.length > 0) yield { type: "delta", token_ids: outputIds, logprobs: [], ...(call.stamp ? { versions } : {}) };
  yield { ...finish, prompt_ids: inputIds };
  yield { type: "usage", usage: usageOf(usage, inputIds.length, outputIds.length) };
}

const SglangTokenizeResponse = z.object({ count: z.number().int() });

/** Prompt tokens of a chat request via SGLang's `/tokenize` (messages form). */
export async function sglangCountTokens(call: Omit<EngineCall, "requestId">): Promise<number> {
  const req = call.request;
  const res = await sglangPost(call, "/tokenize", {
    model: call.model,
    messages: splitToolCallTurns(req.messages, call.target.profile.tool_calls_per_turn).map(toSglangMessage),
    ...(req.tools ? { tools: req.tools } : {}),
    ...templateFields(call.target.profile, req),
  });
  const parsed = SglangTokenizeResponse.safeParse(await engineJson(res, call.target.engine.url, call.signal));
  if (!parsed.success) throw new EngineError("engine /tokenize answer has no count", 502, "bad_response");
  return parsed.data.count;
}
