import type { DecodedSegment, Trace } from "@rollgate/protocol";
import type { Style } from "./output.js";

/**
 * Masked (loss_mask 0) text: dim on a terminal, `[[…]]` in plain text, so a pipe or a log file
 * still tells the trainable tokens from the rest. The text comes decoded from the gateway (its
 * engines' own tokenizers), so any model family reads right.
 */
export function renderSegments(segs: readonly DecodedSegment[], s: Style): string {
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
