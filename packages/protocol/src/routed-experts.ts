import { z } from "zod";

/**
 * The experts a mixture-of-experts model routed each token to (routing replay, R3;
 * docs/data-model.md#routed-experts). Covers the positions `[0, n - 1)` of a token sequence of
 * length n (prompt then output): the last token is never fed through the model, so no engine
 * routes it. Row i holds `width` expert ids, layer-major (`layers × topk` when both are known);
 * a row of -1 is a position whose routing the engine did not report (vLLM: a prefix-cache hit).
 *
 * `data` is the rows flattened, int32 little-endian, base64 (SGLang's own encoding):
 * `np.frombuffer(base64.b64decode(data), "<i4").reshape(-1, layers, topk)` in a trainer.
 */
export const RoutedExperts = z.object({
  /** MoE layers per row, when the engine's answer shows it (vLLM's nesting does, SGLang's flat list does not). */
  layers: z.number().int().positive().nullable(),
  /** Experts per token per layer, when known. */
  topk: z.number().int().positive().nullable(),
  /** Expert ids per row. */
  width: z.number().int().positive(),
  data: z.string(),
});
export type RoutedExperts = z.infer<typeof RoutedExperts>;

const BYTES = 4;

function bytesOf(r: RoutedExperts): Buffer {
  return Buffer.from(r.data, "base64");
}

/** How many rows (token positions) it covers. */
export function routedRows(r: RoutedExperts): number {
  return Math.floor(Buffer.byteLength(r.data, "base64") / (BYTES * r.width));
}

/** Packs nested rows (`[rows][layers][topk]`, vLLM's JSON) into the stored form. */
export function packRoutedRows(rows: readonly (readonly (readonly number[])[])[], shape: { layers: number; topk: number }): RoutedExperts {
  const width = shape.layers * shape.topk;
  const buf = Buffer.alloc(rows.length * width * BYTES);
  let at = 0;
  for (const row of rows) {
    if (row.length !== shape.layers) throw new RangeError(`a routed-experts row has ${row.length} layers, not ${shape.layers}`);
    for (const layer of row) {
      if (layer.length !== shape.topk) throw new RangeError(`a routed-experts layer has ${layer.length} experts, not ${shape.topk}`);
      for (const e of layer) {
        buf.writeInt32LE(e, at);
        at += BYTES;
      }
    }
  }
  return { layers: shape.layers, topk: shape.topk, width, data: buf.toString("base64") };
}

/** Unpacks into one flat row of `width` ids per position (for tests, decoders and small exports). */
export function unpackRoutedRows(r: RoutedExperts): number[][] {
  const buf = bytesOf(r);
  const rows: number[][] = [];
  for (let at = 0; at + r.width * BYTES <= buf.length; ) {
    const row: number[] = [];
    for (let k = 0; k < r.width; k++, at += BYTES) row.push(buf.readInt32LE(at));
    rows.push(row);
  }
  return rows;
}

/** Rows `[start, end)`. */
export function sliceRoutedRows(r: RoutedExperts, start: number, end: number): RoutedExperts {
  const row = r.width * BYTES;
  return { ...r, data: bytesOf(r).subarray(start * row, end * row).toString("base64") };
}

/**
 * Rows of a sequence assembled from pieces: each piece gives the rows `[from, to)` of the whole
 * sequence (its own rows at those positions). Pieces must agree on the row width; layers and topk
 * are kept where every piece knows them.
 */
export function joinRoutedRows(pieces: readonly { experts: RoutedExperts; from: number; to: number }[]): RoutedExperts | null {
  const first = pieces[0]?.experts;
  if (!first) return null;
  const row = first.width * BYTES;
  const parts: Buffer[] = [];
  let layers = first.layers;
  let topk = first.topk;
  for (const p of pieces) {
    if (p.experts.width !== first.width) throw new RangeError(`routed experts of width ${p.experts.width} and ${first.width} cannot be joined`);
    if (p.experts.layers !== layers) layers = null;
    if (p.experts.topk !== topk) topk = null;
    const buf = bytesOf(p.experts);
    if (p.to * row > buf.length) throw new RangeError(`routed experts cover ${buf.length / row} positions, not ${p.to}`);
    parts.push(buf.subarray(p.from * row, p.to * row));
  }
  return { layers, topk, width: first.width, data: Buffer.concat(parts).toString("base64") };
}
