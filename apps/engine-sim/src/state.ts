import { Ranks } from "./ranks.js";
import { getTokenizer } from "./tokenizer.js";
import type { SimTokenizer } from "./tokenizer.js";

export type SimKind = "vllm" | "sglang";
export type ReasoningField = "reasoning" | "reasoning_content";

export interface EngineSimOptions {
  /** Which server to imitate; only "vllm" exists so far. Default "vllm". */
  kind?: SimKind;
  /** Data-parallel ranks behind the one port. Default 1. */
  dpSize?: number;
  /** Served model name (`model` in requests and responses, `/v1/models`). Default "Qwen/Qwen3-8B". */
  model?: string;
  /** Seed of the random policy. Default 0. */
  seed?: number;
  /** Tokens in an unscripted answer (before `<|im_end|>`). Default 24. */
  randomTokens?: number;
  /** Delay before the first generated token, ms. Default 0. */
  ttftMs?: number;
  /** Delay between generated tokens, ms. Default 0. */
  tpotMs?: number;
  /** `max_model_len`. Default 40960. */
  maxModelLen?: number;
  /** Name of the reasoning field in messages and deltas (vLLM renamed it in v0.11/PR #27752). Default "reasoning". */
  reasoningField?: ReasoningField;
  /** Server default for `return_tokens_as_token_ids` (vLLM's `--return-tokens-as-token-ids`). Default false. */
  returnTokensAsTokenIds?: boolean;
  /** Initial weight version (changes the deterministic logprobs). Default "0". */
  weightVersion?: string;
  /** Fastify logger: false (default), true, or pino options. */
  logger?: boolean | Record<string, unknown>;
}

export type ResolvedOptions = Required<Omit<EngineSimOptions, "logger">>;

export function resolveOptions(o: EngineSimOptions): ResolvedOptions {
  return {
    kind: o.kind ?? "vllm",
    dpSize: o.dpSize ?? 1,
    model: o.model ?? "Qwen/Qwen3-8B",
    seed: o.seed ?? 0,
    randomTokens: o.randomTokens ?? 24,
    ttftMs: o.ttftMs ?? 0,
    tpotMs: o.tpotMs ?? 0,
    maxModelLen: o.maxModelLen ?? 40960,
    reasoningField: o.reasoningField ?? "reasoning",
    returnTokensAsTokenIds: o.returnTokensAsTokenIds ?? false,
    weightVersion: o.weightVersion ?? "0",
  };
}

/** Everything one simulator instance holds (per app; the tokenizer is shared per process). */
export class SimState {
  readonly opts: ResolvedOptions;
  readonly tok: SimTokenizer;
  readonly ranks: Ranks;
  /** Current weight version; every generated token's logprob is derived from it. */
  weightVersion: string;
  readonly startedAt = Math.floor(Date.now() / 1000);

  constructor(options: EngineSimOptions) {
    this.opts = resolveOptions(options);
    if (!Number.isInteger(this.opts.dpSize) || this.opts.dpSize < 1) throw new Error(`dpSize must be a positive integer, got ${this.opts.dpSize}`);
    this.tok = getTokenizer();
    this.ranks = new Ranks(this.opts.dpSize);
    this.weightVersion = this.opts.weightVersion;
  }
}
