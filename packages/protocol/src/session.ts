import { z } from "zod";
import { SamplingParams } from "./chat.js";
import { ErrorBody } from "./errors.js";
import { Id } from "./ids.js";
import { LostCalls } from "./lost-calls.js";
import { Trajectory } from "./trace.js";

export const SessionLimits = z
  .object({
    max_llm_calls: z.number().int().positive().optional(),
    max_total_tokens: z.number().int().positive().optional(),
  })
  .strict();
export type SessionLimits = z.infer<typeof SessionLimits>;

/** A branch's session: its first `calls` LLM calls are answered from `session_id`'s records (docs/data-model.md#branches). */
export const ReplaySpec = z
  .object({
    session_id: z.string().min(1),
    calls: z.number().int().min(1),
    /** Replayed answers' tokens stay trainable (else loss_mask 0). */
    train: z.boolean().default(false),
  })
  .strict();
export type ReplaySpec = z.infer<typeof ReplaySpec>;

/** Where a branch's agent asked something other than what the source asked: the branch ends `replay_diverged`. */
export const ReplayDiverged = z.object({ call: z.number().int(), message: z.string() });
export type ReplayDiverged = z.infer<typeof ReplayDiverged>;

export const CreateSessionRequest = z
  .object({
    id: Id.optional(),
    model: z.string().optional(),
    sampling: SamplingParams.default({}),
    limits: SessionLimits.default({}),
    affinity_key: z.string().min(1).max(256).optional(),
    metadata: z.record(z.string(), z.unknown()).default({}),
    replay: ReplaySpec.optional(),
  })
  .strict();
export type CreateSessionRequest = z.infer<typeof CreateSessionRequest>;

export const CreateSessionResponse = z.object({
  id: z.string(),
  token: z.string(),
  base_url: z.string(),
  urls: z.object({ openai: z.string(), anthropic: z.string(), gemini: z.string() }),
});
export type CreateSessionResponse = z.infer<typeof CreateSessionResponse>;

export const RankRef = z.object({ engine: z.number().int().nonnegative(), dp_rank: z.number().int().nonnegative() });
export type RankRef = z.infer<typeof RankRef>;


/** A session as stored (without its token) and as `GET /v1/sessions/:id` shows it. */
export const Session = z.object({
  id: z.string(),
  state: z.enum(["open", "closed"]),
  created_at: z.string(),
  closed_at: z.string().nullable(),
  model: z.string().nullable(),
  sampling: SamplingParams,
  limits: SessionLimits,
  affinity_key: z.string().nullable(),
  metadata: z.record(z.string(), z.unknown()),
  assignment: z
    .object({ engine: z.number().int(), engine_url: z.string(), dp_rank: z.number().int(), served_model: z.string() })
    .nullable(),
  counts: z.object({
    llm_calls: z.number().int(),
    prompt_tokens: z.number().int(),
    completion_tokens: z.number().int(),
    cached_tokens: z.number().int(),
  }),
  lost_calls: LostCalls.default({ count: 0, first: null }),
  replay: ReplaySpec.nullable().default(null),
  replay_diverged: ReplayDiverged.nullable().default(null),
});
export type Session = z.infer<typeof Session>;

/**
 * What `POST /v1/sessions/:id/close` answers: the closed session and, when `?trajectory=<builder>`
 * was asked, its trajectory built in the same request (a worker's last two requests of a rollout
 * in one), or `trajectory_error` saying why it could not be built (`trajectory_invalid`).
 */
export const ClosedSession = Session.extend({
  trajectory: Trajectory.optional(),
  trajectory_error: ErrorBody.shape.error.optional(),
});
export type ClosedSession = z.infer<typeof ClosedSession>;
