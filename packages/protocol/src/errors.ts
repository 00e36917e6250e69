import { z } from "zod";

/** The error body of every trainer/admin route (docs/http-api.md#errors). Agent routes answer in their client's shape. */
export const ErrorBody = z.object({
  error: z.object({
    type: z.string(),
    message: z.string(),
    details: z.unknown().optional(),
  }),
});
export type ErrorBody = z.infer<typeof ErrorBody>;

type Issue = z.core.$ZodIssue;

/**
 * A union (e.g. a batch: `{tasks}` or `{group_id, n, task}`) reports only "Invalid input" at its
 * own path: descend into the branch that came closest (fewest issues), so the message names the
 * field that is wrong.
 */
function flatten(issues: readonly Issue[], prefix: PropertyKey[] = []): { path: PropertyKey[]; message: string }[] {
  return issues.flatMap((i) => {
    const path = [...prefix, ...i.path];
    if (i.code === "invalid_union" && i.errors.length > 0) {
      const closest = [...i.errors].sort((a, b) => a.length - b.length)[0]!;
      if (closest.length > 0) return flatten(closest, path);
    }
    return [{ path, message: i.message }];
  });
}

/** Turns zod issues into a short list that names each bad field by its dotted path. */
export function describeIssues(error: z.ZodError): { path: string; message: string }[] {
  return flatten(error.issues).map((issue) => ({
    path: issue.path.map(String).join(".") || "(body)",
    message: issue.message,
  }));
}

/** One readable sentence naming every bad field, for `error.message`. */
export function issuesMessage(error: z.ZodError): string {
  return describeIssues(error)
    .map((i) => `${i.path}: ${i.message}`)
    .join("; ");
}
