import { templateFields, type ModelProfile } from "@rollgate/models";
import { definedSampling, type CanonicalChatRequest, type ChatMessage, type TokenLogprob } from "@rollgate/protocol";
import { StreamAccumulator, resultAsEvents, splitToolCallTurns, type EngineResult, type EngineStreamEvent } from "@rollgate/transforms";
import { request, type Dispatcher } from "undici";
import { z } from "zod";
import { engineFinish, stopStringFinish } from "../answer-check.js";
import { EngineError, outputAfterFinish, unreachable } from "../errors.js";
import { ChatLogprob, checkedChunk, engineJson, OpenAIUsage, isLogprob, isObj, isUsage, nullishIntArray, nullishStr, optInt, optStr, rejectUnlessOk, toTokenLogprob, usageOf } from "../openai-wire.js";
import { sseEach, sseJson } from "../sse.js";
import { engineUrl, promptIdsFields, type EngineCall } from "../call.js";
import { postForStream, type StreamedResponse } from "../stream-request.js";
import { wantsRoutedExperts, wholeAnswerStamp } from "../routed-experts.js";
import { fromVllm } from "./routed-experts.js";

/**
 * The vLLM adapter: canonical chat → vLLM's OpenAI server with its token extensions
 * (`return_token_ids` ≥ v0.10.2, `logprobs`), routed by the `X-data-parallel-rank` header.
 */

export function toVllmMessage(m: ChatMessage): Record<string, unknown> {
  if (m.role !== "assistant" || m.reasoning == null) return m;
  // vLLM renamed the field (reasoning_content → reasoning); chat templates read reasoning_content.
  // Sending both keeps the history intact on every version.
  return { ...m, reasoning: m.reasoning, reasoning_content: m.reasoning };
}

/** The request body vLLM gets. Pure, so it has golden tests. */
export function buildVllmChatBody(model: string, req: CanonicalChatRequest, profile: ModelProfile, promptIds?: EngineCall["promptIds"]): Record<string, unknown> {
  const s = req.sampling;
  const body: Record<string, unknown> = {
    model,
    messages: splitToolCallTurns(req.messages, profile.tool_calls_per_turn).map(toVllmMessage),
    stream: req.stream,
    logprobs: true,
    top_logprobs: req.client_logprobs?.top_logprobs ?? 0,
    return_token_ids: true,
  };
  if (req.stream) body.stream_options = { include_usage: true };
  if (req.tools) body.tools = req.tools;
  if (req.tool_choice) body.tool_choice = req.tool_choice;
  Object.assign(body, templateFields(profile, req), promptIdsFields(promptIds));
  Object.assign(body, definedSampling(s));
  return body;
}


const VllmToolCall = z.object({
  id: z.string().nullable().optional(),
  type: z.literal("function").nullable().optional(),
  index: z.number().int().optional(),
  function: z.object({ name: z.string().nullable().optional(), arguments: z.string().nullable().optional() }),
});


const VllmChatResponse = z.object({
  prompt_token_ids: z.array(z.number().int()).nullable().optional(),
  choices: z
    .array(
      z.object({
        message: z.object({
          content: z.string().nullable().optional(),
          reasoning: z.string().nullable().optional(),
          reasoning_content: z.string().nullable().optional(),
          tool_calls: z.array(VllmToolCall).nullable().optional(),
        }),
        logprobs: z.object({ content: z.array(ChatLogprob).nullable() }).nullable().optional(),
        finish_reason: z.string().nullable(),
        stop_reason: z.union([z.string(), z.number()]).nullable().optional(),
        token_ids: z.array(z.number().int()).nullable().optional(),
        routed_experts: z.unknown().optional(),
      }),
    )
    .min(1),
  usage: OpenAIUsage.nullable().optional(),
  prompt_routed_experts: z.unknown().optional(),
});

const VllmChunk = z.object({
  prompt_token_ids: z.array(z.number().int()).nullable().optional(),
  choices: z.array(
    z.object({
      delta: z
        .object({
          role: z.string().optional(),
          content: z.string().nullable().optional(),
          reasoning: z.string().nullable().optional(),
          reasoning_content: z.string().nullable().optional(),
          tool_calls: z.array(VllmToolCall).nullable().optional(),
        })
        .optional(),
      logprobs: z.object({ content: z.array(ChatLogprob).nullable() }).nullable().optional(),
      finish_reason: z.string().nullable().optional(),
      stop_reason: z.union([z.string(), z.number()]).nullable().optional(),
      token_ids: z.array(z.number().int()).nullable().optional(),
    }),
  ),
  usage: OpenAIUsage.nullable().optional(),
});

type VllmChunk = z.infer<typeof VllmChunk>;
type DeltaEvent = Extract<EngineStreamEvent, { type: "delta" }>;

// The checks below accept exactly what VllmChunk accepts, field by field, without zod's per-chunk
// cost (a streamed answer is one chunk per token: a full parse of each was a visible share of the
// gateway's CPU). A chunk they refuse is parsed by the schema, whose error names the bad field.
function isToolCall(t: unknown): boolean {
  if (!isObj(t) || !nullishStr(t.id) || !(t.type === undefined || t.type === null || t.type === "function") || !optInt(t.index)) return false;
  const f = t.function;
  return isObj(f) && nullishStr(f.name) && nullishStr(f.arguments);
}
function isChunkChoice(c: unknown): boolean {
  if (!isObj(c)) return false;
  const d = c.delta;
  if (d !== undefined) {
    if (!isObj(d) || !optStr(d.role) || !nullishStr(d.content) || !nullishStr(d.reasoning) || !nullishStr(d.reasoning_content)) return false;
    if (d.tool_calls !== undefined && d.tool_calls !== null) {
      if (!Array.isArray(d.tool_calls)) return false;
      for (const t of d.tool_calls) if (!isToolCall(t)) return false;
    }
  }
  const lp = c.logprobs;
  if (lp !== undefined && lp !== null) {
    if (!isObj(lp)) return false;
    if (lp.content !== null) {
      if (!Array.isArray(lp.content)) return false;
      for (const l of lp.content) if (!isLogprob(l)) return false;
    }
  }
  const sr = c.stop_reason;
  return nullishStr(c.finish_reason) && (sr === undefined || sr === null || typeof sr === "string" || typeof sr === "number") && nullishIntArray(c.token_ids);
}
function isVllmChunk(x: unknown): x is VllmChunk {
  if (!isObj(x) || !nullishIntArray(x.prompt_token_ids) || !Array.isArray(x.choices) || !isUsage(x.usage)) return false;
  for (const c of x.choices) if (!isChunkChoice(c)) return false;
  return true;
}

/** One SSE chunk of vLLM's chat stream, checked (an EngineError names what is wrong with a bad one). */
export function readVllmChunk(json: unknown): VllmChunk {
  return checkedChunk(json, isVllmChunk, VllmChunk);
}



/**
 * The finish reason of an answer cut by `max_tokens`. vLLM's chat route says `tool_calls` for any
 * answer whose tool call it parsed, cut or not (serving_chat puts it over `length`); an answer with
 * as many tokens as it was allowed was cut, and is told so: the agent gets its protocol's truncation
 * and the record and trajectory say `length` (prime-rl's `is_truncated`, break diagnosis). The one
 * answer told wrongly is one whose end of turn is exactly its last allowed token (the route does not
 * say which).
 */
export function cutFinishReason(reason: string, outputTokens: number, maxTokens: number | undefined): string {
  return reason === "tool_calls" && maxTokens !== undefined && outputTokens >= maxTokens ? "length" : engineFinish(reason);
}

export const MISSING_TOKENS =
  "the engine returned no token ids: rollgate needs vLLM ≥ 0.10.2 (return_token_ids) with logprobs enabled";

function engineHeaders(call: EngineCall): Record<string, string> {
  return { "content-type": "application/json", "x-data-parallel-rank": String(call.target.dpRank), "x-request-id": call.requestId };
}

async function post(call: EngineCall): Promise<Dispatcher.ResponseData> {
  const { target } = call;
  try {
    return await request(engineUrl(target.engine.url, "/v1/chat/completions"), {
      method: "POST",
      dispatcher: call.dispatcher,
      signal: call.signal,
      headers: engineHeaders(call),
      body: JSON.stringify(buildVllmChatBody(call.model, call.request, target.profile, call.promptIds)),
    });
  } catch (err) {
    throw unreachable(call.target.engine.url, err, call.signal);
  }
}

/** The same request as post(), for a streamed agent's answer (stream-request.ts: sent sooner). */
async function postStreamed(call: EngineCall): Promise<StreamedResponse> {
  const { target } = call;
  const body = JSON.stringify(buildVllmChatBody(call.model, call.request, target.profile, call.promptIds));
  try {
    return await postForStream(call.dispatcher, engineUrl(target.engine.url, "/v1/chat/completions"), engineHeaders(call), body, call.signal);
  } catch (err) {
    throw unreachable(call.target.engine.url, err, call.signal);
  }
}

/**
 * Whether a call's prompt ids come with the engine's first chunk: when it is read as a stream (a
 * streamed agent, or a stamped call), except where routed experts make it one whole answer.
 */
export function vllmTellsPromptFirst(call: EngineCall, streamed: boolean): boolean {
  return !wantsRoutedExperts(call.target) && (streamed || call.stamp !== undefined);
}

/**
 * One non-streaming call. When the caller stamps weight versions, the call is read as a stream
 * instead (the same record), so each token carries the version current when it arrived.
 */
export async function vllmChat(call: EngineCall): Promise<EngineResult> {
  if (call.stamp && !wantsRoutedExperts(call.target)) {
    // The stream read straight into the answer, each chunk in the engine read that brought it (no
    // generator, promise or microtask per chunk between them).
    const res = await post({ ...call, request: { ...call.request, stream: true } });
    await rejectUnlessOk(res, call.target.engine.url);
    const reader = new VllmStreamReader(call.stamp, call.onPromptIds, call.request.sampling.max_tokens);
    const acc = new StreamAccumulator();
    await sseEach(res.body, (json) => reader.read(json, acc), { url: call.target.engine.url, signal: call.signal });
    reader.end();
    if (!acc.isFinished) throw new EngineError("the engine stream ended without a finish reason", 502, "bad_response");
    return acc.result();
  }
  // Routed experts come only on whole answers: a stamped call is then stamped once, on arrival.
  const stamp = call.stamp ? wholeAnswerStamp(call.stamp) : undefined;
  const res = await post({ ...call, request: { ...call.request, stream: false } });
  await rejectUnlessOk(res, call.target.engine.url);
  const parsed = VllmChatResponse.safeParse(await engineJson(res, call.target.engine.url, call.signal));
  if (!parsed.success) throw new EngineError(`engine response is not a chat completion: ${parsed.error.message}`, 502, "bad_response");
  const body = parsed.data;
  const choice = body.choices[0]!;
  const lps = choice.logprobs?.content ?? [];
  if (!body.prompt_token_ids || !choice.token_ids) throw new EngineError(MISSING_TOKENS, 502, "bad_response");
  if (lps.length !== choice.token_ids.length) {
    throw new EngineError(`engine returned ${choice.token_ids.length} token ids but ${lps.length} logprobs`, 502, "bad_response");
  }
  const m = choice.message;
  const logprobs = lps.map(toTokenLogprob);
  const routed = fromVllm(call.target, body.prompt_routed_experts, choice.routed_experts, body.prompt_token_ids.length, choice.token_ids.length);
  return {
    prompt_ids: body.prompt_token_ids,
    output_ids: choice.token_ids,
    output_logprobs: logprobs.map((l) => l.logprob),
    logprobs,
    message: {
      content: m.content ?? null,
      reasoning: m.reasoning ?? m.reasoning_content ?? null,
      tool_calls: (m.tool_calls ?? []).map((t) => ({
        id: t.id ?? "",
        type: "function" as const,
        function: { name: t.function.name ?? "", arguments: t.function.arguments ?? "" },
      })),
    },
    finish_reason: stopStringFinish(cutFinishReason(choice.finish_reason ?? "stop", choice.token_ids.length, call.request.sampling.max_tokens), choice.stop_reason),
    stop_reason: choice.stop_reason ?? null,
    usage: usageOf(body.usage, body.prompt_token_ids.length, choice.token_ids.length),
    ...(routed ? { routed_experts: routed } : {}),
    ...(stamp ? { output_versions: choice.token_ids.map(() => stamp()) } : {}),
  };
}

/**
 * vLLM's chat stream read chunk by chunk into canonical events (one reader per answer): the
 * streamed agent's events and the drained call's accumulator take them alike.
 */
class VllmStreamReader {
  private started = false;
  private finished = false;
  private tokens = 0;
  private logprobCount = 0;

  constructor(
    private readonly stamp: EngineCall["stamp"],
    private readonly onPromptIds: EngineCall["onPromptIds"],
    /** The `max_tokens` the engine was sent (cutFinishReason). */
    private readonly maxTokens: number | undefined,
  ) {}

  read(json: unknown, out: { push(event: EngineStreamEvent): unknown }): void {
    const c = readVllmChunk(json);
    if (c.prompt_token_ids && !this.started) {
      this.started = true;
      this.onPromptIds?.(c.prompt_token_ids);
      out.push({ type: "start", prompt_ids: c.prompt_token_ids });
    }
    const choice = c.choices[0];
    if (choice) {
      const ids = choice.token_ids ?? [];
      const content = choice.logprobs?.content;
      const lps: TokenLogprob[] = [];
      if (content) for (let i = 0; i < content.length; i++) lps.push(toTokenLogprob(content[i]!));
      this.tokens += ids.length;
      this.logprobCount += lps.length;
      const d = choice.delta;
      const reasoning = d?.reasoning ?? d?.reasoning_content ?? undefined;
      const hasText = (d?.content ?? "") !== "" || (reasoning ?? "") !== "" || (d?.tool_calls?.length ?? 0) > 0;
      // After the finish only the usage chunk (no choice) may come.
      if (this.finished && (ids.length > 0 || lps.length > 0 || hasText || choice.finish_reason)) throw outputAfterFinish();
      if (ids.length > 0 || hasText) {
        // Built field by field, in the order the event always had, rather than from spreads of
        // `cond ? {...} : {}` (an object made and copied per field per token).
        const event: DeltaEvent = { type: "delta" } as DeltaEvent;
        if (this.stamp) {
          const version = this.stamp() ?? null;
          const versions: (string | null)[] = [];
          for (let i = 0; i < ids.length; i++) versions.push(version);
          event.versions = versions;
        }
        if (d?.content) event.content = d.content;
        if (reasoning) event.reasoning = reasoning;
        if (d?.tool_calls && d.tool_calls.length > 0) {
          event.tool_calls = d.tool_calls.map((t, i) => ({
            index: t.index ?? i,
            ...(t.id ? { id: t.id, type: "function" as const } : {}),
            function: {
              ...(t.function.name ? { name: t.function.name } : {}),
              ...(t.function.arguments ? { arguments: t.function.arguments } : {}),
            },
          }));
        }
        event.token_ids = ids;
        event.logprobs = lps;
        out.push(event);
      }
      if (choice.finish_reason) {
        this.finished = true;
        out.push({ type: "finish", finish_reason: stopStringFinish(cutFinishReason(choice.finish_reason, this.tokens, this.maxTokens), choice.stop_reason), stop_reason: choice.stop_reason ?? null });
      }
    }
    if (c.usage) {
      out.push({ type: "usage", usage: usageOf(c.usage, 0, 0) });
    }
  }

  /** The stream has ended: it must have told the ids, one logprob each. */
  end(): void {
    if (!this.started) throw new EngineError(MISSING_TOKENS, 502, "bad_response");
    if (this.tokens !== this.logprobCount) throw new EngineError(`engine streamed ${this.tokens} token ids but ${this.logprobCount} logprobs`, 502, "bad_response");
  }
}

/**
 * A streaming call: yields canonical events as vLLM's SSE chunks arrive. With routed experts on,
 * the answer is asked for whole (vLLM sends them on non-streamed answers only) and told as events.
 */
export async function* vllmChatStream(call: EngineCall): AsyncGenerator<EngineStreamEvent> {
  if (wantsRoutedExperts(call.target)) {
    yield* resultAsEvents(await vllmChat({ ...call, request: { ...call.request, stream: false } }));
    return;
  }
  const res = await postStreamed(call);
  await rejectUnlessOk(res, call.target.engine.url);
  const reader = new VllmStreamReader(call.stamp, call.onPromptIds, call.request.sampling.max_tokens);
  const events: EngineStreamEvent[] = [];
  for await (const json of sseJson(res.body, { url: call.target.engine.url, signal: call.signal })) {
    reader.read(json, events);
    for (const event of events) yield event;
    events.length = 0;
  }
  reader.end();
}

const VllmTokenizeResponse = z.object({ count: z.number().int() });

/** Counts a chat request's prompt tokens with the engine's own tokenizer and template (`POST /tokenize`, chat form). */
export async function vllmCountTokens(call: Omit<EngineCall, "requestId">): Promise<number> {
  const { target, request: req } = call;
  const body: Record<string, unknown> = {
    model: call.model,
    messages: splitToolCallTurns(req.messages, target.profile.tool_calls_per_turn).map(toVllmMessage),
    add_generation_prompt: true,
    ...(req.tools ? { tools: req.tools } : {}),
    ...templateFields(target.profile, req),
  };
  let res: Dispatcher.ResponseData;
  try {
    res = await request(`${target.engine.url}/tokenize`, {
      method: "POST",
      dispatcher: call.dispatcher,
      signal: call.signal,
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch (err) {
    throw unreachable(target.engine.url, err, call.signal);
  }
  await rejectUnlessOk(res, target.engine.url);
  const parsed = VllmTokenizeResponse.safeParse(await engineJson(res, target.engine.url, call.signal));
  if (!parsed.success) throw new EngineError("engine /tokenize answer has no count", 502, "bad_response");
  return parsed.data.count;
}
