import type { CanonicalChatRequest } from "@rollgate/protocol";
import type { ModelProfile } from "./profile.js";

/** What an engine request carries, beside the messages, to steer the chat template. */
export interface TemplateFields {
  chat_template_kwargs?: Record<string, unknown>;
  reasoning_effort?: string;
}

/**
 * The template switches a call sends its engine: the client's chat_template_kwargs the profile lets
 * through, the client's thinking switch under the kwarg this family's template reads (unless the
 * client set that kwarg itself; off for a request with tools where the family calls tools only
 * without thinking), and the reasoning effort where the family reads it. Pure.
 */
export function templateFields(profile: ModelProfile, req: Pick<CanonicalChatRequest, "enable_thinking" | "chat_template_kwargs" | "reasoning_effort" | "tools">): TemplateFields {
  const kwargs: Record<string, unknown> = {};
  const given = req.chat_template_kwargs ?? {};
  const allowed = profile.chat_template_kwargs;
  for (const [k, v] of Object.entries(given)) if (allowed === "all" || allowed.includes(k)) kwargs[k] = v;
  const kwarg = profile.thinking.kwarg;
  const toolsOff = profile.thinking.off_with_tools === true && (req.tools?.length ?? 0) > 0;
  if (kwarg && req.enable_thinking !== undefined && !(kwarg in kwargs)) kwargs[kwarg] = req.enable_thinking && !toolsOff;
  const out: TemplateFields = {};
  if (Object.keys(kwargs).length > 0) out.chat_template_kwargs = kwargs;
  if (profile.thinking.forward_reasoning_effort && req.reasoning_effort !== undefined) out.reasoning_effort = req.reasoning_effort;
  return out;
}
