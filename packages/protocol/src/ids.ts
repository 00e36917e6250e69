import { z } from "zod";

/** Ids end up in Redis keys and BullMQ job ids: no ':' and not all digits (BullMQ reserves those). */
export const Id = z
  .string()
  .min(1)
  .max(128)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, "use letters, digits, '.', '_' or '-' (starting with a letter or digit)")
  .refine((s) => !/^\d+$/.test(s), "must not be all digits");
export type Id = z.infer<typeof Id>;

export const WeightVersion = z.string().min(1).max(128).nullable();
export type WeightVersion = z.infer<typeof WeightVersion>;
