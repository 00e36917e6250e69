import { z } from "zod";
import { WeightVersion } from "./ids.js";

/** A run of one record's sampled tokens inside a tree node, `[start, end)` in the node's own arrays. */
export const PrefixTreeSpan = z.object({
  record_id: z.string(),
  start: z.number().int().nonnegative(),
  end: z.number().int().nonnegative(),
});
export type PrefixTreeSpan = z.infer<typeof PrefixTreeSpan>;

/**
 * A run of tokens every conversation passing through it shares, stored once. Nodes come parents
 * first (depth-first order), so `parent` is always a smaller index.
 */
export const PrefixTreeNode = z.object({
  /** Index of the parent node; null for a root (conversations that share no first token). */
  parent: z.number().int().nonnegative().nullable(),
  /** Position of the node's first token in every conversation that passes through it. */
  depth: z.number().int().nonnegative(),
  token_ids: z.array(z.number().int()),
  /** 1 where a record sampled the token (trainable), 0 for prompt, tool results and template glue. */
  loss_mask: z.array(z.union([z.literal(0), z.literal(1)])),
  /** The sampling record's logprob where the mask is 1, else 0. */
  logprobs: z.array(z.number()),
  /** The weight version that sampled each token; null where the mask is 0. */
  weight_versions: z.array(WeightVersion),
  spans: z.array(PrefixTreeSpan),
});
export type PrefixTreeNode = z.infer<typeof PrefixTreeNode>;

/** One conversation of the session: the root-to-`node` path is its full token sequence. */
export const PrefixTreeSample = z.object({
  /** The node holding the conversation's last token (a leaf, unless another conversation goes on from there). */
  node: z.number().int().nonnegative(),
  /** The same conversation as one flat sample: its index in the trajectory's `traces`. */
  trace: z.number().int().nonnegative(),
});
export type PrefixTreeSample = z.infer<typeof PrefixTreeSample>;

/**
 * The `prefix_tree` builder's tree: every conversation of the session, each shared token prefix
 * stored once. Every sampled token is trainable in exactly one node; two sibling nodes start with
 * the same token only when both tokens were sampled (two samples that happened to agree).
 */
export const PrefixTree = z.object({
  nodes: z.array(PrefixTreeNode),
  samples: z.array(PrefixTreeSample),
  /** Tokens stored in the tree (Σ node lengths). */
  tree_tokens: z.number().int().nonnegative(),
  /** Tokens of the same conversations as flat samples (Σ sample lengths, prompt included). */
  flat_tokens: z.number().int().nonnegative(),
});
export type PrefixTree = z.infer<typeof PrefixTree>;
