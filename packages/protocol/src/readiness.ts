import { z } from "zod";

/** Whether one configured engine can serve: a rank that answers and a known served model. */
export const EngineReadiness = z.object({
  /** Its index in ROLLGATE_ENGINES. */
  engine: z.number().int().nonnegative(),
  kind: z.string(),
  url: z.string(),
  ready: z.boolean(),
  /** The model name calls are sent with, once known (configured, or read from the engine's `/v1/models`). */
  model: z.string().nullable(),
  ranks: z.number().int().nonnegative(),
  /** Ranks that answered a probe and are not drained. */
  healthy_ranks: z.number().int().nonnegative(),
  /** Why it is not ready; null when it is. */
  reason: z.string().nullable(),
});
export type EngineReadiness = z.infer<typeof EngineReadiness>;

/** `GET /readyz` (200 when ready, 503 otherwise): Redis and every configured engine. */
export const Readiness = z.object({
  status: z.enum(["ready", "unavailable"]),
  /** Every reason it is not ready, joined; null when it is. */
  reason: z.string().nullable(),
  /** "ok", or why Redis does not answer. */
  redis: z.string(),
  engines: z.array(EngineReadiness),
});
export type Readiness = z.infer<typeof Readiness>;
