import { z } from "zod";
import { AssistantOutput, CanonicalChatRequest, Usage } from "./chat.js";
import { WeightVersion } from "./ids.js";
import { RoutedExperts } from "./routed-experts.js";

export const ClientProtocol = z.enum(["openai_chat", "openai_responses", "anthropic_messages", "gemini"]);
export type ClientProtocol = z.infer<typeof ClientProtocol>;

/** One LLM call, appended to its session in order (docs/data-model.md#completion-record). Ids and logprobs come from the engine. */
export const CompletionRecord = z.object({
  id: z.string(),
  session_id: z.string(),
  seq: z.number().int().nonnegative(),
  created_at: z.string(),
  protocol: ClientProtocol,
  engine: z.string(),
  dp_rank: z.number().int().nonnegative(),
  /** The weight version the call finished under (every token's, unless `output_weight_versions` says otherwise). */
  weight_version: WeightVersion,
  request: CanonicalChatRequest.omit({ stream: true, client_logprobs: true }),
  prompt_ids: z.array(z.number().int()),
  output_ids: z.array(z.number().int()),
  output_logprobs: z.array(z.number()),
  finish_reason: z.string(),
  message: AssistantOutput,
  usage: Usage,
  latency_ms: z.number(),
  /** Set when the session's rank was drained and this call moved it (the old rank's prefix cache is lost). */
  rerouted_from: z.object({ engine: z.number().int(), dp_rank: z.number().int() }).nullable().optional(),
  /**
   * Per output token, the weight version it was sampled under. Set only when an abort-mode pause
   * cut the call and it was continued token-in from the tokens already generated, so its tokens
   * come from more than one version; otherwise every token has `weight_version`.
   */
  output_weight_versions: z.array(WeightVersion).optional(),
  /** How many times an abort-mode pause cut this call before it finished (each time it was continued). */
  continued_after_pause: z.number().int().positive().optional(),
  /**
   * The experts each position of `prompt_ids ++ output_ids` was routed to (all but the last), when
   * the engine is configured with `routed_experts: true` (routed-experts.ts).
   */
  routed_experts: RoutedExperts.optional(),
});
export type CompletionRecord = z.infer<typeof CompletionRecord>;

/**
 * What the gateway reads of every earlier call on each new call (to restore echoed history and find
 * the call a conversation continues): small, unlike the record with its token ids and request.
 */
export const RecordHead = z.object({
  id: z.string(),
  seq: z.number().int().nonnegative(),
  message: AssistantOutput,
  finish_reason: z.string(),
  /** How many messages the call's request had. */
  message_count: z.number().int().nonnegative(),
  /** A hash of the request's messages and tools as the chat template sees them (echoed-history.ts). */
  conversation_key: z.string(),
});
export type RecordHead = z.infer<typeof RecordHead>;
