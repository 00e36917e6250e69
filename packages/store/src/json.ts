import type { z } from "zod";

/** Parses a stored JSON value through its schema: a corrupt record is an error, not a guess. */
export function parseStored<S extends z.ZodType>(schema: S, raw: string, what: string): z.infer<S> {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    throw new Error(`stored ${what} is not valid JSON`);
  }
  const result = schema.safeParse(value);
  if (!result.success) throw new Error(`stored ${what} does not match its schema: ${result.error.message}`);
  return result.data;
}
