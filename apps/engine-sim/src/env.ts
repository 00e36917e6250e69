import { LogLevel, Port, parseEnv } from "@rollgate/config";
import { z } from "zod";

/** engine-sim's environment (a bad value is a start-up error naming every bad variable). */

export const EngineSimEnv = z.object({
  PORT: Port.default(8000),
  HOST: z.string().default("127.0.0.1"),
  SIM_KIND: z.enum(["vllm", "sglang"]).default("vllm"),
  SIM_DP_SIZE: z.coerce.number().int().positive().default(1),
  SIM_MODEL: z.string().default("Qwen/Qwen3-8B"),
  SIM_SEED: z.coerce.number().int().default(0),
  /** Tokens in an unscripted answer. */
  SIM_RANDOM_TOKENS: z.coerce.number().int().positive().default(24),
  SIM_TTFT_MS: z.coerce.number().nonnegative().default(0),
  SIM_TPOT_MS: z.coerce.number().nonnegative().default(0),
  SIM_MAX_MODEL_LEN: z.coerce.number().int().positive().default(40960),
  /** Per-rank batch limit; more requests wait (0 = no limit). */
  SIM_MAX_RUNNING: z.coerce.number().int().nonnegative().default(0),
  /** Initial weight version (default: vLLM "0", SGLang "default"). */
  SIM_WEIGHT_VERSION: z.string().min(1).optional(),
  LOG_LEVEL: LogLevel,
});
export type EngineSimEnv = z.infer<typeof EngineSimEnv>;


export function loadEngineSimEnv(env: Record<string, string | undefined> = process.env): EngineSimEnv {
  return parseEnv(EngineSimEnv, env);
}
