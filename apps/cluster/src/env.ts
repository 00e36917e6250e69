import { KeyPrefix, LogLevel, OptionalSecret, Port, parseEnv } from "@rollgate/config";
import { z } from "zod";

/** The one-process cluster's environment (a bad value is a start-up error naming every bad variable). */

export const ClusterEnv = z.object({
  PORT: Port.default(8080),
  HOST: z.string().default("127.0.0.1"),
  REDIS_URL: z.string().optional(),
  ROLLGATE_KEY_PREFIX: KeyPrefix,
  ROLLGATE_API_KEY: OptionalSecret,
  ROLLGATE_ENGINES: z.string().optional(),
  ROLLGATE_PUBLIC_URL: z.url().optional(),
  ROLLGATE_WORKER_CONCURRENCY: z.coerce.number().int().positive().default(4),
  ROLLGATE_SIM_PORT: Port.default(0),
  ROLLGATE_SIM_DP_SIZE: z.coerce.number().int().positive().default(2),
  LOG_LEVEL: LogLevel,
});
export type ClusterEnv = z.infer<typeof ClusterEnv>;


export function loadClusterEnv(env: Record<string, string | undefined> = process.env): ClusterEnv {
  return parseEnv(ClusterEnv, env);
}
