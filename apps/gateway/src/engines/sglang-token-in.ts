import { parseWhole, type ParsedDelta } from "@rollgate/models";
import type { TokenLogprob } from "@rollgate/protocol";
import { StreamAccumulator, type EngineResult, type EngineStreamEvent } from "@rollgate/transforms";
import { z } from "zod";
import { EngineError } from "./errors.js";
import { sglangPost } from "./sglang.js";
import { sseJson } from "./sse.js";
import { chatFinishReason, parsesTools, profileParser } from "./chat-route-rules.js";
import type { TokenInCall } from "./token-in.js";

/**
 * SGLang's token-in route: native `POST /generate` with `input_ids`, `return_logprob`
 * (`output_token_logprobs` as `[logprob, id, text]`), `routed_dp_rank` in the body (the header is
 * ignored there) and `rid`. SGLang's default `max_new_tokens` is 128, so the budget is always sent.
 * The text is parsed by the gateway parser the engine's model profile declares, as SGLang's chat
 * route would (`/generate` runs no parser). Used to continue a call an abort-mode pause cut; SGLang's /tokenize
 * cannot render a history without the generation prompt, so echoed-history planning stays on the
 * chat route (`plansHistory: false`).
 */

type Sampling = TokenInCall["request"]["sampling"];

/** The /generate body. Pure, so it has golden tests. */
export function buildSglangGenerateBody(call: TokenInCall): Record<string, unknown> {
  const s: Sampling = call.request.sampling;
  const maxNew = s.max_tokens ?? (call.maxModelLen !== null ? call.maxModelLen - call.tokenIds.length : undefined);
  const sampling: Record<string, unknown> = {};
  if (maxNew !== undefined) sampling.max_new_tokens = maxNew;
  for (const key of ["temperature", "top_p", "top_k", "min_p", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty"] as const) {
    if (s[key] !== undefined) sampling[key] = s[key];
  }
  if (s.seed !== undefined) sampling.sampling_seed = s.seed;
  return {
    input_ids: call.tokenIds,
    sampling_params: sampling,
    return_logprob: true,
    logprob_start_len: -1,
    top_logprobs_num: call.request.client_logprobs?.top_logprobs ?? 0,
    return_text_in_logprobs: true,
    stream: call.request.stream,
    rid: call.requestId,
    routed_dp_rank: call.target.dpRank,
  };
}

const Triple = z.tuple([z.number().nullable(), z.number().int(), z.string().nullable()]);
const Meta = z.object({
  finish_reason: z.object({ type: z.string(), matched: z.union([z.string(), z.number()]).nullable().optional() }).nullable().optional(),
  prompt_tokens: z.number().int(),
  completion_tokens: z.number().int(),
  cached_tokens: z.number().int().nullable().optional(),
  output_token_logprobs: z.array(Triple).nullable().optional(),
  output_top_logprobs: z.array(z.array(Triple).nullable()).nullable().optional(),
});
const GenerateOut = z.object({ text: z.string(), output_ids: z.array(z.number().int()), meta_info: Meta });
type GenerateOut = z.infer<typeof GenerateOut>;

const utf8 = new TextEncoder();

function toTokenLogprobs(meta: z.infer<typeof Meta>, from: number, count: number): TokenLogprob[] {
  const lps = (meta.output_token_logprobs ?? []).slice(from, from + count);
  if (lps.length !== count) throw new EngineError(`engine returned ${count} token ids but ${lps.length} logprobs`, 502, "bad_response");
  const tops = meta.output_top_logprobs ?? [];
  return lps.map(([lp, , text], i) => {
    if (lp === null) throw new EngineError(`engine returned no logprob for generated token ${from + i}`, 502, "bad_response");
    const token = text ?? "";
    return {
      token,
      logprob: lp,
      bytes: Array.from(utf8.encode(token)),
      top_logprobs: (tops[from + i] ?? []).map(([v, , t]) => ({ token: t ?? "", logprob: v ?? -Infinity, bytes: Array.from(utf8.encode(t ?? "")) })),
    };
  });
}

function finishOf(meta: z.infer<typeof Meta>): { reason: string; stop: string | number | null } | null {
  const f = meta.finish_reason;
  if (!f) return null;
  return { reason: f.type, stop: f.type === "stop" ? (f.matched ?? null) : null };
}


async function generate(call: TokenInCall): Promise<EngineResult> {
  if (call.stamp) return generateStamped(call);
  const res = await sglangPost(call, "/generate", buildSglangGenerateBody({ ...call, request: { ...call.request, stream: false } }));
  const parsed = GenerateOut.safeParse(await res.body.json());
  if (!parsed.success) throw new EngineError(`engine /generate answer is malformed: ${parsed.error.message}`, 502, "bad_response");
  const out: GenerateOut = parsed.data;
  const logprobs = toTokenLogprobs(out.meta_info, 0, out.output_ids.length);
  const finish = finishOf(out.meta_info) ?? { reason: "stop", stop: null };
  const message = parseWhole(profileParser(call).create(parsesTools(call)), out.text);
  return {
    prompt_ids: call.tokenIds,
    output_ids: out.output_ids,
    output_logprobs: logprobs.map((l) => l.logprob),
    logprobs,
    message,
    finish_reason: chatFinishReason(finish.reason, message.tool_calls.length),
    stop_reason: finish.stop,
    usage: { prompt_tokens: out.meta_info.prompt_tokens, completion_tokens: out.meta_info.completion_tokens, cached_tokens: out.meta_info.cached_tokens ?? 0 },
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
 * A streamed /generate as canonical events. SGLang sends cumulative text / ids / logprobs per
 * event by default and deltas with `--incremental-streaming-output`; which one is read off the
 * events (a later event that repeats every id so far is cumulative).
 */
async function* generateStream(call: TokenInCall): AsyncGenerator<EngineStreamEvent> {
  const res = await sglangPost(call, "/generate", buildSglangGenerateBody({ ...call, request: { ...call.request, stream: true } }));
  const parser = profileParser(call).create(parsesTools(call));
  if (call.primeText) parser.push(call.primeText);
  const ids: number[] = [];
  let textSoFar = 0;
  let cumulative: boolean | null = null;
  let finished = false;
  yield { type: "start", prompt_ids: call.tokenIds };
  for await (const json of sseJson(res.body)) {
    const parsed = GenerateOut.safeParse(json);
    if (!parsed.success) throw new EngineError(`engine sent a malformed /generate event: ${parsed.error.message}`, 502, "bad_response");
    const ev = parsed.data;
    if (cumulative === null && ids.length > 0 && ev.output_ids.length > 0) {
      cumulative = ev.output_ids.length >= ids.length && ids.every((id, i) => ev.output_ids[i] === id);
    }
    const fresh = cumulative ? ev.output_ids.slice(ids.length) : ev.output_ids;
    const logprobs = toTokenLogprobs(ev.meta_info, cumulative ? ids.length : 0, fresh.length);
    const text = cumulative ? ev.text.slice(textSoFar) : ev.text;
    textSoFar += text.length;
    ids.push(...fresh);
    const delta = deltaEvent(text ? parser.push(text) : null, fresh, logprobs, call.stamp);
    if (delta) yield delta;
    const finish = finishOf(ev.meta_info);
    if (finish && !finished) {
      finished = true;
      const tail = deltaEvent(parser.end(), [], []);
      if (tail) yield tail;
      yield { type: "finish", finish_reason: chatFinishReason(finish.reason, parser.toolCalls), stop_reason: finish.stop };
      yield {
        type: "usage",
        usage: { prompt_tokens: ev.meta_info.prompt_tokens, completion_tokens: ev.meta_info.completion_tokens, cached_tokens: ev.meta_info.cached_tokens ?? 0 },
      };
    }
  }
}

/** SGLang's token-in route (the gateway parses its output). */
export const sglangTokenIn = { generate, generateStream };
