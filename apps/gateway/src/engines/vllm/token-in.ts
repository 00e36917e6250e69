import { parseWhole, type ParsedDelta } from "@rollgate/models";
import { definedSampling, type TokenLogprob } from "@rollgate/protocol";
import { StreamAccumulator, type EngineResult, type EngineStreamEvent } from "@rollgate/transforms";
import { request, type Dispatcher } from "undici";
import { z } from "zod";
import { EngineError, outputAfterFinish, unreachable } from "../errors.js";
import { chatFinishReason, parsesTools, profileParser } from "../chat-route-rules.js";
import type { TokenInCall } from "../token-in.js";
import type { TokenizeCall } from "../tokenizer.js";
import { engineUrl } from "../call.js";
import { sseJson } from "../sse.js";
import { MISSING_TOKENS } from "./chat.js";
import { engineJson, OpenAIUsage, rejectUnlessOk, usageOf } from "../openai-wire.js";
import { wantsRoutedExperts, wholeAnswerStamp } from "../routed-experts.js";
import { fromVllm } from "./routed-experts.js";

/**
 * vLLM's token-in route: `POST /v1/completions` with `prompt` = token ids, `return_token_ids`
 * (≥ v0.10.2) and legacy `logprobs: k` (`{tokens, token_logprobs, top_logprobs, text_offset}`),
 * routed by `X-data-parallel-rank` like the chat route. The generated text is parsed by the
 * gateway parser the engine's model profile declares (the completions route runs no parser), so
 * only profiles that declare one use it.
 */

/** The completions body. Pure, so it has golden tests. */
export function buildVllmCompletionBody(call: TokenInCall): Record<string, unknown> {
  const req = call.request;
  const s = req.sampling;
  const maxTokens = s.max_tokens ?? (call.maxModelLen !== null ? call.maxModelLen - call.tokenIds.length : undefined);
  const body: Record<string, unknown> = {
    model: call.model,
    prompt: call.tokenIds,
    stream: req.stream,
    // k+1 entries per step (the sampled token first): the chat route's top_logprobs = k.
    logprobs: req.client_logprobs?.top_logprobs ?? 0,
    return_token_ids: true,
  };
  if (maxTokens !== undefined) body.max_tokens = maxTokens;
  if (req.stream) body.stream_options = { include_usage: true };
  // max_tokens is set above (bounded by the model length when the task sets none).
  Object.assign(body, definedSampling(s, ["max_tokens"]));
  return body;
}


const LegacyLogprobs = z.object({
  tokens: z.array(z.string()),
  token_logprobs: z.array(z.number().nullable()),
  top_logprobs: z.array(z.record(z.string(), z.number()).nullable()).nullable().optional(),
});
type LegacyLogprobs = z.infer<typeof LegacyLogprobs>;


const Choice = z.object({
  text: z.string(),
  logprobs: LegacyLogprobs.nullable().optional(),
  finish_reason: z.string().nullable().optional(),
  stop_reason: z.union([z.string(), z.number()]).nullable().optional(),
  token_ids: z.array(z.number().int()).nullable().optional(),
  prompt_token_ids: z.array(z.number().int()).nullable().optional(),
  routed_experts: z.unknown().optional(),
});

const CompletionResponse = z.object({ choices: z.array(Choice).min(1), usage: OpenAIUsage.nullable().optional(), prompt_routed_experts: z.unknown().optional() });
const CompletionChunk = z.object({ choices: z.array(Choice), usage: OpenAIUsage.nullable().optional(), prompt_routed_experts: z.unknown().optional() });
type CompletionChunk = z.infer<typeof CompletionChunk>;

const utf8 = new TextEncoder();

/** Legacy logprobs → the chat shape: the sampled token's logprob, and the client's top k (best first). */
function toTokenLogprobs(l: LegacyLogprobs | null | undefined, topK: number): TokenLogprob[] {
  if (!l) return [];
  return l.tokens.map((token, i) => {
    const lp = l.token_logprobs[i];
    if (lp === null || lp === undefined) throw new EngineError(`engine returned no logprob for generated token ${i}`, 502, "bad_response");
    const tops = Object.entries(l.top_logprobs?.[i] ?? {})
      .sort((a, b) => b[1] - a[1])
      .slice(0, topK)
      .map(([t, v]) => ({ token: t, logprob: v, bytes: Array.from(utf8.encode(t)) }));
    return { token, logprob: lp, bytes: Array.from(utf8.encode(token)), top_logprobs: tops };
  });
}


async function post(url: string, path: string, body: unknown, call: TokenizeCall, headers: Record<string, string> = {}): Promise<Dispatcher.ResponseData> {
  try {
    return await request(engineUrl(url, path), {
      method: "POST",
      dispatcher: call.dispatcher,
      signal: call.signal,
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });
  } catch (err) {
    throw unreachable(url, err, call.signal);
  }
}

function postCompletion(call: TokenInCall): Promise<Dispatcher.ResponseData> {
  return post(call.target.engine.url, "/v1/completions", buildVllmCompletionBody(call), call, {
    "x-data-parallel-rank": String(call.target.dpRank),
    "x-request-id": call.requestId,
  });
}

/** One non-streaming token-in generation. */
async function generate(call: TokenInCall): Promise<EngineResult> {
  if (call.stamp) return generateStamped(call);
  const res = await postCompletion({ ...call, request: { ...call.request, stream: false } });
  await rejectUnlessOk(res, call.target.engine.url);
  const parsed = CompletionResponse.safeParse(await engineJson(res, call.target.engine.url, call.signal));
  if (!parsed.success) throw new EngineError(`engine response is not a completion: ${parsed.error.message}`, 502, "bad_response");
  const body = parsed.data;
  const choice = body.choices[0]!;
  if (!choice.token_ids || !choice.prompt_token_ids) throw new EngineError(MISSING_TOKENS, 502, "bad_response");
  const logprobs = toTokenLogprobs(choice.logprobs, call.request.client_logprobs?.top_logprobs ?? 0);
  if (logprobs.length !== choice.token_ids.length) {
    throw new EngineError(`engine returned ${choice.token_ids.length} token ids but ${logprobs.length} logprobs`, 502, "bad_response");
  }
  const message = parseWhole(profileParser(call).create(parsesTools(call)), choice.text);
  const routed = fromVllm(call.target, body.prompt_routed_experts, choice.routed_experts, choice.prompt_token_ids.length, choice.token_ids.length);
  return {
    prompt_ids: choice.prompt_token_ids,
    output_ids: choice.token_ids,
    output_logprobs: logprobs.map((l) => l.logprob),
    logprobs,
    message,
    finish_reason: chatFinishReason(choice.finish_reason ?? "stop", message.tool_calls.length, choice.stop_reason),
    stop_reason: choice.stop_reason ?? null,
    usage: usageOf(body.usage, choice.prompt_token_ids.length, choice.token_ids.length),
    ...(routed ? { routed_experts: routed } : {}),
  };
}

function deltaEvent(d: ParsedDelta | null, ids: number[], logprobs: TokenLogprob[], stamp?: () => string | null): EngineStreamEvent | null {
  if (ids.length === 0 && !d) return null;
  const version = stamp?.();
  return { type: "delta", ...(d ?? {}), token_ids: ids, logprobs, ...(stamp ? { versions: ids.map(() => version ?? null) } : {}) };
}

/** A non-streamed generation read as a stream, so its tokens are stamped as they arrive. */
async function generateStamped(call: TokenInCall): Promise<EngineResult> {
  const acc = new StreamAccumulator();
  for await (const event of generateStream({ ...call, request: { ...call.request, stream: true } })) acc.push(event);
  if (!acc.isFinished) throw new EngineError("the engine stream ended without a finish reason", 502, "bad_response");
  return acc.result();
}

/**
 * The engine's answer as chunks: its SSE chunks, or, with routed experts on (vLLM sends them on
 * whole answers only), the whole answer as the one chunk it reads the same as.
 */
async function* completionChunks(call: TokenInCall): AsyncGenerator<CompletionChunk> {
  const whole = wantsRoutedExperts(call.target);
  const res = await postCompletion(whole ? { ...call, request: { ...call.request, stream: false } } : call);
  await rejectUnlessOk(res, call.target.engine.url);
  if (whole) {
    const parsed = CompletionResponse.safeParse(await engineJson(res, call.target.engine.url, call.signal));
    if (!parsed.success) throw new EngineError(`engine response is not a completion: ${parsed.error.message}`, 502, "bad_response");
    yield parsed.data;
    return;
  }
  for await (const json of sseJson(res.body, { url: call.target.engine.url, signal: call.signal })) {
    const parsed = CompletionChunk.safeParse(json);
    if (!parsed.success) throw new EngineError(`engine sent a malformed chunk: ${parsed.error.message}`, 502, "bad_response");
    yield parsed.data;
  }
}

/**
 * A streaming token-in generation, as canonical events: content and reasoning deltas as the text
 * arrives, a tool-call delta when each `</tool_call>` closes, then finish and usage.
 */
async function* generateStream(call: TokenInCall): AsyncGenerator<EngineStreamEvent> {
  const stamp = call.stamp && wantsRoutedExperts(call.target) ? wholeAnswerStamp(call.stamp) : call.stamp;
  const topK = call.request.client_logprobs?.top_logprobs ?? 0;
  const parser = profileParser(call).create(parsesTools(call));
  // Continuing a cut answer: the parser reads what was already sent, so new text lands in context.
  if (call.primeText) {
    parser.push(call.primeText);
  }
  let started = false;
  let finished = false;
  let tokens = 0;
  let logprobCount = 0;
  let promptLen = 0;
  for await (const chunk of completionChunks(call)) {
    const choice = chunk.choices[0];
    if (choice) {
      if (!started) {
        if (!choice.prompt_token_ids) throw new EngineError(MISSING_TOKENS, 502, "bad_response");
        started = true;
        promptLen = choice.prompt_token_ids.length;
        yield { type: "start", prompt_ids: choice.prompt_token_ids };
      }
      if (!choice.token_ids && choice.text !== "") throw new EngineError(MISSING_TOKENS, 502, "bad_response");
      const ids = choice.token_ids ?? [];
      const lps = toTokenLogprobs(choice.logprobs, topK);
      if (finished && (ids.length > 0 || lps.length > 0 || choice.text !== "" || choice.finish_reason)) throw outputAfterFinish();
      tokens += ids.length;
      logprobCount += lps.length;
      const ev = deltaEvent(choice.text ? parser.push(choice.text) : null, ids, lps, stamp);
      if (ev) yield ev;
      if (choice.finish_reason && !finished) {
        finished = true;
        const tail = deltaEvent(parser.end(), [], []);
        if (tail) yield tail;
        const routed = fromVllm(call.target, chunk.prompt_routed_experts, choice.routed_experts, promptLen, tokens);
        yield {
          type: "finish",
          finish_reason: chatFinishReason(choice.finish_reason, parser.toolCalls, choice.stop_reason),
          stop_reason: choice.stop_reason ?? null,
          ...(routed ? { routed_experts: routed } : {}),
        };
      }
    }
    if (chunk.usage) {
      yield { type: "usage", usage: usageOf(chunk.usage, 0, 0) };
    }
  }
  if (!started) throw new EngineError(MISSING_TOKENS, 502, "bad_response");
  if (tokens !== logprobCount) throw new EngineError(`engine streamed ${tokens} token ids but ${logprobCount} logprobs`, 502, "bad_response");
}

/** vLLM's token-in route (the gateway parses its output). */
export const vllmTokenIn = { generate, generateStream };
