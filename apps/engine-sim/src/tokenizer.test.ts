import { describe, expect, it } from "vitest";
import { SimTokenizer } from "./tokenizer.js";
import type { TokenizerFiles } from "./tokenizer-files.js";

// Token bytes for both vocabulary schemes a Hugging Face tokenizer.json may use: byte-level BPE
// (GPT-2 byte↔unicode map; every family engine-sim ships) and sentencepiece-style (a "▁" word mark
// and <0xNN> byte-fallback tokens; Llama 2, Mistral, Gemma), here a small hand-written one.

function sentencepieceFiles(): TokenizerFiles {
  const vocab: Record<string, number> = { "<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5, "▁": 6, H: 7, i: 8, "▁Hi": 9, "!": 10 };
  return {
    source: "test:sentencepiece",
    tokenizerJSON: {
      added_tokens: [
        { id: 0, content: "<unk>", special: true },
        { id: 1, content: "<s>", special: true },
        { id: 2, content: "</s>", special: true },
      ],
      normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
      pre_tokenizer: null,
      post_processor: null,
      decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] },
      model: { type: "BPE", vocab, merges: ["▁ H", "▁H i"], byte_fallback: true, unk_token: "<unk>", fuse_unk: true, ignore_merges: false, dropout: null, continuing_subword_prefix: null, end_of_word_suffix: null },
    },
    tokenizerConfig: { bos_token: "<s>", eos_token: "</s>", add_bos_token: true },
  };
}

describe("SimTokenizer token bytes", () => {
  it("sentencepiece-style: ▁ is a space, <0xNN> is that byte; add_bos_token adds <s> when special tokens are added", () => {
    const tok = new SimTokenizer(sentencepieceFiles());
    expect(new TextDecoder().decode(tok.tokenBytes(9))).toBe(" Hi");
    expect([...tok.tokenBytes(3)]).toEqual([0x0a]);
    // A two-byte character split over byte-fallback tokens streams once complete.
    expect(tok.incrementalDecode([9, 4, 5, 10], false)).toEqual({ text: " Hié!", ends: [3, 3, 4, 5] });
    expect(tok.encode("Hi", true)[0]).toBe(1);
    expect(tok.encode("Hi", false)[0]).not.toBe(1);
  });
});
