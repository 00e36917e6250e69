import { HttpError } from "./errors.js";
import { PyDict, parsePyJson } from "@rollgate/pyjson";
import type { PyValue } from "@rollgate/pyjson";
import type { SimModel } from "./model.js";
import { ChatRenderError } from "./template.js";

/** The chat-shaped fields that decide a prompt (chat completions and the chat form of /tokenize). */
export interface ChatPromptFields {
  messages: readonly unknown[];
  tools?: readonly unknown[] | null | undefined;
  chat_template_kwargs?: Record<string, unknown> | null | undefined;
  add_generation_prompt?: boolean | null | undefined;
  continue_final_message?: boolean | null | undefined;
  /** vLLM's per-request template override. */
  chat_template?: string | null | undefined;
  /** gpt-oss: the reasoning effort its system message states. */
  reasoning_effort?: string | null | undefined;
}

/**
 * Tools with Python semantics: re-read from the raw body so `1.0` stays a float and key order is
 * kept (JSON.parse loses both), which is what vLLM's template sees.
 */
function pyTools(body: ChatPromptFields, rawBody: string | undefined): PyValue[] | null {
  if (!body.tools || body.tools.length === 0) return null;
  if (rawBody !== undefined) {
    try {
      const root = parsePyJson(rawBody);
      const t = root instanceof PyDict ? root.get("tools") : undefined;
      if (Array.isArray(t)) return t;
    } catch {
      // fall through to the JS value
    }
  }
  return body.tools.map((t) => parsePyJson(JSON.stringify(t)));
}

export interface RenderedPrompt {
  text: string;
  ids: number[];
}

/** Renders and tokenises a chat prompt as vLLM does (`add_special_tokens=False` for chat). */
export function renderPrompt(body: ChatPromptFields, rawBody: string | undefined, model: SimModel): RenderedPrompt {
  const efforts = model.family.reasoningEffort;
  const effort = body.reasoning_effort;
  if (efforts && effort !== null && effort !== undefined && !efforts.includes(effort)) {
    throw new HttpError(400, `reasoning_effort=${JSON.stringify(effort).replaceAll('"', "'")} is not supported by Harmony. Supported values are: ${efforts.join(", ")}.`);
  }
  try {
    const text = model.renderer.render({
      messages: body.messages,
      tools: pyTools(body, rawBody),
      addGenerationPrompt: body.add_generation_prompt ?? true,
      continueFinalMessage: body.continue_final_message ?? false,
      chatTemplateKwargs: body.chat_template_kwargs ?? null,
      ...(efforts && effort ? { requestVars: { reasoning_effort: effort } } : {}),
    }, body.chat_template);
    return { text, ids: model.tok.encode(text) };
  } catch (e) {
    if (e instanceof ChatRenderError) throw new HttpError(400, e.message);
    throw e;
  }
}
