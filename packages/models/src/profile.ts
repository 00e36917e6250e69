import { z } from "zod";

/**
 * A model profile: what the gateway needs to know about a model family, and nothing it can ask the
 * engine instead. Everything model-specific in rollgate reads a profile; nothing else names a family.
 */

/** Output parsers the gateway itself can run on text it generated token-in (parsers/). */
export const GatewayParserName = z.enum(["qwen3", "hermes"]);
export type GatewayParserName = z.infer<typeof GatewayParserName>;

const EngineParsers = z
  .object({
    tool_call_parser: z.string().min(1).nullable(),
    reasoning_parser: z.string().min(1).nullable(),
  })
  .strict();

export const ModelProfile = z
  .object({
    name: z.string().min(1),
    description: z.string(),
    /** Token ids must lie in [0, vocab_size); null: any non-negative integer. */
    vocab_size: z.number().int().positive().nullable(),
    thinking: z
      .object({
        /** The chat_template_kwargs key the template reads to switch thinking (enable_thinking, thinking), null: none. */
        kwarg: z.string().min(1).nullable(),
        /** Whether a client's `reasoning_effort` goes to the engine as a top-level field (gpt-oss reads it). */
        forward_reasoning_effort: z.boolean(),
        /**
         * The family calls tools only in non-thinking mode (DeepSeek-V3.1): a client's thinking switch
         * is turned off for a request that declares tools, as Ollama's V3.1 template does. Default false.
         */
        off_with_tools: z.boolean().optional(),
      })
      .strict(),
    /** Which keys of a client's chat_template_kwargs reach the engine: "all" (opaque pass-through) or a list. */
    chat_template_kwargs: z.union([z.literal("all"), z.array(z.string().min(1))]),
    /**
     * Echoed assistant turns the engine re-renders: `empirical` tries a few forms of each (as generated,
     * trailing "\n" dropped, whitespace-only or "" content as null …) against the recorded ids and keeps
     * the one that reproduces them; `none` sends them as generated.
     */
    history_normalization: z.enum(["empirical", "none"]),
    /**
     * `auto`: continue a recorded call from its own token ids when the template would rewrite them,
     * with turn markers derived from the engine's own renders; `off`: the engine always renders
     * (templates rendered outside Jinja, such as harmony or mistral_common, cannot be probed).
     */
    token_in: z.enum(["auto", "off"]),
    /**
     * The most tool calls the family's chat template renders in one assistant turn (Llama 3.1's
     * refuses more than one), when it has such a limit. The engine's parser may still give more
     * (vLLM's llama3_json reads `{…}; {…}`); such a turn goes to the engine as consecutive turns of
     * at most this many calls, so its template renders the conversation, and the call continues
     * token-in from the recorded ids where it can (else the rewritten turn is a named break).
     */
    tool_calls_per_turn: z.number().int().positive().optional(),
    /**
     * The parser the gateway may run on text it generated token-in (a route with no engine parser:
     * vLLM /v1/completions, or a pause continuation), or null: the gateway never parses this model's output.
     */
    gateway_parser: GatewayParserName.nullable(),
    /** User messages wrapped in one of these (open, close) are tool results the template marks, not user queries. */
    tool_result_wrappers: z.array(z.tuple([z.string().min(1), z.string().min(1)])),
    /** The text of the output token that ends reasoning (for reasoning-token counts), null: not countable. */
    reasoning_end: z.string().min(1).nullable(),
    /** The engines' own parser names for this family (SGLang's parse routes take them; the README lists the flags). */
    engine_parsers: z.object({ vllm: EngineParsers, sglang: EngineParsers }).strict(),
    /** How this family's template breaks a trajectory, in words for break reasons (null: the generic wording). */
    notes: z
      .object({
        reasoning_dropped: z.string().min(1).nullable(),
        generation_prompt_dropped: z.string().min(1).nullable(),
        /** How the template re-renders a generated turn otherwise (the generic history_rewritten case). */
        rerendered: z.string().min(1).nullable(),
      })
      .strict(),
  })
  .strict();
export type ModelProfile = z.infer<typeof ModelProfile>;

/**
 * An inline profile in `ROLLGATE_ENGINES[].profile`: any field of a profile, over the preset named
 * by `extends` (default: `default`). Nested objects merge field by field.
 */
export const InlineProfile = z
  .object({
    extends: z.string().min(1).optional(),
    name: z.string().min(1).optional(),
    description: z.string().optional(),
    vocab_size: ModelProfile.shape.vocab_size.optional(),
    thinking: ModelProfile.shape.thinking.partial().optional(),
    chat_template_kwargs: ModelProfile.shape.chat_template_kwargs.optional(),
    history_normalization: ModelProfile.shape.history_normalization.optional(),
    token_in: ModelProfile.shape.token_in.optional(),
    tool_calls_per_turn: ModelProfile.shape.tool_calls_per_turn,
    gateway_parser: ModelProfile.shape.gateway_parser.optional(),
    tool_result_wrappers: ModelProfile.shape.tool_result_wrappers.optional(),
    reasoning_end: ModelProfile.shape.reasoning_end.optional(),
    engine_parsers: z
      .object({ vllm: EngineParsers.partial().optional(), sglang: EngineParsers.partial().optional() })
      .strict()
      .optional(),
    notes: ModelProfile.shape.notes.partial().optional(),
  })
  .strict();
export type InlineProfile = z.infer<typeof InlineProfile>;

/** What `ROLLGATE_ENGINES[].profile` holds: a preset's name or an inline profile. */
export const ProfileSpec = z.union([z.string().min(1), InlineProfile]);
export type ProfileSpec = z.infer<typeof ProfileSpec>;
