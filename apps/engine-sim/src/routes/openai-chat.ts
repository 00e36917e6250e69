import { randomBytes } from "node:crypto";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { admit, generate } from "../engine.js";
import type { GenToken } from "../engine.js";
import { HttpError } from "../errors.js";
import { applyLimits } from "../limits.js";
import type { Completion } from "../limits.js";
import { contextHash, extendContextHash, topLogprobs } from "../logprobs.js";
import { StreamParser, extractReasoning, extractToolCalls } from "../parsers.js";
import type { Delta, ToolCall } from "../parsers.js";
import { randomOutput, scriptedOutput } from "../policy.js";
import { renderPrompt } from "../prompt.js";
import { parseRankHeader } from "../ranks.js";
import type { Rank } from "../ranks.js";
import { ScriptError, findScriptStep } from "../script.js";
import type { SimState } from "../state.js";
import type { SimTokenizer } from "../tokenizer.js";
import { formatZodError, getRawBody, sendError } from "./common.js";

/**
 * `POST /v1/chat/completions` with vLLM's wire format (v0.10.2+ token extensions: `return_token_ids`,
 * top-level `prompt_token_ids`, `choices[].token_ids`; reasoning under `reasoning` (v0.11+, PR
 * #27752) or `reasoning_content`; the server is assumed to run with `--reasoning-parser qwen3
 * --enable-auto-tool-choice --tool-call-parser hermes --enable-prompt-tokens-details`).
 * Test-only extra: every response carries `x-sim-dp-rank: <rank>` (the DP rank that served it).
 */

const ChatRequest = z.object({
  messages: z.array(z.record(z.string(), z.unknown())).min(1),
  model: z.string().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish(), continuous_usage_stats: z.boolean().nullish() }).nullish(),
  max_tokens: z.number().int().nullish(),
  max_completion_tokens: z.number().int().nullish(),
  stop: z.union([z.string(), z.array(z.string())]).nullish(),
  stop_token_ids: z.array(z.number().int()).nullish(),
  include_stop_str_in_output: z.boolean().nullish(),
  skip_special_tokens: z.boolean().nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().nullish(),
  prompt_logprobs: z.number().int().nullish(),
  return_token_ids: z.boolean().nullish(),
  return_tokens_as_token_ids: z.boolean().nullish(),
  include_reasoning: z.boolean().nullish(),
  tools: z.array(z.record(z.string(), z.unknown())).nullish(),
  tool_choice: z.union([z.string(), z.record(z.string(), z.unknown())]).nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  add_generation_prompt: z.boolean().nullish(),
  continue_final_message: z.boolean().nullish(),
  n: z.number().int().nullish(),
  cache_salt: z.string().nullish(),
  request_id: z.string().nullish(),
});
type ChatRequest = z.infer<typeof ChatRequest>;

/** top_logprobs -1 means "the whole vocabulary" in vLLM; the simulator caps it. */
const MAX_TOP_LOGPROBS = 20;

interface Prepared {
  body: ChatRequest;
  requestId: string;
  created: number;
  promptIds: number[];
  completion: Completion;
  rank: Rank;
  topN: number;
  wantLogprobs: boolean;
  asTokenIds: boolean;
  returnTokenIds: boolean;
  toolParsing: boolean;
}

function requestId(body: ChatRequest, req: FastifyRequest): string {
  const given = body.request_id ?? (req.headers["x-request-id"] as string | undefined);
  return `chatcmpl-${given ?? randomBytes(16).toString("hex")}`;
}

/** Validation, prompt, policy and stopping rules: everything before the first token. */
function prepare(sim: SimState, req: FastifyRequest): Prepared {
  const parsed = ChatRequest.safeParse(req.body);
  if (!parsed.success) throw new HttpError(400, formatZodError(parsed.error));
  const body = parsed.data;
  const o = sim.opts;
  if (body.model && body.model !== o.model) throw new HttpError(404, `The model \`${body.model}\` does not exist.`);
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

  const prompt = renderPrompt(body, getRawBody(req), sim.tok);
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

  // The DP rank: header first (out of range is a 400 as in vLLM's input processor), else least loaded.
  const header = parseRankHeader(req.headers["x-data-parallel-rank"], sim.ranks.size);
  if (header.kind === "out_of_range") throw new HttpError(400, `data_parallel_rank ${header.rank} is out of range [0, ${sim.ranks.size}).`);
  const rank = header.kind === "rank" ? sim.ranks.ranks[header.rank]! : sim.ranks.pick();

  let found;
  try {
    found = findScriptStep(body.messages);
  } catch (e) {
    if (e instanceof ScriptError) throw new HttpError(400, `engine-sim: ${e.message}`);
    throw e;
  }
  const policy = found ? scriptedOutput(found.step, sim.tok) : randomOutput(o.seed, promptIds, o.randomTokens, sim.tok);
  const stop = body.stop === null || body.stop === undefined ? [] : typeof body.stop === "string" ? [body.stop] : body.stop;
  const completion = applyLimits(
    policy,
    {
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
  return {
    body,
    requestId: requestId(body, req),
    created: Math.floor(Date.now() / 1000),
    promptIds,
    completion,
    rank,
    topN,
    wantLogprobs,
    asTokenIds: body.return_tokens_as_token_ids ?? o.returnTokensAsTokenIds,
    returnTokenIds: body.return_token_ids === true,
    toolParsing: !!body.tools && toolChoice !== "none",
  };
}

const utf8 = new TextEncoder();
const lossy = new TextDecoder("utf-8", { fatal: false });

/** vLLM's logprob token string: the token decoded alone (lossy for split UTF-8), or "token_id:N". */
function tokenString(tok: SimTokenizer, id: number, asIds: boolean): string {
  return asIds ? `token_id:${id}` : lossy.decode(tok.tokenBytes(id));
}

function logprobEntry(tok: SimTokenizer, t: GenToken, asIds: boolean) {
  const token = tokenString(tok, t.id, asIds);
  return {
    token,
    logprob: Math.max(t.logprob, -9999),
    bytes: Array.from(utf8.encode(token)),
    top_logprobs: t.top.map((a) => {
      const s = tokenString(tok, a.id, asIds);
      return { token: s, logprob: Math.max(a.logprob, -9999), bytes: Array.from(utf8.encode(s)) };
    }),
  };
}

/** vLLM's `prompt_logprobs`: entry 0 null, then {"<id>": {logprob, rank, decoded_token}} incl. top-k. */
function promptLogprobs(sim: SimState, promptIds: readonly number[], k: number) {
  const out: (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[] = [null];
  let h = contextHash(sim.weightVersion, promptIds.slice(0, 1));
  for (let i = 1; i < promptIds.length; i++) {
    const id = promptIds[i]!;
    const top = topLogprobs(h, id, Math.max(1, k + 1));
    const actual = top[0]!;
    const alts = top.slice(1, k + 1);
    const entry: Record<string, { logprob: number; rank: number; decoded_token: string }> = {};
    entry[String(id)] = {
      logprob: actual.logprob,
      rank: 1 + alts.filter((a) => a.logprob > actual.logprob).length,
      decoded_token: sim.tok.decode([id]),
    };
    alts.forEach((a, r) => {
      entry[String(a.id)] ??= { logprob: a.logprob, rank: r + 1, decoded_token: sim.tok.decode([a.id]) };
    });
    out.push(entry);
    h = extendContextHash(h, id);
  }
  return out;
}

function usage(promptTokens: number, completionTokens: number, cached: number) {
  return {
    prompt_tokens: promptTokens,
    total_tokens: promptTokens + completionTokens,
    completion_tokens: completionTokens,
    prompt_tokens_details: { cached_tokens: cached },
  };
}

/** Aborts generation when the client goes away before the answer is complete. */
function disconnectSignal(reply: FastifyReply): AbortController {
  const ac = new AbortController();
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) ac.abort();
  });
  return ac;
}

async function respond(sim: SimState, p: Prepared, reply: FastifyReply) {
  const ac = disconnectSignal(reply);
  const cached = admit({ rank: p.rank, promptIds: p.promptIds, ids: p.completion.ids, topN: p.topN, cacheSalt: p.body.cache_salt ?? undefined });
  const tokens: GenToken[] = [];
  for await (const t of generate(sim, { rank: p.rank, promptIds: p.promptIds, ids: p.completion.ids, topN: p.topN, cacheSalt: p.body.cache_salt ?? undefined }, ac.signal)) {
    tokens.push(t);
  }
  if (ac.signal.aborted) return reply.code(499).send();
  const c = p.completion;
  const o = sim.opts;
  const { reasoning, content: afterReasoning } = extractReasoning(c.text);
  let content = afterReasoning;
  let toolCalls: ToolCall[] = [];
  let toolsCalled = false;
  if (p.toolParsing) {
    const info = extractToolCalls(afterReasoning ?? "");
    toolsCalled = info.toolsCalled;
    if (info.toolsCalled) {
      content = info.content;
      toolCalls = info.toolCalls;
    } else if (info.content) content = info.content;
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
  message[o.reasoningField] = p.body.include_reasoning === false ? null : reasoning;
  const choice: Record<string, unknown> = {
    index: 0,
    message,
    logprobs: p.wantLogprobs ? { content: tokens.map((t) => logprobEntry(sim.tok, t, p.asTokenIds)) } : null,
    finish_reason: toolsCalled ? "tool_calls" : c.finishReason,
    stop_reason: c.stopReason,
  };
  if (p.returnTokenIds) choice.token_ids = [...c.ids];
  const pl = p.body.prompt_logprobs;
  const body: Record<string, unknown> = {
    id: p.requestId,
    object: "chat.completion",
    created: p.created,
    model: o.model,
    choices: [choice],
    service_tier: null,
    system_fingerprint: null,
    usage: usage(p.promptIds.length, c.ids.length, cached),
    prompt_logprobs: pl === null || pl === undefined ? null : promptLogprobs(sim, p.promptIds, pl === -1 ? MAX_TOP_LOGPROBS : pl),
  };
  if (p.returnTokenIds) body.prompt_token_ids = p.promptIds;
  body.kv_transfer_params = null;
  return reply.header("x-sim-dp-rank", String(p.rank.index)).send(body);
}

async function stream(sim: SimState, p: Prepared, reply: FastifyReply) {
  const o = sim.opts;
  const c = p.completion;
  const ac = disconnectSignal(reply);
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "x-sim-dp-rank": String(p.rank.index) });
  const send = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
  const base = { id: p.requestId, object: "chat.completion.chunk", created: p.created, model: o.model };
  const includeUsage = p.body.stream_options?.include_usage === true;
  const continuous = includeUsage && p.body.stream_options?.continuous_usage_stats === true;
  const cached = admit({ rank: p.rank, promptIds: p.promptIds, ids: c.ids, topN: p.topN, cacheSalt: p.body.cache_salt ?? undefined });
  const partialUsage = (n: number) => ({ prompt_tokens: p.promptIds.length, completion_tokens: n, total_tokens: p.promptIds.length + n });

  const roleChunk: Record<string, unknown> = { ...base, choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }] };
  if (continuous) roleChunk.usage = partialUsage(0);
  if (p.returnTokenIds) roleChunk.prompt_token_ids = p.promptIds;
  send(roleChunk);

  const parser = new StreamParser(true, p.toolParsing);
  const last = c.ids.length - 1;
  try {
    for await (const t of generate(sim, { rank: p.rank, promptIds: p.promptIds, ids: c.ids, topN: p.topN, cacheSalt: p.body.cache_salt ?? undefined }, ac.signal)) {
      const from = t.index === 0 ? 0 : c.ends[t.index - 1]!;
      const deltaText = c.text.slice(from, c.ends[t.index]!);
      let delta: Delta | null = parser.push(t.id, deltaText);
      if (delta && delta.reasoning !== undefined && p.body.include_reasoning === false) {
        const { reasoning: _drop, ...rest } = delta;
        delta = Object.keys(rest).length > 0 ? rest : null;
      }
      const isLast = t.index === last;
      // A token a parser swallowed goes out (as an empty delta) only with return_token_ids, as in vLLM.
      if (delta === null && !isLast && !p.returnTokenIds) continue;
      const wire: Record<string, unknown> = {};
      if (delta?.content !== undefined) wire.content = delta.content;
      if (delta?.reasoning !== undefined) wire[o.reasoningField] = delta.reasoning;
      if (delta?.tool_calls !== undefined) wire.tool_calls = delta.tool_calls;
      const choice: Record<string, unknown> = {
        index: 0,
        delta: wire,
        logprobs: p.wantLogprobs ? { content: [logprobEntry(sim.tok, t, p.asTokenIds)] } : null,
        finish_reason: isLast ? (parser.toolsStreamed > 0 ? "tool_calls" : c.finishReason) : null,
      };
      if (isLast) choice.stop_reason = c.stopReason;
      if (p.returnTokenIds) choice.token_ids = [t.id];
      const chunk: Record<string, unknown> = { ...base, choices: [choice] };
      if (continuous) chunk.usage = partialUsage(t.index + 1);
      send(chunk);
    }
  } catch (e) {
    if (!ac.signal.aborted) {
      send({ error: { message: (e as Error).message, type: "InternalServerError", param: null, code: 500 } });
      res.end("data: [DONE]\n\n");
    }
    return;
  }
  if (ac.signal.aborted) return;
  if (includeUsage) send({ ...base, choices: [], usage: usage(p.promptIds.length, c.ids.length, cached) });
  res.end("data: [DONE]\n\n");
}

export function registerChatRoutes(app: FastifyInstance, sim: SimState): void {
  app.post("/v1/chat/completions", async (req, reply) => {
    let p: Prepared;
    try {
      p = prepare(sim, req);
    } catch (e) {
      if (e instanceof HttpError) return sendError(reply, e.status, e.message);
      throw e;
    }
    if (p.body.stream) return stream(sim, p, reply);
    return respond(sim, p, reply);
  });
}
