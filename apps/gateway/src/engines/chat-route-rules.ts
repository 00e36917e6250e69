import { gatewayParser, type GatewayParser } from "@rollgate/models";
import { engineFinish } from "./answer-check.js";
import { EngineError } from "./errors.js";
import type { TokenInCall } from "./token-in.js";

/**
 * What vLLM's and SGLang's chat routes do around their output parsers, for the token-in routes
 * that run the gateway's own copy of those parsers (their completions / generate routes run none).
 */

/** The chat routes parse tool calls only when the request has tools and tool_choice is not "none". */
export function parsesTools(call: Pick<TokenInCall, "request">): boolean {
  return (call.request.tools?.length ?? 0) > 0 && call.request.tool_choice !== "none";
}

/**
 * The finish reason of an answer whose tool calls the gateway parsed: "tool_calls" when it ended by
 * itself; a cut (`length`, an abort) keeps its reason (vLLM's chat route would say "tool_calls" for
 * a call cut by max_tokens too: see vllm/chat.ts cutFinishReason).
 */
export function chatFinishReason(engine: string, toolCalls: number, stopReason?: string | number | null): string {
  const reason = engineFinish(engine);
  // An answer one of the agent's stop strings ended stays "stop" (answer-check.ts stopStringFinish).
  return toolCalls > 0 && reason === "stop" && typeof stopReason !== "string" ? "tool_calls" : reason;
}

/**
 * The parser the engine's model profile lets the gateway run on text it generated on a route with
 * no engine parser. Callers only take such a route when the profile declares one.
 */
export function profileParser(call: Pick<TokenInCall, "target">): GatewayParser {
  const name = call.target.profile.gateway_parser;
  if (!name) throw new EngineError(`the ${call.target.profile.name} profile declares no gateway parser: this route cannot parse its output`, 501, "rejected");
  return gatewayParser(name);
}
