import type { AssistantOutput, RoutedExperts, TokenLogprob, Usage } from "@rollgate/protocol";

/**
 * What an engine adapter hands back for one call, whatever the engine. Token ids and logprobs
 * are the engine's own; `logprobs` keeps the per-token detail for clients that asked for it.
 */
export interface EngineResult {
  prompt_ids: number[];
  output_ids: number[];
  output_logprobs: number[];
  logprobs: TokenLogprob[];
  message: AssistantOutput;
  finish_reason: string;
  stop_reason: string | number | null;
  usage: Usage;
  /**
   * Per output token, the weight version it was sampled under, when the answer was read as it
   * arrived across a weight change (a freeze-in-place pause); absent: every token has the call's.
   */
  output_versions?: (string | null)[];
  /** The routed experts of prompt + output (all positions but the last), when the engine was asked for them. */
  routed_experts?: RoutedExperts;
  /**
   * The weight version the engine itself says the answer was sampled under (SGLang's
   * `meta_info.weight_version` / `metadata.weight_version`); absent where the engine tells none
   * (vLLM, SGLang's streamed chat). The gateway checks it against the version it stamps.
   */
  engine_weight_version?: string;
}

/** A streamed tool-call fragment, OpenAI-chunk shaped (the first fragment of a call has id and name). */
export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function?: { name?: string; arguments?: string };
}

/** The events an engine adapter yields while streaming, in order. */
export type EngineStreamEvent =
  | { type: "start"; prompt_ids: number[] }
  | {
      type: "delta";
      content?: string;
      reasoning?: string;
      tool_calls?: ToolCallDelta[];
      token_ids: number[];
      logprobs: TokenLogprob[];
      /** The weight version of each token, when the adapter read them as they arrived (see EngineResult.output_versions). */
      versions?: (string | null)[];
    }
  | {
      type: "finish";
      finish_reason: string;
      stop_reason: string | number | null;
      /** Engines send routed experts once, with the finished answer (EngineResult.routed_experts). */
      routed_experts?: RoutedExperts;
      /**
       * The prompt's ids, from an engine that tells them only once the answer is done (SGLang's
       * streamed chat: PR #34488's sglext chunk). Its stream's start then carried none.
       */
      prompt_ids?: number[];
      /** The weight version the engine says the answer was sampled under (EngineResult.engine_weight_version). */
      engine_weight_version?: string;
    }
  | { type: "usage"; usage: Usage };
