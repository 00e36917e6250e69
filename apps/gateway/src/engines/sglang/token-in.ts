import { makeToolCallId, parseWhole, type ParsedDelta } from "@rollgate/models";
import { definedSampling, type AssistantOutput, type TokenLogprob } from "@rollgate/protocol";
import { StreamAccumulator, type EngineResult, type EngineStreamEvent } from "@rollgate/transforms";
import { z } from "zod";
import { EngineError, outputAfterFinish } from "../errors.js";
import { sglangPost } from "./chat.js";
import { engineJson } from "../openai-wire.js";
import { sseJson } from "../sse.js";
import { chatFinishReason, parsesTools, profileParser } from "../chat-route-rules.js";
import type { TokenInCall } from "../token-in.js";
import { fromSglang, sglangRoutedExpertsField } from "./routed-experts.js";

/**
 * SGLang's token-in routes: native `POST /generate` with `input_ids`, `return_logprob`
 * (`output_token_logprobs` as `[logprob, id, text]`), `routed_dp_rank` in the body (the header is
 * ignored there) and `rid`. SGLang's default `max_new_tokens` is 128, so the budget is always sent.
 * `/generate` runs no parser, so the answer's text is parsed either by the gateway parser the
 * engine's model profile declares (`sglangTokenIn`), or by SGLang's own parsers through its
 * `/separate_reasoning` and `/parse_function_call` routes with the profile's SGLang parser names
 * (`sglangEngineParsed`: the text is asked for with special tokens kept, as its chat route does for
 * its parsers; a stream then brings ids and logprobs as they come and the parsed message at the end).
 */

type Sampling = TokenInCall["request"]["sampling"];

/** The /generate body. Pure, so it has golden tests. */
export function buildSglangGenerateBody(call: TokenInCall, keepSpecialTokens = false): Record<string, unknown> {
  const s: Sampling = call.request.sampling;
  const maxNew = s.max_tokens ?? (call.maxModelLen !== null ? call.maxModelLen - call.tokenIds.length : undefined);
  const sampling: Record<string, unknown> = {};
  if (keepSpecialTokens) sampling.skip_special_tokens = false;
  if (maxNew !== undefined) sampling.max_new_tokens = maxNew;
  // max_tokens and seed go by SGLang's own names (max_new_tokens above, sampling_seed below).
  Object.assign(sampling, definedSampling(s, ["max_tokens", "seed"]));
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
    ...sglangRoutedExpertsField(call.target),
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
  routed_experts: z.string().nullish(),
  /** The engine's weight version when it sent this output (SGLang's own label, "default" when never set). */
  weight_version: z.string().nullish(),
});
const GenerateOut = z.object({ text: z.string(), output_ids: z.array(z.number().int()), meta_info: Meta });
type GenerateOut = z.infer<typeof GenerateOut>;

const utf8 = new TextEncoder();

/**
 * The logprobs of `ids` (the answer's tokens from `position` on), read from the event's triples
 * from `from` on. Each triple names the id it is the logprob of: one that names another is another
 * token's logprob (a list shifted or out of order), not this one's.
 */
function toTokenLogprobs(meta: z.infer<typeof Meta>, from: number, ids: readonly number[], position: number): TokenLogprob[] {
  const count = ids.length;
  const lps = (meta.output_token_logprobs ?? []).slice(from, from + count);
  if (lps.length !== count) throw new EngineError(`engine returned ${count} token ids but ${lps.length} logprobs`, 502, "bad_response");
  const tops = meta.output_top_logprobs ?? [];
  return lps.map(([lp, id, text], i) => {
    if (lp === null) throw new EngineError(`engine returned no logprob for generated token ${position + i}`, 502, "bad_response");
    if (id !== ids[i]) throw new EngineError(`engine's logprob for token ${position + i} is the logprob of id ${id}, not of its id ${ids[i]}`, 502, "bad_response");
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


/** What reads an answer's text: pushed as it comes, finished once it ended. */
interface TextParser {
  push(text: string): ParsedDelta | null;
  end(): Promise<ParsedDelta | null>;
  readonly toolCalls: number;
}

type Parsing = "gateway" | "engine";

function gatewayTextParser(call: TokenInCall): TextParser {
  const p = profileParser(call).create(parsesTools(call));
  if (call.primeText) p.push(call.primeText);
  return {
    push: (text) => p.push(text),
    end: async () => p.end(),
    get toolCalls() {
      return p.toolCalls;
    },
  };
}

const SeparatedReasoning = z.object({ text: z.string(), reasoning_text: z.string().nullish() });
const ParsedCalls = z.object({ normal_text: z.string(), calls: z.array(z.object({ name: z.string().nullish(), parameters: z.string().nullish() })) });

/** An answer's whole text parsed by SGLang's own parsers (its parse routes, with the profile's SGLang parser names). */
export async function parseWithEngine(call: TokenInCall, text: string): Promise<AssistantOutput> {
  const names = call.target.profile.engine_parsers.sglang;
  let content = text;
  let reasoning: string | null = null;
  if (names.reasoning_parser) {
    const res = await sglangPost(call, "/separate_reasoning", { text, reasoning_parser: names.reasoning_parser });
    const r = SeparatedReasoning.safeParse(await engineJson(res, call.target.engine.url, call.signal));
    if (!r.success) throw new EngineError("engine /separate_reasoning answer is malformed", 502, "bad_response");
    content = r.data.text;
    reasoning = r.data.reasoning_text ? r.data.reasoning_text : null;
  }
  const calls: AssistantOutput["tool_calls"] = [];
  if (parsesTools(call) && names.tool_call_parser) {
    const res = await sglangPost(call, "/parse_function_call", { text: content, tools: call.request.tools, tool_call_parser: names.tool_call_parser });
    const r = ParsedCalls.safeParse(await engineJson(res, call.target.engine.url, call.signal));
    if (!r.success) throw new EngineError("engine /parse_function_call answer is malformed", 502, "bad_response");
    content = r.data.normal_text;
    for (const c of r.data.calls) calls.push({ id: makeToolCallId(), type: "function", function: { name: c.name ?? "", arguments: c.parameters ?? "" } });
  }
  return { content: content === "" ? null : content, reasoning, tool_calls: calls };
}

function engineTextParser(call: TokenInCall): TextParser {
  let text = "";
  let calls = 0;
  return {
    push(t) {
      text += t;
      return null;
    },
    async end() {
      const m = await parseWithEngine(call, text);
      calls = m.tool_calls.length;
      const d: ParsedDelta = {};
      if (m.reasoning !== null) d.reasoning = m.reasoning;
      if (m.content !== null) d.content = m.content;
      if (m.tool_calls.length > 0) d.tool_calls = m.tool_calls.map((c, index) => ({ index, id: c.id, type: "function", function: { ...c.function } }));
      return Object.keys(d).length > 0 ? d : null;
    },
    get toolCalls() {
      return calls;
    },
  };
}

async function generate(call: TokenInCall, parsing: Parsing): Promise<EngineResult> {
  if (call.stamp) return generateStamped(call, parsing);
  const res = await sglangPost(call, "/generate", buildSglangGenerateBody({ ...call, request: { ...call.request, stream: false } }, parsing === "engine"));
  const parsed = GenerateOut.safeParse(await engineJson(res, call.target.engine.url, call.signal));
  if (!parsed.success) throw new EngineError(`engine /generate answer is malformed: ${parsed.error.message}`, 502, "bad_response");
  const out: GenerateOut = parsed.data;
  const logprobs = toTokenLogprobs(out.meta_info, 0, out.output_ids, 0);
  const finish = finishOf(out.meta_info) ?? { reason: "stop", stop: null };
  const message = parsing === "gateway" ? parseWhole(profileParser(call).create(parsesTools(call)), out.text) : await parseWithEngine(call, out.text);
  const routed = fromSglang(call.target, out.meta_info.routed_experts, call.tokenIds.length, out.output_ids.length);
  return {
    prompt_ids: call.tokenIds,
    output_ids: out.output_ids,
    output_logprobs: logprobs.map((l) => l.logprob),
    logprobs,
    message,
    finish_reason: chatFinishReason(finish.reason, message.tool_calls.length, finish.stop),
    stop_reason: finish.stop,
    usage: { prompt_tokens: out.meta_info.prompt_tokens, completion_tokens: out.meta_info.completion_tokens, cached_tokens: out.meta_info.cached_tokens ?? 0 },
    ...(routed ? { routed_experts: routed } : {}),
    ...engineVersionOf(out.meta_info),
  };
}

/** The engine's own weight version of an output, where it tells one (EngineResult.engine_weight_version). */
function engineVersionOf(meta: z.infer<typeof Meta>): { engine_weight_version?: string } {
  return typeof meta.weight_version === "string" ? { engine_weight_version: meta.weight_version } : {};
}

function deltaEvent(d: ParsedDelta | null, ids: number[], logprobs: TokenLogprob[], stamp?: () => string | null): EngineStreamEvent | null {
  if (ids.length === 0 && !d) return null;
  const version = stamp?.();
  return { type: "delta", ...(d ?? {}), token_ids: ids, logprobs, ...(stamp ? { versions: ids.map(() => version ?? null) } : {}) };
}

/** A non-streamed generation read as a stream, so its tokens are stamped as they arrive. */
async function generateStamped(call: TokenInCall, parsing: Parsing): Promise<EngineResult> {
  const acc = new StreamAccumulator();
  for await (const event of generateStream({ ...call, request: { ...call.request, stream: true } }, parsing)) acc.push(event);
  if (!acc.isFinished) throw new EngineError("the engine stream ended without a finish reason", 502, "bad_response");
  return acc.result();
}

/**
 * A streamed /generate as canonical events. SGLang sends cumulative text / ids / logprobs per
 * event by default and deltas with `--incremental-streaming-output`; which one is read off the
 * first event after ids came: a cumulative one holds as many ids as its `completion_tokens` (the
 * count so far, in both modes) and repeats every id so far. Repeating them alone says nothing: a
 * delta whose tokens happen to be the first ones again ("11": one digit token twice) would be
 * taken for the whole answer so far, and every later token dropped.
 */
async function* generateStream(call: TokenInCall, parsing: Parsing): AsyncGenerator<EngineStreamEvent> {
  const res = await sglangPost(call, "/generate", buildSglangGenerateBody({ ...call, request: { ...call.request, stream: true } }, parsing === "engine"));
  const parser = parsing === "gateway" ? gatewayTextParser(call) : engineTextParser(call);
  const ids: number[] = [];
  let textSoFar = 0;
  let cumulative: boolean | null = null;
  let finished = false;
  yield { type: "start", prompt_ids: call.tokenIds };
  for await (const json of sseJson(res.body, { url: call.target.engine.url, signal: call.signal })) {
    const parsed = GenerateOut.safeParse(json);
    if (!parsed.success) throw new EngineError(`engine sent a malformed /generate event: ${parsed.error.message}`, 502, "bad_response");
    const ev = parsed.data;
    if (cumulative === null && ids.length > 0 && ev.output_ids.length > 0) {
      const n = ev.output_ids.length;
      cumulative = n === ev.meta_info.completion_tokens && n >= ids.length && ids.every((id, i) => ev.output_ids[i] === id);
    }
    const fresh = cumulative ? ev.output_ids.slice(ids.length) : ev.output_ids;
    const logprobs = toTokenLogprobs(ev.meta_info, cumulative ? ids.length : 0, fresh, ids.length);
    const text = cumulative ? ev.text.slice(textSoFar) : ev.text;
    if (finished && (fresh.length > 0 || text !== "")) throw outputAfterFinish();
    textSoFar += text.length;
    for (const id of fresh) ids.push(id); // not push(...fresh): one event may hold a whole long answer
    const delta = deltaEvent(text ? parser.push(text) : null, fresh, logprobs, call.stamp);
    if (delta) yield delta;
    const finish = finishOf(ev.meta_info);
    if (finish && !finished) {
      finished = true;
      const tail = deltaEvent(await parser.end(), [], []);
      if (tail) yield tail;
      const routed = fromSglang(call.target, ev.meta_info.routed_experts, call.tokenIds.length, ids.length);
      yield {
        type: "finish",
        finish_reason: chatFinishReason(finish.reason, parser.toolCalls, finish.stop),
        stop_reason: finish.stop,
        ...(routed ? { routed_experts: routed } : {}),
        ...engineVersionOf(ev.meta_info),
      };
      yield {
        type: "usage",
        usage: { prompt_tokens: ev.meta_info.prompt_tokens, completion_tokens: ev.meta_info.completion_tokens, cached_tokens: ev.meta_info.cached_tokens ?? 0 },
      };
    }
  }
}

/** SGLang's token-in route whose text the gateway parser reads. */
export const sglangTokenIn = {
  generate: (call: TokenInCall) => generate(call, "gateway"),
  generateStream: (call: TokenInCall) => generateStream(call, "gateway"),
};

/** SGLang's token-in route whose text SGLang's own parse routes read. */
export const sglangEngineParsed = {
  generate: (call: TokenInCall) => generate(call, "engine"),
  generateStream: (call: TokenInCall) => generateStream(call, "engine"),
};
