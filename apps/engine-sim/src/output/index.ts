import type { ReasoningParserName, ToolParserName } from "../families/types.js";
import { qwen3HermesParser } from "./qwen3-hermes.js";
import type { OutputParser } from "./types.js";

export const TOOL_PARSERS: readonly ToolParserName[] = ["hermes"];
export const REASONING_PARSERS: readonly ReasoningParserName[] = ["qwen3"];

/** The output parser of a server started with `--reasoning-parser R --tool-call-parser T` (either may be absent). */
export function outputParser(reasoning: ReasoningParserName | null, tools: ToolParserName | null): OutputParser {
  if ((reasoning === "qwen3" || reasoning === null) && (tools === "hermes" || tools === null)) return qwen3HermesParser(reasoning !== null, tools !== null);
  throw new Error(`engine-sim: --reasoning-parser ${reasoning ?? "(none)"} with --tool-call-parser ${tools ?? "(none)"} is not implemented`);
}
