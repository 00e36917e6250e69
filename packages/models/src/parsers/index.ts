import type { AssistantOutput } from "@rollgate/protocol";
import type { GatewayParserName } from "../profile.js";
import { hermesParser, qwen3Parser } from "./hermes.js";
import { parseWhole, type GatewayParser } from "./types.js";

export { HermesOutputParser, makeToolCallId, hermesParser, qwen3Parser } from "./hermes.js";
export { parseWhole, type GatewayParser, type OutputParser, type ParsedDelta, type ParsedToolCallDelta } from "./types.js";
export { PyDict, PyFloat, PyInt, PyJsonError, parsePyJson, pyDumps, type PyValue } from "@rollgate/pyjson";

const PARSERS: Record<GatewayParserName, GatewayParser> = { qwen3: qwen3Parser, hermes: hermesParser };

/** The gateway-side parser a profile declares. */
export function gatewayParser(name: GatewayParserName): GatewayParser {
  return PARSERS[name];
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/**
 * A whole answer's text as an engine's tokenizer decodes it (special tokens kept) → the message
 * the chat route gives, which skips special tokens: a natural end-of-turn token is dropped first.
 */
export function parseAnswerText(parser: GatewayParser, text: string, parseTools: boolean, newId?: () => string): AssistantOutput {
  const ends = new RegExp(`(?:${parser.endTokens.map(escapeRegExp).join("|")})+$`);
  return parseWhole(parser.create(parseTools, newId), parser.endTokens.length ? text.replace(ends, "") : text);
}
