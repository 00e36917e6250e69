import type { TokenLogprob, Usage } from "@rollgate/protocol";
import { z } from "zod";
import { brokeOff, EngineError } from "./errors.js";

/**
 * What vLLM's and SGLang's OpenAI-compatible routes send alike: the chat route's per-token
 * logprobs and the error bodies (both servers' shapes).
 */

/** One generated token's logprob entry on the chat route (`choices[].logprobs.content[]`). */
export const ChatLogprob = z.object({
  token: z.string(),
  logprob: z.number(),
  bytes: z.array(z.number().int()).nullable().optional(),
  top_logprobs: z
    .array(z.object({ token: z.string(), logprob: z.number(), bytes: z.array(z.number().int()).nullable().optional() }))
    .nullable()
    .optional(),
});
export type ChatLogprob = z.infer<typeof ChatLogprob>;

export function toTokenLogprob(l: ChatLogprob): TokenLogprob {
  // A loop, not `(top ?? []).map(...)`: one array per token, not two and a closure call per entry.
  const top = l.top_logprobs;
  const tops: TokenLogprob["top_logprobs"] = [];
  if (top) for (let i = 0; i < top.length; i++) tops.push({ token: top[i]!.token, logprob: top[i]!.logprob, bytes: top[i]!.bytes ?? null });
  return { token: l.token, logprob: l.logprob, bytes: l.bytes ?? null, top_logprobs: tops };
}

/** The `usage` object both servers send (`prompt_tokens_details.cached_tokens`: prefix-cache hits). */
export const OpenAIUsage = z.object({
  prompt_tokens: z.number().int(),
  completion_tokens: z.number().int(),
  prompt_tokens_details: z.object({ cached_tokens: z.number().int().nullable().optional() }).nullable().optional(),
});
export type OpenAIUsage = z.infer<typeof OpenAIUsage>;

/** An answer's usage: the engine's counts when it sent them, else the lengths of the ids it returned. */
export function usageOf(u: OpenAIUsage | null | undefined, promptTokens: number, completionTokens: number): Usage {
  return {
    prompt_tokens: u?.prompt_tokens ?? promptTokens,
    completion_tokens: u?.completion_tokens ?? completionTokens,
    cached_tokens: u?.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

// Field-by-field checks of the chunks both servers stream: they accept exactly what the zod
// schemas here accept, without zod's per-chunk cost (a streamed answer is one chunk per token).
// A chunk they refuse is parsed by its schema, whose error names the bad field.
export const isObj = (x: unknown): x is Record<string, unknown> => typeof x === "object" && x !== null && !Array.isArray(x);
export const nullishStr = (x: unknown) => x === undefined || x === null || typeof x === "string";
export const optStr = (x: unknown) => x === undefined || typeof x === "string";
export const optInt = (x: unknown) => x === undefined || Number.isInteger(x);
export const nullishInt = (x: unknown) => x === undefined || x === null || Number.isInteger(x);
export function isIntArray(x: unknown): boolean {
  if (!Array.isArray(x)) return false;
  for (const v of x) if (!Number.isInteger(v)) return false;
  return true;
}
export const nullishIntArray = (x: unknown) => x === undefined || x === null || isIntArray(x);
const optNullishIntArray = nullishIntArray;
function isTopLogprob(t: unknown): boolean {
  return isObj(t) && typeof t.token === "string" && typeof t.logprob === "number" && optNullishIntArray(t.bytes);
}
export function isLogprob(l: unknown): boolean {
  if (!isObj(l) || typeof l.token !== "string" || typeof l.logprob !== "number" || !optNullishIntArray(l.bytes)) return false;
  const top = l.top_logprobs;
  if (top === undefined || top === null) return true;
  if (!Array.isArray(top)) return false;
  for (const t of top) if (!isTopLogprob(t)) return false;
  return true;
}

export function isUsage(u: unknown): boolean {
  if (u === undefined || u === null) return true;
  if (!isObj(u) || !Number.isInteger(u.prompt_tokens) || !Number.isInteger(u.completion_tokens)) return false;
  const d = u.prompt_tokens_details;
  return d === undefined || d === null || (isObj(d) && nullishInt(d.cached_tokens));
}

/** The message of an error body: vLLM nests it (`{error:{message}}`), SGLang may not (`{object:"error", message}`); else the text itself. */
export function engineErrorMessage(text: string): string {
  try {
    const j = JSON.parse(text) as { message?: unknown; error?: { message?: unknown } };
    if (typeof j.error?.message === "string") return j.error.message;
    if (typeof j.message === "string") return j.message;
  } catch {
    // not JSON
  }
  return text.slice(0, 2_000);
}

/**
 * A whole answer's JSON body (undici's `body.json()` threw its own errors: a body cut short or not
 * JSON reached the agent as the gateway's internal error). A body that breaks off is brokeOff's; one
 * that is not JSON is a bad response.
 */
export async function engineJson(res: { body: { text(): Promise<string> } }, url: string, signal?: AbortSignal): Promise<unknown> {
  let text: string;
  try {
    text = await res.body.text();
  } catch (err) {
    throw brokeOff(url, err, signal);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new EngineError(`engine ${url} answered with a body that is not JSON: ${text.slice(0, 200)}`, 502, "bad_response", "the engine answered with a body that is not JSON");
  }
}

/**
 * An error answer's message: its body's, or a word that its body broke off (the status alone says
 * what the engine answered; reading its body is no reason to fail otherwise).
 */
export async function errorBodyMessage(res: { body: { text(): Promise<string> } }): Promise<string> {
  try {
    return engineErrorMessage(await res.body.text());
  } catch {
    return "(its error body broke off)";
  }
}

/** A non-200 answer as an EngineError with the engine's own message (4xx passed on, else 502). */
export async function rejectUnlessOk(res: { statusCode: number; body: { text(): Promise<string> } }, url: string): Promise<void> {
  if (res.statusCode === 200) return;
  const message = await errorBodyMessage(res);
  const status = res.statusCode >= 400 && res.statusCode < 500 ? res.statusCode : 502;
  // 503: the engine (or its rank) is down and took nothing of the call on.
  throw new EngineError(`engine ${url} answered ${res.statusCode}: ${message}`, status, "rejected", `the engine answered ${res.statusCode}: ${message}`, res.statusCode === 503);
}

/**
 * One SSE chunk of an engine's chat stream, checked: `accepts` (field by field, one chunk per
 * token) lets through what `schema` accepts; a chunk it refuses is parsed by the schema, so the
 * EngineError names what is wrong with it.
 */
export function checkedChunk<T>(json: unknown, accepts: (x: unknown) => x is T, schema: z.ZodType<T>): T {
  if (accepts(json)) return json;
  const parsed = schema.safeParse(json);
  if (!parsed.success) throw new EngineError(`engine sent a malformed chunk: ${parsed.error.message}`, 502, "bad_response");
  return parsed.data;
}
