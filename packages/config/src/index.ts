import { z } from "zod";

/**
 * What every app's environment schema is built from (each app owns its schema: `apps/<app>/src/env.ts`).
 * A bad value is a start-up error, never a silent default.
 */

/** Parses an environment with a schema, or throws one error that lists every bad variable. */
export function parseEnv<S extends z.ZodType>(schema: S, env: Record<string, string | undefined>): z.infer<S> {
  const result = schema.safeParse(env);
  if (result.success) return result.data;
  const lines = result.error.issues.map((i) => `  ${i.path.join(".") || "(env)"}: ${i.message}`);
  throw new Error(`invalid environment:\n${lines.join("\n")}`);
}

export const Port = z.coerce.number().int().min(0).max(65535);
export const LogLevel = z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info");
/** One server (`redis://host:port/db`) or a Redis Cluster by its seed nodes (`redis+cluster://h1:p1,h2:p2`). */
export const RedisUrl = z
  .string()
  .default("redis://127.0.0.1:6379")
  .refine(
    (u) => /^rediss?:\/\//.test(u) || /^rediss?\+cluster:\/\/(?:[^@/]*@)?[^/:,]+:\d+(?:,[^/:,]+:\d+)*\/?$/.test(u),
    "must be redis://host:port[/db], rediss://…, or redis+cluster://host1:port1,host2:port2",
  );
/** A secret that may be set empty: empty is unset. */
export const OptionalSecret = z
  .string()
  .optional()
  .transform((s) => (s === "" ? undefined : s));
/**
 * How long task records and results stay in Redis (seconds after a task ended). The gateway (for
 * the tasks it ends itself: a cancel before start) and the workers (every other result) must agree.
 */
export const ResultTtlSeconds = z.coerce.number().int().positive().default(7 * 24 * 3600);
/** Key prefix for every Redis key and BullMQ queue of one deployment (lets tests share a server). */
export const KeyPrefix = z
  .string()
  .regex(/^[A-Za-z0-9_-]+$/, "letters, digits, '_' or '-' only")
  .default("rg");
