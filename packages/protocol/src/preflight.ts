import { z } from "zod";

/**
 * An engine's preflight, as `GET /admin/engines` reports it: what will hold on the engine before a
 * run, found out by asking the engine itself (renders through its /tokenize, one short generation).
 */
export const Preflight = z.object({
  engine: z.number().int(),
  url: z.string(),
  kind: z.string(),
  /** The engine's model profile (ROLLGATE_ENGINES[].profile). */
  profile: z.string(),
  served_model: z.string().nullable(),
  /** The engine's version (vLLM /version, SGLang /server_info), when it says. */
  version: z.string().nullable(),
  /** Token ids of its trajectories must be below this; null: any non-negative integer. */
  vocab_size: z.number().int().nullable(),
  token_in: z.object({
    /** Whether a call can continue a recorded one from its own token ids. */
    available: z.boolean(),
    /** The engine route it would take: chat_prompt_token_ids, chat_kv_transfer_params, chat_input_ids, completions, generate. */
    route: z.string().nullable(),
    /** The end-of-turn token derived from the engine's renders. */
    end_of_turn: z.string().nullable(),
    why: z.string().nullable(),
  }),
  tool_turn: z.object({
    /** Whether a tool-calling turn the model wrote re-renders to the ids it was generated as (null: not known). */
    round_trips: z.boolean().nullable(),
    /** The form the turn must be sent back in for that (empirical history normalisation). */
    form: z.string().nullable(),
    detail: z.string(),
  }),
  reasoning: z.object({
    /** Whether the template drops an earlier turn's reasoning once a new user query follows (so traces break there without token-in). */
    dropped_at_user_turn: z.boolean().nullable(),
    dropped_in_tool_loop: z.boolean().nullable(),
    detail: z.string(),
  }),
  pause: z.object({
    /** What an abort-mode pause does on this engine: keep / in_place (freeze), abort_continue, or drain. */
    abort_mode: z.enum(["keep", "in_place", "abort_continue", "drain"]).nullable(),
    why: z.string(),
  }),
  checked_at: z.string(),
  /** Checks that could not run. */
  errors: z.array(z.string()),
});
export type Preflight = z.infer<typeof Preflight>;
