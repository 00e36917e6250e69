import { z } from "zod";

/** Helpers for a message's content: a string or an array of typed parts, each error at its own path. */

/**
 * A string, or an array of `item`: checked by hand rather than with z.union so that an error in
 * one element names that element's path instead of "invalid union" at the field.
 */
export function stringOrArrayOf<T extends z.ZodType>(item: T, what: string) {
  return z.unknown().transform((v, ctx) => {
    if (typeof v === "string") return v;
    if (!Array.isArray(v)) {
      ctx.addIssue({ code: "custom", message: `expected a string or an array of ${what}` });
      return z.NEVER;
    }
    const r = z.array(item).safeParse(v);
    if (r.success) return r.data;
    for (const i of r.error.issues) ctx.addIssue({ code: "custom", message: i.message, path: i.path });
    return z.NEVER;
  }) as unknown as z.ZodType<string | z.output<T>[]>;
}

/** A discriminated union's error for a part whose `type` is none of its options: says which it takes. */
export const partError = (what: string) => ({
  error: (iss: { code?: string; input?: unknown }) => {
    if (iss.code !== "invalid_union") return undefined;
    const type = (iss.input as { type?: unknown } | null | undefined)?.type;
    return `unsupported content part type${typeof type === "string" ? ` ${JSON.stringify(type)}` : ""}; expected ${what}`;
  },
});

/**
 * Images must come inline. An image given by URL would be fetched by the engine itself, from its
 * own network (a sandboxed agent could make it reach addresses the sandbox cannot), and the rollout
 * would not hold its bytes: a replay, a branch or a trainer re-reading the trajectory could see a
 * different image than the one the tokens were sampled from.
 */
export const isInlineImage = (url: string) => url.startsWith("data:");
export const imageByUrlRefused = (inline: string) =>
  `images by URL are not supported: send the image inline (${inline}); the engine would fetch the URL from its own network, and the rollout would not hold the image it was sampled from`;
