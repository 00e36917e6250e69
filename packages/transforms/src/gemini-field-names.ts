import { z } from "zod";

/**
 * The Gemini API is protobuf behind JSON, and proto3's JSON mapping accepts every field under its
 * lowerCamelCase name *and* its original snake_case name: Google's own REST examples send
 * `system_instruction`, `inline_data` / `mime_type`, `generation_config`, and clients built on
 * them (curl scripts, LiteLLM, hand-rolled agents) do too. The request parser reads camelCase
 * only, so a snake_case field was ignored without a word: the system prompt, the sampling config,
 * a replayed function call or its response silently left out of what the engine saw.
 *
 * `camelCaseGeminiFields` renames the snake_case names of a GenerateContentRequest's *message*
 * fields to camelCase before parsing. It descends only into message-typed fields; free-form JSON
 * the caller owns (a function call's `args`, a function response's `response`, tool `parameters`
 * and every schema) keeps its keys exactly as sent. A field sent under both names is refused.
 */

/** Which fields of a message are messages themselves (descended into); every other field is a leaf. */
interface MessageFields {
  readonly [camelName: string]: MessageFields;
}

const LEAF: MessageFields = {};
// A functionCall's `args`, a functionResponse's `response` and a declaration's `parameters` /
// `parametersJsonSchema` are not listed: they are the caller's JSON, never renamed.
const PART: MessageFields = {
  inlineData: LEAF,
  fileData: LEAF,
  functionCall: LEAF,
  functionResponse: { parts: { inlineData: LEAF, fileData: LEAF } },
  executableCode: LEAF,
  codeExecutionResult: LEAF,
  videoMetadata: LEAF,
};
const CONTENT: MessageFields = { parts: PART };
/** `systemInstruction` may be a Content or (as the gateway also accepts) an array of parts. */
const CONTENT_OR_PART: MessageFields = { ...CONTENT, ...PART };
const TOOL: MessageFields = { functionDeclarations: LEAF };
const TOOL_CONFIG: MessageFields = { functionCallingConfig: LEAF };
// responseSchema / responseJsonSchema are schemas (the caller's keys): not listed.
const GENERATION_CONFIG: MessageFields = { thinkingConfig: LEAF, speechConfig: LEAF, imageConfig: LEAF };
const REQUEST: MessageFields = {
  contents: CONTENT,
  systemInstruction: CONTENT_OR_PART,
  tools: TOOL,
  toolConfig: TOOL_CONFIG,
  generationConfig: GENERATION_CONFIG,
  safetySettings: LEAF,
};

const SNAKE = /^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$/;
const camel = (name: string) => (SNAKE.test(name) ? name.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase()) : name);

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

function rename(value: unknown, fields: MessageFields, path: (string | number)[]): unknown {
  if (Array.isArray(value)) return value.map((v, i) => rename(v, fields, [...path, i]));
  if (!isPlainObject(value)) return value;
  const out: Record<string, unknown> = {};
  for (const [name, v] of Object.entries(value)) {
    const c = camel(name);
    if (c !== name && Object.hasOwn(value, c)) {
      throw new z.ZodError([{ code: "custom", path: [...path, name], message: `${name} and ${c} are the same field; send it once`, input: v }]);
    }
    const sub = Object.hasOwn(fields, c) ? fields[c] : undefined;
    out[c] = sub ? rename(v, sub, [...path, c]) : v;
  }
  return out;
}

/** A Gemini GenerateContentRequest with its snake_case message field names in camelCase (see the module comment). */
export function camelCaseGeminiFields(body: unknown): unknown {
  return rename(body, REQUEST, []);
}
