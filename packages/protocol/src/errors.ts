import { z } from "zod";

/** The error body of every trainer/admin route (DESIGN §2). Agent routes answer in their client's shape. */
export const ErrorBody = z.object({
  error: z.object({
    type: z.string(),
    message: z.string(),
    details: z.unknown().optional(),
  }),
});
export type ErrorBody = z.infer<typeof ErrorBody>;

/** Turns zod issues into a short list that names each bad field by its dotted path. */
export function describeIssues(error: z.ZodError): { path: string; message: string }[] {
  return error.issues.map((issue) => ({
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
