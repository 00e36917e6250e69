import { randomBytes } from "node:crypto";
import type { ReasoningParserName, ToolParserName } from "../families/types.js";
import { harmonySnapshot, parseHarmony } from "./harmony.js";
import { qwen3HermesParser } from "./qwen3-hermes.js";
import { deepseekThinking, splitR1 } from "./reasoning.js";
import { SnapshotStreamer } from "./snapshot.js";
import type { Snapshot } from "./snapshot.js";
import { deepseekV3, deepseekV31, llama3Json, qwen3Coder } from "./tool-parsers.js";
import type { TextToolParser } from "./tool-parsers.js";
import { makeToolCallId } from "./types.js";
import type { OutputParser, ParsedOutput, ParseRequest } from "./types.js";

export const TOOL_PARSERS: readonly ToolParserName[] = ["hermes", "qwen3_coder", "llama3_json", "deepseek_v3", "deepseek_v31", "openai"];
export const REASONING_PARSERS: readonly ReasoningParserName[] = ["qwen3", "deepseek_r1", "deepseek_v3", "openai_gptoss"];

const TEXT_TOOL_PARSERS: Partial<Record<ToolParserName, TextToolParser>> = {
  qwen3_coder: qwen3Coder,
  llama3_json: llama3Json,
  deepseek_v3: deepseekV3,
  deepseek_v31: deepseekV31,
};

/** qwen3_coder's own streamed ids: "call_" + 24 hex digits. */
const callId = () => `call_${randomBytes(12).toString("hex")}`;

/** Is the R1 splitter on for this request (deepseek_r1 always; deepseek_v3 with the thinking kwarg)? */
function r1On(reasoning: ReasoningParserName | null, req: ParseRequest): boolean {
  return reasoning === "deepseek_r1" || (reasoning === "deepseek_v3" && deepseekThinking(req.chatTemplateKwargs));
}

/** A DeepSeek reasoning parser (or none) followed by a text tool parser (or none), as vLLM's serving_chat chains them. */
function textParser(reasoning: ReasoningParserName | null, tools: TextToolParser | null): OutputParser {
  return {
    parse(text: string, _ids: readonly number[], req: ParseRequest): ParsedOutput {
      const split = r1On(reasoning, req) ? splitR1(text) : { reasoning: null, rest: text, contentNull: false };
      if (!tools || !req.toolParsing) return { reasoning: split.reasoning, content: split.contentNull ? null : split.rest, toolCalls: [], toolsCalled: false };
      const t = tools.parse(split.rest, req.tools);
      const content = t.toolsCalled ? t.content : split.contentNull ? null : t.content;
      return { reasoning: split.reasoning, content, toolCalls: t.calls, toolsCalled: t.toolsCalled };
    },
    stream(req: ParseRequest) {
      const r1 = r1On(reasoning, req);
      const snap = (text: string, _ids: readonly number[], final: boolean): Snapshot => {
        const split = r1 ? splitR1(text) : { reasoning: "", rest: text, contentNull: false };
        const t = tools && req.toolParsing ? tools.snapshot(split.rest, final, req.tools) : { content: split.rest, calls: [] };
        return { reasoning: split.reasoning ?? "", content: t.content, calls: t.calls };
      };
      return new SnapshotStreamer(snap, { emptyArgsWithName: tools?.emptyArgsWithName ?? false, makeId: tools?.ownIds ? callId : makeToolCallId });
    },
  };
}

/** gpt-oss: vLLM parses the harmony token stream itself (both flags name the same parser). */
const harmonyParser: OutputParser = {
  parse: (_text, ids, req) => parseHarmony(req.tok, ids, req.toolParsing),
  stream: (req) => new SnapshotStreamer((_text, ids, final) => harmonySnapshot(req.tok, ids, final, req.toolParsing), { makeId: makeToolCallId }),
};

/** The output parser of a server started with `--reasoning-parser R --tool-call-parser T` (either may be absent). */
export function outputParser(reasoning: ReasoningParserName | null, tools: ToolParserName | null): OutputParser {
  if ((reasoning === "qwen3" || reasoning === null) && (tools === "hermes" || tools === null)) return qwen3HermesParser(reasoning !== null, tools !== null);
  if (reasoning === "openai_gptoss" || tools === "openai") {
    if ((reasoning !== "openai_gptoss" && reasoning !== null) || (tools !== "openai" && tools !== null)) {
      throw new Error("engine-sim: the harmony parsers (openai_gptoss, openai) go together: gpt-oss output is one token stream");
    }
    return harmonyParser;
  }
  if (reasoning === "qwen3") throw new Error(`engine-sim: --reasoning-parser qwen3 goes with --tool-call-parser hermes (or none), not ${tools}`);
  if (tools === "hermes") throw new Error(`engine-sim: --tool-call-parser hermes goes with --reasoning-parser qwen3 (or none), not ${reasoning}`);
  return textParser(reasoning, tools ? TEXT_TOOL_PARSERS[tools]! : null);
}
