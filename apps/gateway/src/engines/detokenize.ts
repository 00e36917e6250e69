import { createHash } from "node:crypto";
import { LRUCache } from "lru-cache";
import { request, type Dispatcher } from "undici";
import { z } from "zod";
import { EngineError, unreachable } from "./errors.js";
import type { EngineConfig } from "../env.js";

const VllmText = z.object({ prompt: z.string() });
const SglangText = z.object({ text: z.string() });

/**
 * The text of token ids as the engine's own tokenizer decodes them, special tokens kept: vLLM
 * `POST /detokenize {tokens}` → `{prompt}`, SGLang `{tokens, skip_special_tokens: false}` → `{text}`.
 */
export async function detokenize(dispatcher: Dispatcher, engine: EngineConfig, model: string, ids: readonly number[], signal?: AbortSignal): Promise<string> {
  const body = engine.kind === "vllm" ? { model, tokens: ids } : { model, tokens: ids, skip_special_tokens: false };
  let res: Dispatcher.ResponseData;
  try {
    res = await request(`${engine.url}/detokenize`, {
      method: "POST",
      dispatcher,
      ...(signal ? { signal } : {}),
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch (err) {
    throw unreachable(engine.url, err, signal);
  }
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new EngineError(`engine ${engine.url} /detokenize answered ${res.statusCode}: ${text.slice(0, 500)}`, 502, "rejected");
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new EngineError(`engine ${engine.url} /detokenize answered with no JSON`, 502, "bad_response");
  }
  const parsed = engine.kind === "vllm" ? VllmText.safeParse(json) : SglangText.safeParse(json);
  if (!parsed.success) throw new EngineError(`engine ${engine.url} /detokenize answer has no text`, 502, "bad_response");
  return "prompt" in parsed.data ? parsed.data.prompt : parsed.data.text;
}

/** `detokenize` behind a cache: decoded trajectories ask for the same runs of ids again and again. */
export class CachedDetokenizer {
  private readonly cache = new LRUCache<string, string>({
    // Bounded by characters held, not entries: one run can be a whole prompt.
    maxSize: 32 * 1024 * 1024,
    sizeCalculation: (text) => Math.max(1, text.length),
  });

  constructor(private readonly dispatcher: Dispatcher) {}

  async decode(engine: EngineConfig, model: string, ids: readonly number[]): Promise<string> {
    if (ids.length === 0) return "";
    const key = createHash("sha256").update(`${engine.url}\u0000${model}\u0000`).update(Int32Array.from(ids)).digest("base64url");
    const hit = this.cache.get(key);
    if (hit !== undefined) return hit;
    const text = await detokenize(this.dispatcher, engine, model, ids);
    this.cache.set(key, text);
    return text;
  }
}
