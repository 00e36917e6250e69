import { z } from "zod";
import { fnv1a, mix32 } from "./hash.js";

/**
 * Per-rank fault injection (sim-only; set at run time through `POST /sim/faults` or at start with
 * `--fault`). Pure data and pure decisions; the engine and routes act on them.
 *   down        the rank answers 503 (/health too); the load balancer skips it
 *   slow        `delay_ms` more before the first token and before every later token
 *   error       a generation request on the rank fails with 500 at `error_rate` (default 1)
 *   disconnect  the connection is destroyed once `after_tokens` tokens are out (default 1)
 *   finish      the generation ends once `after_tokens` tokens are out (default 1) with finish
 *               reason `finish_reason` (default "error"), as a real engine ends a request it
 *               failed part way (vLLM "error"), cut ("repetition"), or one of a newer version
 *   none        clears the rank's fault
 */

export const FaultMode = z.enum(["none", "down", "slow", "error", "disconnect", "finish"]);
export type FaultMode = z.infer<typeof FaultMode>;

export const FaultSpec = z.object({
  rank: z.number().int().nonnegative().nullish(),
  mode: FaultMode,
  error_rate: z.number().min(0).max(1).nullish(),
  delay_ms: z.number().nonnegative().nullish(),
  after_tokens: z.number().int().nonnegative().nullish(),
  finish_reason: z.string().min(1).nullish(),
});
export type FaultSpec = z.infer<typeof FaultSpec>;

export interface Fault {
  mode: FaultMode;
  errorRate: number;
  delayMs: number;
  afterTokens: number;
  /** The `finish` fault's finish reason ("" otherwise). */
  finishReason: string;
}

export const NO_FAULT: Fault = { mode: "none", errorRate: 0, delayMs: 0, afterTokens: 0, finishReason: "" };

export function toFault(s: FaultSpec): Fault {
  return {
    mode: s.mode,
    errorRate: s.mode === "error" ? (s.error_rate ?? 1) : 0,
    delayMs: s.mode === "slow" ? (s.delay_ms ?? 1000) : 0,
    afterTokens: s.mode === "disconnect" || s.mode === "finish" ? (s.after_tokens ?? 1) : 0,
    finishReason: s.mode === "finish" ? (s.finish_reason ?? "error") : "",
  };
}

/** The wire form `GET /sim/faults` reports. */
export function faultJson(rank: number, f: Fault) {
  return { rank, mode: f.mode, error_rate: f.errorRate, delay_ms: f.delayMs, after_tokens: f.afterTokens, ...(f.mode === "finish" ? { finish_reason: f.finishReason } : {}) };
}

/**
 * Whether the n-th request on a rank with an error fault fails: a deterministic draw (same seed,
 * same sequence of requests → same failures), so tests with a rate in (0, 1) are reproducible.
 */
export function failsAt(f: Fault, rank: number, n: number): boolean {
  if (f.mode !== "error" || f.errorRate <= 0) return false;
  if (f.errorRate >= 1) return true;
  return mix32(fnv1a(`fault:${rank}`), n) / 4294967296 < f.errorRate;
}

/** `--fault` flag syntax: `RANK:MODE[:key=value,…]`, e.g. `1:slow:delay_ms=200`, `*:error:error_rate=0.5`. */
export function parseFaultFlag(text: string): FaultSpec {
  const [rankPart, mode, params] = text.split(":");
  const spec: Record<string, unknown> = { mode };
  if (rankPart !== "*" && rankPart !== "") spec.rank = Number(rankPart);
  for (const kv of (params ?? "").split(",").filter(Boolean)) {
    const [k, v] = kv.split("=");
    spec[k!] = k === "finish_reason" ? v : Number(v);
  }
  const parsed = FaultSpec.safeParse(spec);
  if (!parsed.success) throw new Error(`invalid --fault "${text}": ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
  return parsed.data;
}
