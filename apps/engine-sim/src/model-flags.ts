import { readFileSync } from "node:fs";
import { FAMILY_NAMES } from "./families/index.js";
import type { FamilyName, ReasoningParserName, ToolParserName } from "./families/types.js";
import { REASONING_PARSERS, TOOL_PARSERS } from "./output/index.js";
import type { EngineSimOptions } from "./state.js";
import { releaseOf } from "./versions.js";

/** The model flags of the CLI (`--family`, `--tokenizer`, …) checked and turned into app options. */

export class ModelFlagError extends Error {}

export interface ModelFlagValues {
  family?: string | undefined;
  tokenizer?: string | undefined;
  chatTemplate?: string | undefined;
  toolParser?: string | undefined;
  reasoningParser?: string | undefined;
  vllmVersion?: string | undefined;
  startDate?: string | undefined;
}

function parserFlag<T extends string>(flag: string, value: string | undefined, known: readonly T[]): T | null | undefined {
  if (value === undefined) return undefined;
  if (value === "none") return null;
  if (!(known as readonly string[]).includes(value)) throw new ModelFlagError(`${flag} must be one of ${known.join(", ")}, none; got "${value}"`);
  return value as T;
}

export function modelFlags(v: ModelFlagValues): Partial<EngineSimOptions> {
  const out: Partial<EngineSimOptions> = {};
  if (v.family !== undefined) {
    if (!(FAMILY_NAMES as string[]).includes(v.family)) throw new ModelFlagError(`--family must be one of ${FAMILY_NAMES.join(", ")}; got "${v.family}"`);
    out.family = v.family as FamilyName;
  }
  if (v.tokenizer !== undefined) out.tokenizer = v.tokenizer;
  if (v.chatTemplate !== undefined) {
    try {
      out.chatTemplate = readFileSync(v.chatTemplate, "utf8");
    } catch (e) {
      throw new ModelFlagError(`--chat-template: cannot read ${v.chatTemplate}: ${(e as Error).message}`);
    }
  }
  const tp = parserFlag<ToolParserName>("--tool-call-parser", v.toolParser, TOOL_PARSERS);
  if (tp !== undefined) out.toolParser = tp;
  const rp = parserFlag<ReasoningParserName>("--reasoning-parser", v.reasoningParser, REASONING_PARSERS);
  if (rp !== undefined) out.reasoningParser = rp;
  if (v.vllmVersion !== undefined) {
    try {
      releaseOf(v.vllmVersion);
    } catch (e) {
      throw new ModelFlagError(`--vllm-version: ${(e as Error).message}`);
    }
    out.vllmVersion = v.vllmVersion;
  }
  if (v.startDate !== undefined) {
    if (!/^\d{4}-\d{2}-\d{2}$/.test(v.startDate)) throw new ModelFlagError(`--system-start-date must be YYYY-MM-DD; got "${v.startDate}"`);
    out.startDate = v.startDate;
  }
  return out;
}
