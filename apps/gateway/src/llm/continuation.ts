import type { CanonicalChatRequest, ChatMessage, CompletionRecord, GatewayEnv } from "@rollgate/protocol";
import type { ExtendedRecord } from "@rollgate/transforms";
import type { TokenInEngine, TokenizeCall } from "../engines/token-in.js";

/**
 * Token-in continuation. When a call extends a recorded one r (r's request messages + r's answer
 * are a prefix of the new conversation, after restoration), the prompt the model should see is
 *
 *     r.prompt_ids + r.output_ids [+ <|im_end|> when r did not end on it] + glue + new turns' ids
 *
 * where glue is what the template writes after an assistant turn's `<|im_end|>` ("\n" for Qwen3),
 * and the new turns' ids (the messages after r's answer, plus the generation prompt) come from the
 * engine's own template and tokenizer. The chain of recorded tokens then continues by construction,
 * whatever the template would have done to the history: Qwen3 with thinking off leaves the empty
 * `<think>\n\n</think>\n\n` of the generation prompt out when it re-renders an earlier turn, and
 * with thinking on drops the reasoning of turns before the last user query.
 *
 * How the new turns' ids are derived, and why they are exact. Two renders by the engine (`/tokenize`,
 * chat form), run in parallel:
 *   A = the full conversation with the generation prompt (what the chat route would send);
 *   B = the conversation up to and including r's answer, plus one sentinel message, no generation prompt.
 * In a ChatML template (Qwen3's) each message renders as its own block opening with `<|im_start|>`,
 * and a block's text depends only on the message itself, on whether it is the last message, on the
 * index of the last user query (which earlier assistant turns keep their reasoning) and on whether
 * its neighbours are tool messages (tool responses share one user block). The sentinel makes all of
 * these the same for the history in B as in A: it is a user query when the new turns hold one (so
 * the history sees the last query after it, as in A), else a tool response (not a query, so the
 * last query stays where A has it); r's answer is then never the last message, as in A; and since
 * r's answer is an assistant turn, no tool block spans the boundary. Special tokens are never
 * merged with neighbouring text by BPE, so B's ids before the sentinel's `<|im_start|>` (the last
 * one in B) are exactly the ids of the history's rendering, H. The planner does not trust this: it
 * checks that A starts with H and that A continues with `<|im_start|>`; then A[|H|:] is the engine's
 * own rendering of the new turns and the generation prompt, token for token. Any failed check falls
 * back to rendering (the trajectory then shows an explained break rather than a wrong token).
 *
 * When is token-in used (ROLLGATE_CONTINUATION): `render` never; `token_in` whenever a base record
 * is found and the checks pass; `auto` (default) only when the engine's rendering of the history
 * (H) differs from the recorded tokens, i.e. when rendering would break the trajectory — otherwise
 * the chat route is used and gives the same prompt ids. Token-in needs the model to speak Qwen3's
 * format (the gateway parses its output with vLLM's Qwen3 reasoning + hermes tool parsers): the
 * engine's tokenizer must know `<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, `<tool_call>`,
 * `</tool_call>` as single tokens, probed once per engine. Calls that need guided decoding
 * (tool_choice "required" or a named function) and bases that were aborted are rendered.
 */

export type ContinuationMode = GatewayEnv["ROLLGATE_CONTINUATION"];

export interface TokenInPlan {
  base: CompletionRecord;
  promptIds: number[];
  maxModelLen: number | null;
  /** The engine's rendering of the history differed from the recorded tokens at this position (null: identical). */
  divergesAt: number | null;
}

export type PlanOutcome = { plan: TokenInPlan } | { plan: null; why: string };

const SENTINEL = "rollgate-continuation-sentinel";
const PROBE = "<|im_start|><|im_end|><think></think><tool_call></tool_call>";

interface SpecialIds {
  imStart: number;
  imEnd: number;
}

/** Per engine URL + model: the ChatML / Qwen3 special ids, or null when the model lacks them. */
const probes = new Map<string, Promise<SpecialIds | null>>();

function specialIds(engine: TokenInEngine, call: TokenizeCall): Promise<SpecialIds | null> {
  const key = `${call.target.engine.url}\u0000${call.model}`;
  let p = probes.get(key);
  if (!p) {
    p = engine.tokenizeText(call, PROBE).then((ids) => (ids.length === 6 ? { imStart: ids[0]!, imEnd: ids[1]! } : null));
    // A failed probe (engine down) is retried on the next call, not cached.
    p.catch(() => probes.delete(key));
    probes.set(key, p);
  }
  return p;
}

/** Qwen3's notion of a user query: a user message that is not a wrapped tool response. */
function isQuery(m: ChatMessage): boolean {
  if (m.role !== "user") return false;
  const text = typeof m.content === "string" ? m.content : m.content.map((p) => (p.type === "text" ? p.text : "")).join("\n");
  return !(text.startsWith("<tool_response>") && text.endsWith("</tool_response>"));
}

function firstDifference(a: readonly number[], b: readonly number[]): number | null {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? null : n;
}

/**
 * Decides how a call reaches the engine. `request.messages` are already restored and normalised;
 * `extended` is what `findExtendedRecord` found for them.
 */
export async function planContinuation(args: {
  mode: ContinuationMode;
  engine: TokenInEngine | undefined;
  call: TokenizeCall;
  request: CanonicalChatRequest;
  /** The full record (its token ids are the prefix), not just its head. */
  extended: ExtendedRecord<CompletionRecord> | null;
}): Promise<PlanOutcome> {
  const { mode, engine, call, request, extended } = args;
  if (mode === "render") return { plan: null, why: "ROLLGATE_CONTINUATION=render" };
  if (!engine) return { plan: null, why: `no token-in route for ${call.target.engine.kind}` };
  if (!extended) return { plan: null, why: "the call extends no recorded call" };
  const base = extended.record;
  if (base.finish_reason === "abort" || base.finish_reason === "error") return { plan: null, why: `the base call ended with ${base.finish_reason}` };
  const tc = request.tool_choice;
  if (tc === "required" || (tc !== undefined && typeof tc === "object")) return { plan: null, why: "tool_choice needs the chat route's guided decoding" };

  const ids = await specialIds(engine, call);
  if (!ids) return { plan: null, why: "the model's tokenizer does not speak Qwen3's chat format" };

  const history = request.messages.slice(0, extended.index + 1);
  const newTurns = request.messages.slice(extended.index + 1);
  const sentinel: ChatMessage = newTurns.some(isQuery)
    ? { role: "user", content: SENTINEL }
    : { role: "tool", content: SENTINEL, tool_call_id: SENTINEL };
  const [full, probe] = await Promise.all([
    engine.tokenizeChat(call, request.messages, true),
    engine.tokenizeChat(call, [...history, sentinel], false),
  ]);
  const A = full.ids;
  const B = probe.ids;
  const h = B.lastIndexOf(ids.imStart);
  if (h <= 0) return { plan: null, why: "the sentinel's turn was not found in the render" };
  for (let i = 0; i < h; i++) {
    if (A[i] !== B[i]) return { plan: null, why: `the history renders differently before the new turns (token ${i})` };
  }
  if (A[h] !== ids.imStart) return { plan: null, why: "the new turns do not start a message block" };
  const lastEnd = B.lastIndexOf(ids.imEnd, h - 1);
  if (lastEnd < 0) return { plan: null, why: "the history's last turn has no end token" };
  const glue = B.slice(lastEnd + 1, h);

  const out = base.output_ids;
  const view = [...base.prompt_ids, ...out, ...(out.at(-1) === ids.imEnd ? [] : [ids.imEnd]), ...glue];
  const divergesAt = firstDifference(A.slice(0, h), view);
  if (mode === "auto" && divergesAt === null) return { plan: null, why: "the engine's rendering reproduces the recorded tokens" };
  return { plan: { base, promptIds: [...view, ...A.slice(h)], maxModelLen: full.maxModelLen, divergesAt } };
}
