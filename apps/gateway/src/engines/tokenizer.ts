import { templateFields } from "@rollgate/models";
import type { ChatMessage } from "@rollgate/protocol";
import { splitToolCallTurns } from "@rollgate/transforms";
import { request, type Dispatcher } from "undici";
import { z } from "zod";
import { detokenize } from "./detokenize.js";
import { EngineError, unreachable } from "./errors.js";
import { engineJson, errorBodyMessage } from "./openai-wire.js";
import type { EngineCall } from "./call.js";
import type { EngineConfig } from "../env.js";

/**
 * The engine's own chat template and tokenizer, as the gateway reads them: `POST /tokenize` in its
 * chat form (messages, tools, template kwargs; both vLLM and SGLang render with the generation
 * prompt, which is all the continuation planner asks for) and its text form, and `/detokenize`.
 */

export type TokenizeCall = Omit<EngineCall, "requestId">;

export interface EngineTokenizer {
  /** The prompt ids the chat route would use for `messages` (tools and template kwargs from `call.request`), with the generation prompt. */
  renderChat(call: TokenizeCall, messages: ChatMessage[]): Promise<{ ids: number[]; maxModelLen: number | null }>;
  /** Token ids of plain text (special tokens recognised, none added). */
  tokenizeText(call: TokenizeCall, text: string): Promise<number[]>;
  /** The text of token ids as the engine's tokenizer decodes them (special tokens kept). */
  detokenize(call: TokenizeCall, ids: number[]): Promise<string>;
  /** The engine's context length, or null when it does not say. */
  maxModelLen(call: TokenizeCall): Promise<number | null>;
}

const TokenizeResponse = z.object({
  tokens: z.array(z.number().int()),
  max_model_len: z.number().int().nullable().optional(),
});


async function tokenize(call: TokenizeCall, body: Record<string, unknown>): Promise<z.infer<typeof TokenizeResponse>> {
  const url = call.target.engine.url;
  let res: Dispatcher.ResponseData;
  try {
    res = await request(`${url}/tokenize`, {
      method: "POST",
      dispatcher: call.dispatcher,
      signal: call.signal,
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: call.model, ...body }),
    });
  } catch (err) {
    throw unreachable(url, err, call.signal);
  }
  if (res.statusCode !== 200) {
    const status = res.statusCode >= 400 && res.statusCode < 500 ? res.statusCode : 502;
    const message = await errorBodyMessage(res);
    throw new EngineError(`engine ${url} /tokenize answered ${res.statusCode}: ${message}`, status, "rejected", `the engine's /tokenize answered ${res.statusCode}: ${message}`);
  }
  const parsed = TokenizeResponse.safeParse(await engineJson(res, url, call.signal));
  if (!parsed.success) throw new EngineError("engine /tokenize answer has no tokens", 502, "bad_response");
  return parsed.data;
}

/** Assistant reasoning under the field names the engine's templates read. */
function messageFor(kind: EngineConfig["kind"], m: ChatMessage): Record<string, unknown> {
  if (m.role !== "assistant" || m.reasoning == null) return m;
  return kind === "vllm" ? { ...m, reasoning: m.reasoning, reasoning_content: m.reasoning } : { ...m, reasoning_content: m.reasoning };
}

export const engineTokenizer: EngineTokenizer = {
  async renderChat(call, messages) {
    const req = call.request;
    const r = await tokenize(call, {
      messages: splitToolCallTurns(messages, call.target.profile.tool_calls_per_turn).map((m) => messageFor(call.target.engine.kind, m)),
      ...(call.target.engine.kind === "vllm" ? { add_generation_prompt: true } : {}),
      ...(req.tools ? { tools: req.tools } : {}),
      ...templateFields(call.target.profile, req),
    });
    return { ids: r.tokens, maxModelLen: r.max_model_len ?? null };
  },
  async tokenizeText(call, text) {
    return (await tokenize(call, { prompt: text, add_special_tokens: false })).tokens;
  },
  detokenize(call, ids) {
    return detokenize(call.dispatcher, call.target.engine, call.model, ids, call.signal);
  },
  async maxModelLen(call) {
    return (await tokenize(call, { prompt: "", add_special_tokens: false })).max_model_len ?? null;
  },
};
