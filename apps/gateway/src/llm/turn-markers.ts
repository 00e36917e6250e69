import type { ChatMessage } from "@rollgate/protocol";
import type { EngineTokenizer, TokenizeCall } from "../engines/tokenizer.js";

/**
 * The one fact about a chat format the continuation planner needs: the token that ends an
 * assistant turn (`<|im_end|>` in ChatML, `<|eot_id|>` in Llama 3, `<｜end▁of▁sentence｜>` in
 * DeepSeek, `<|end|>` in harmony, `</s>` in Mistral). Derived from the engine's own renders, never
 * hard-coded: two conversations that differ only in an assistant turn's text render identically
 * after that text, and the first token of what follows is the end of the turn.
 *
 * It is checked three ways: the same token must end the turn whether a user message or a tool
 * result follows (templates such as GLM-4.5's have no end token of their own and start the next
 * turn with a role token instead: no token-in there); it must be a single special token (its text
 * tokenises back to it alone); and it must not be whitespace (a template that writes "\n" after
 * the text would otherwise pass).
 */

export interface TurnMarkers {
  /** The token that ends an assistant turn in the engine's renders. */
  eot: number;
}

/** The first token after the one place two renders differ, when they differ in one place only; else null. */
export function tokenAfterDifference(x: readonly number[], z: readonly number[]): number | null {
  let prefix = 0;
  while (prefix < x.length && prefix < z.length && x[prefix] === z[prefix]) prefix++;
  let suffix = 0;
  while (suffix < x.length - prefix && suffix < z.length - prefix && x[x.length - 1 - suffix] === z[z.length - 1 - suffix]) suffix++;
  if (prefix === x.length || suffix === 0) return null;
  return x[x.length - suffix] ?? null;
}

const PROBE_QUERY = "rollgate turn-marker probe";
// They differ in their first and last words, so the renders differ in one run of tokens, ending where the text ends.
const PROBE_TEXTS = ["Xq7 first probe answer", "Zk9 second probe reply"] as const;

function probe(text: string, next: "user" | "tool"): ChatMessage[] {
  return [
    { role: "user", content: PROBE_QUERY },
    { role: "assistant", content: text },
    next === "user" ? { role: "user", content: "ok" } : { role: "tool", content: "ok", tool_call_id: "rollgate-probe" },
  ];
}

/** Derives the end-of-turn token from four renders, or says why there is none. */
export async function deriveTurnMarkers(tokenizer: EngineTokenizer, call: TokenizeCall): Promise<TurnMarkers | { why: string }> {
  let renders: number[][];
  try {
    renders = (
      await Promise.all([
        tokenizer.renderChat(call, probe(PROBE_TEXTS[0], "user")),
        tokenizer.renderChat(call, probe(PROBE_TEXTS[1], "user")),
        tokenizer.renderChat(call, probe(PROBE_TEXTS[0], "tool")),
        tokenizer.renderChat(call, probe(PROBE_TEXTS[1], "tool")),
      ])
    ).map((r) => r.ids);
  } catch (err) {
    if (call.signal.aborted) throw err;
    return { why: `the engine cannot render the marker probes: ${(err as Error).message}` };
  }
  const beforeUser = tokenAfterDifference(renders[0]!, renders[1]!);
  const beforeTool = tokenAfterDifference(renders[2]!, renders[3]!);
  if (beforeUser === null || beforeTool === null) return { why: "no token follows an assistant turn in the engine's renders" };
  if (beforeUser !== beforeTool) {
    return { why: "the template ends an assistant turn with a different token before a user message than before a tool result: it has no end-of-turn token of its own" };
  }
  const text = await tokenizer.detokenize(call, [beforeUser]);
  const back = await tokenizer.tokenizeText(call, text);
  if (text.trim() === "" || back.length !== 1 || back[0] !== beforeUser) {
    return { why: `the token after an assistant turn (${JSON.stringify(text)}) is not a special end-of-turn token` };
  }
  return { eot: beforeUser };
}
