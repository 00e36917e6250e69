import { fnv1a, mix32 } from "./hash.js";

/**
 * Simulated mixture-of-experts routing (`--moe layers,experts,topk`), so the gateway's routed
 * experts (R3) can be checked token by token.
 *
 * Contract (unsigned 32-bit arithmetic, hash.ts): the token at position i of a sequence, fed
 * through the model under weight version v, is routed in layer l to the experts
 *   h = fnv1a(v); for id in seq[0..i] (inclusive): h = mix32(h, id)      // its causal context
 *   g = mix32(h, 0x40000000 + l)
 *   candidate j = 1, 2, … : mix32(g, j) mod experts, skipping repeats, until topk are chosen
 * in that order. A token's row is its `layers × topk` ids, layer-major.
 *
 * A sequence of n tokens has n - 1 rows: its last token (the last sampled one) is never fed
 * through the model. The engine routes the prompt under the version it admitted the request with
 * and each generated token under the version current when it was fed back (when the next one is
 * sampled), which is how a real engine's forward passes go.
 */

export interface MoeSpec {
  layers: number;
  experts: number;
  topk: number;
}

/** Parses `layers,experts,topk` (e.g. `4,16,2`). */
export function parseMoe(text: string): MoeSpec {
  const parts = text.split(",").map((p) => p.trim());
  const [layers, experts, topk] = parts.map(Number);
  const ok = (n: number | undefined): n is number => n !== undefined && Number.isInteger(n) && n > 0;
  if (parts.length !== 3 || !ok(layers) || !ok(experts) || !ok(topk)) {
    throw new Error(`--moe must be layers,experts,topk (three positive integers), got "${text}"`);
  }
  if (topk > experts) throw new Error(`--moe: topk ${topk} is more than the ${experts} experts`);
  if (experts > 32767) throw new Error(`--moe: at most 32767 experts (engines return int16/int32 ids), got ${experts}`);
  return { layers, experts, topk };
}

/** One token's row from its context hash. */
function routeRow(spec: MoeSpec, h: number): number[] {
  const row: number[] = [];
  for (let l = 0; l < spec.layers; l++) {
    const g = mix32(h, (0x40000000 + l) >>> 0);
    const chosen: number[] = [];
    for (let j = 1; chosen.length < spec.topk; j++) {
      const e = mix32(g, j) % spec.experts;
      if (!chosen.includes(e)) chosen.push(e);
    }
    row.push(...chosen);
  }
  return row;
}

/**
 * The rows of `seq[0 .. seq.length - 1)` (every token but the last), position i routed under
 * `versionAt(i)`.
 */
export function routeSequence(spec: MoeSpec, seq: readonly number[], versionAt: (i: number) => string): number[][] {
  const rows: number[][] = [];
  let version: string | null = null;
  let h = 0;
  for (let i = 0; i < seq.length - 1; i++) {
    const v = versionAt(i);
    if (v !== version) {
      // A new version re-reads the whole context under it.
      version = v;
      h = fnv1a(v);
      for (let k = 0; k < i; k++) h = mix32(h, seq[k]!);
    }
    h = mix32(h, seq[i]!);
    rows.push(routeRow(spec, h));
  }
  return rows;
}

/** SGLang's encoding: the rows flattened, int32 little-endian, base64. */
export function packInt32Base64(rows: readonly number[][]): string {
  const flat = rows.flat();
  const buf = Buffer.alloc(flat.length * 4);
  flat.forEach((v, i) => buf.writeInt32LE(v, i * 4));
  return buf.toString("base64");
}

/** vLLM's JSON form: per token, `layers` lists of `topk` ids. */
export function nestRows(spec: MoeSpec, rows: readonly number[][]): number[][][] {
  return rows.map((row) => Array.from({ length: spec.layers }, (_, l) => row.slice(l * spec.topk, (l + 1) * spec.topk)));
}

/** What a generation needs for its routing: its prompt, its emitted tokens and the versions they used. */
export interface RoutedGeneration {
  promptIds: readonly number[];
  tokens: readonly { id: number; version: string }[];
  promptVersion: string | null;
}

/**
 * The rows of a generation's prompt and its emitted tokens but the last: prompt positions under the
 * version the prompt was read with, output token j under the version token j + 1 was sampled with.
 */
export function generationRows(spec: MoeSpec, g: RoutedGeneration, currentVersion: string): { prompt: number[][]; output: number[][] } {
  const P = g.promptIds.length;
  const seq = [...g.promptIds, ...g.tokens.map((t) => t.id)];
  const promptVersion = g.promptVersion ?? currentVersion;
  const rows = routeSequence(spec, seq, (i) => (i < P ? promptVersion : g.tokens[i - P + 1]!.version));
  return { prompt: rows.slice(0, P), output: rows.slice(P) };
}
