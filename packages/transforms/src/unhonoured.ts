import type { ToolChoice, ToolDefinition } from "@rollgate/protocol";
import { z } from "zod";

/**
 * Request fields the gateway cannot honour. For RL the tokens an agent gets must be sampled the way
 * it asked, or the agent must be told no: a field ignored without a word (a logit bias, a JSON
 * schema, a minimum length) leaves the agent believing it constrained the answer while the engine
 * sampled something else, and the rollout and its recorded logprobs describe a request that was
 * never made. Such a field is accepted only at its neutral value (absent, null, or the value that
 * asks for nothing) and otherwise refused with a 400 naming it, in the caller's protocol.
 */

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Accepts the field absent, null or `neutral(value)`; any other value is a 400 with `message`. */
export function refusedUnless(neutral: (v: unknown) => boolean, message: string) {
  return z
    .unknown()
    .optional()
    .refine((v) => v === undefined || v === null || neutral(v), { message });
}

export const isEmpty = (v: unknown) => (Array.isArray(v) ? v.length === 0 : isRecord(v) && Object.keys(v).length === 0);
export const isFalse = (v: unknown) => v === false;
export const isTrue = (v: unknown) => v === true;
export const isZero = (v: unknown) => v === 0;
export const isOne = (v: unknown) => v === 1;
export const never = () => false;
/** A `{type: "text"}` format (OpenAI's response_format, Responses' text.format): plain text, no constraint. */
export const isTextFormat = (v: unknown) => isRecord(v) && v.type === "text";
/** An output modality list asking for text only. */
export const isTextOnly = (v: unknown) => Array.isArray(v) && v.every((m) => typeof m === "string" && m.toLowerCase() === "text");

/** Why structured output is refused (one sentence, every protocol). */
export const NO_STRUCTURED_OUTPUT =
  "structured output is not supported: the gateway does not constrain decoding to a format or schema, so the answer would not follow it; remove it (ask for the format in the prompt)";

/** The message for a sampling or prompt field the gateway does not pass to the engine. */
export const notPassed = (field: string, what: string) => `${field} is not supported: the gateway does not pass ${what} to the engine; remove it`;

/** Whether a tool choice forces a call (required, or a named function). */
export const forcesACall = (choice: ToolChoice | undefined) => choice === "required" || (typeof choice === "object" && choice !== null);

/**
 * A forced tool call with no tool the engine can call (none declared, or only hosted / server tools,
 * which are never offered): the model would answer in text where the agent required a call.
 */
export const NO_TOOL_TO_CALL =
  "forces a tool call, but no function tool is offered to the engine (hosted and server tools are not); declare one, or let the model choose";

export function noToolToCall(path: PropertyKey[], input: unknown): z.ZodError {
  return new z.ZodError([{ code: "custom", path, message: NO_TOOL_TO_CALL, input }]);
}

/**
 * A tool choice naming a function the engine is not offered (undeclared, a hosted / server tool,
 * or left out by the choice's own allowed list): refused here with the field's path, before the
 * call takes one of the session's calls, rather than by the engine after it did.
 */
export function namedToolNotOffered(choice: ToolChoice | undefined, offered: readonly ToolDefinition[], path: PropertyKey[], shownName?: string): z.ZodError | null {
  if (typeof choice !== "object" || choice === null) return null;
  const name = choice.function.name;
  if (offered.some((t) => t.function.name === name)) return null;
  return new z.ZodError([{ code: "custom", path, message: `tool ${shownName ?? name} is not declared among the function tools offered to the engine`, input: name }]);
}
