import type { SimTokenizer } from "../tokenizer.js";
import { requireTokenId, tailAfterOpener } from "./types.js";

/** Turn markers shared by the ChatML families (Qwen3, Qwen3-Coder): `<|im_start|>role\n … <|im_end|>`. */

const DONE_ASSISTANT_TURN = /<\|im_start\|>assistant[\s\S]*?<\|im_end\|>/g;

export function countChatmlAnswers(textAfterScript: string): number {
  return [...textAfterScript.matchAll(DONE_ASSISTANT_TURN)].length;
}

/** The tokens after the last `<|im_start|>assistant\n` when no `<|im_end|>` closed that turn. */
export function openChatmlAnswer(promptIds: readonly number[], tok: SimTokenizer): number[] {
  const start = requireTokenId(tok, "<|im_start|>");
  const opener = tok.encode("<|im_start|>assistant\n");
  // Only the last turn counts: a later <|im_start|> of another role means nothing is open.
  const lastStart = promptIds.lastIndexOf(start);
  if (lastStart < 0 || !opener.every((id, k) => promptIds[lastStart + k] === id)) return [];
  return tailAfterOpener(promptIds, opener, [requireTokenId(tok, "<|im_end|>")]);
}
