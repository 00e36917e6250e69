import type { ModelProfile } from "@rollgate/models";
import type { CanonicalChatRequest, ChatMessage, CompletionRecord } from "@rollgate/protocol";
import type { ExtendedRecord } from "@rollgate/transforms";
import type { TokenInRoute } from "../engines/token-in.js";
import type { EngineTokenizer, TokenizeCall } from "../engines/tokenizer.js";
import { deriveTurnMarkers, type TurnMarkers } from "./turn-markers.js";
import type { GatewayEnv } from "../env.js";

/**
 * Token-in continuation. When a call extends a recorded one r (r's request messages + r's answer
 * are a prefix of the new conversation, after restoration), the prompt the model should see is
 *
 *     r.prompt_ids + r.output_ids [+ eot when r did not end on it] + what the template writes
 *     after r's turn (its glue and the new turns' blocks, the generation prompt last)
 *
 * The chain of recorded tokens then continues by construction, whatever the template would have
 * done to the history (Qwen3 with thinking off leaves the empty `<think>\n\n</think>\n\n` of the
 * generation prompt out of earlier turns; with thinking on, templates drop the reasoning of turns
 * before the last user query).
 *
 * Nothing about the chat format is assumed. The end-of-turn token `eot` is derived once per engine
 * from its own renders (turn-markers.ts); then, per call, three renders by the engine (`/tokenize`,
 * chat form, with the generation prompt, run in parallel):
 *   A  = the full conversation (what the chat route would send);
 *   B1 = the conversation up to and including r's answer, plus one sentinel message;
 *   B2 = the same with another sentinel text.
 * The sentinel makes the history render in B as in A: it is a user query when the new turns hold
 * one (so the history sees a later query, as in A), else a tool result (not a query, so the last
 * query stays where A has it); r's answer is never the last message, as in A. B1 and B2 first
 * differ inside the sentinel's text, so the last `eot` before that is where r's turn ends in the
 * render: B1[0..e] is the history's rendering H. The planner does not trust this: it checks that
 * the `eot` sits at most a turn header away from the sentinel and that A starts with H; then
 * A[e+1..] is the engine's own rendering of everything after r's turn, token for token. Any failed
 * check falls back to rendering (the trajectory then shows an explained break, never a wrong token).
 *
 * Renders saved in `auto` mode (same plans): A is asked for only when B says the history does not
 * reproduce the recorded tokens (or along with B, when the engine's last plan needed it); and where
 * the engine's last plan found the history reproduced, B1 alone is asked for first: when it is the
 * recorded tokens followed by exactly what a checked B1/B2 pair had after the history's end of turn
 * (the sentinel's turn and the generation prompt), the pair would find that same place, and the
 * call goes to the chat route without B2. Where the session's last plan (for its first, the
 * engine key's) kept the chat route, the call is sent there before its plan is made (chat-call.ts
 * `planning`; `expectsChatRoute`); when the engine's first chunk tells its prompt and that
 * continues the record (`promptContinues`), no render is made at all.
 *
 * When is token-in used (ROLLGATE_CONTINUATION): `render` never; `token_in` whenever a base record
 * is found and the checks pass; `auto` (default) only when the engine's rendering of the history
 * (H) differs from the recorded tokens, i.e. when rendering would break the trajectory — otherwise
 * the chat route is used and gives the same prompt ids. The route (engines/token-in.ts) is the
 * engine's chat route with a pre-tokenised prompt where it has one (its own parsers read the
 * answer), else a parser-less route where the model profile declares a gateway parser. Calls that
 * need guided decoding (tool_choice "required" or a named function) stay on chat routes, and bases
 * that were aborted are rendered.
 */

export type ContinuationMode = GatewayEnv["ROLLGATE_CONTINUATION"];

/** Token ids as a record holds them, or as the store reads them for a continuation (typed). */
export type TokenIds = readonly number[] | Int32Array;

/** What a plan reads of the record it continues: its seq and its token ids. */
export interface BaseIds {
  seq: number;
  prompt_ids: TokenIds;
  output_ids: TokenIds;
}

/** A record's prompt and output ids, then the end of turn `eot` unless the output ended on it: what a continuation of it starts with. */
export function recordedView(base: Pick<BaseIds, "prompt_ids" | "output_ids">, eot: number | null): number[] {
  const { prompt_ids: prompt, output_ids: out } = base;
  const view: number[] = [];
  for (let i = 0; i < prompt.length; i++) view.push(prompt[i]!);
  for (let i = 0; i < out.length; i++) view.push(out[i]!);
  if (eot !== null && out.at(-1) !== eot) view.push(eot);
  return view;
}

export interface TokenInPlan {
  base: BaseIds;
  promptIds: number[];
  maxModelLen: number | null;
  /** The engine's rendering of the history differed from the recorded tokens at this position (null: identical). */
  divergesAt: number | null;
}

export type PlanOutcome = { plan: TokenInPlan } | { plan: null; why: string };

const SENTINELS = ["Xq7 rollgate continuation sentinel", "Zk9 rollgate continuation sentinel"] as const;
/** How far the end of r's turn may sit from the sentinel's text: glue and one turn header. */
const MAX_HEADER_TOKENS = 24;

/** A user query by the profile's lights: a user message that is not a tool result its template wraps. */
export function isQuery(m: ChatMessage, profile: Pick<ModelProfile, "tool_result_wrappers">): boolean {
  if (m.role !== "user") return false;
  const text = typeof m.content === "string" ? m.content : m.content.map((p) => (p.type === "text" ? p.text : "")).join("\n");
  return !profile.tool_result_wrappers.some(([open, close]) => text.startsWith(open) && text.endsWith(close));
}

function firstDifference(a: readonly number[], b: readonly number[]): number | null {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? null : n;
}

function sentinel(role: "user" | "tool", text: string): ChatMessage {
  return role === "user" ? { role: "user", content: text } : { role: "tool", content: text, tool_call_id: "rollgate-sentinel" };
}

/** Per engine URL, model and template kwargs: the derived turn markers (or why there are none). */
const markerCache = new Map<string, Promise<TurnMarkers | { why: string }>>();

/**
 * The keys of these tables come from requests (an agent's template kwargs), so each is bounded:
 * past this many entries it starts over (each entry is re-derived on its next use).
 */
const MAX_ENGINE_KEYS = 4096;
function remember<V>(table: Map<string, V>, key: string, value: V): void {
  if (table.size >= MAX_ENGINE_KEYS && !table.has(key)) table.clear();
  table.set(key, value);
}

function markerKey(call: TokenizeCall): string {
  return `${call.target.engine.url}\u0000${call.model}\u0000${JSON.stringify(call.request.chat_template_kwargs ?? {})}\u0000${String(call.request.enable_thinking)}`;
}

/**
 * Per engine key (as markerCache): whether its last auto-mode plan needed the full render A (the
 * history's render differed from the recorded tokens). Only decides whether A is asked for along
 * with B or after it; never what the plan is.
 */
const lastNeededA = new Map<string, boolean>();

/**
 * Whether this engine key's last auto-mode plan found the history reproduced (the call went to the
 * chat route): a session's first planned call of this key is then sent to the chat route while its
 * plan is still being made (chat-call.ts; later calls follow the session's own last plan).
 * Unknown keys and keys whose last plan continued token-in are not, so a template that never
 * reproduces (Qwen3 with thinking off) does not pay an aborted engine call.
 */
export function expectsChatRoute(call: TokenizeCall): boolean {
  return lastNeededA.get(markerKey(call)) === false;
}

/**
 * Per engine key and sentinel role: what followed the history's end of turn in the last checked
 * pair of sentinel renders (B1's tokens after `e`: the sentinel's turn, the generation prompt).
 */
const sentinelTails = new Map<string, number[]>();

function markersFor(tokenizer: EngineTokenizer, call: TokenizeCall): Promise<TurnMarkers | { why: string }> {
  const key = markerKey(call);
  let p = markerCache.get(key);
  if (!p) {
    p = deriveTurnMarkers(tokenizer, call);
    // A failed probe (engine down) is retried on the next call, not cached.
    p.catch(() => markerCache.delete(key));
    remember(markerCache, key, p);
  }
  return p;
}

/**
 * Whether a prompt continues the recorded call `base`: it starts with base's prompt and output ids,
 * then the end of turn `eot` (unless the output ended on it), and goes on.
 */
export function continuesRecord(promptIds: readonly number[], base: BaseIds, eot: number): boolean {
  const { prompt_ids: prompt, output_ids: out } = base;
  const withEot = out.at(-1) !== eot;
  const n = prompt.length + out.length + (withEot ? 1 : 0);
  if (promptIds.length <= n) return false;
  for (let i = 0; i < prompt.length; i++) if (promptIds[i] !== prompt[i]) return false;
  for (let i = 0; i < out.length; i++) if (promptIds[prompt.length + i] !== out[i]) return false;
  return !withEot || promptIds[n - 1] === eot;
}

/**
 * Whether the engine's own prompt for a call sent to its chat route (`promptIds`, its render of the
 * whole conversation, as its answer's first chunk tells it) continues the recorded call `base`.
 * The call's trajectory then continues that record token for token, which is what an auto-mode
 * plan keeps the chat route for: no render is needed to know it.
 */
export async function promptContinues(tokenizer: EngineTokenizer, call: TokenizeCall, base: BaseIds, promptIds: readonly number[]): Promise<boolean> {
  const markers = await markersFor(tokenizer, call);
  return !("why" in markers) && continuesRecord(promptIds, base, markers.eot);
}

/**
 * Decides how a call reaches the engine. `request.messages` are already restored and normalised;
 * `extended` is what `findExtendedRecord` found for them.
 */
export async function planContinuation(args: {
  mode: ContinuationMode;
  /** The token-in route this engine offers, or null with why it has none. */
  route: TokenInRoute | null;
  noRoute?: string;
  tokenizer: EngineTokenizer;
  call: TokenizeCall;
  request: CanonicalChatRequest;
  /**
   * The recorded call the request continues: the full record (its token ids are the prefix), or
   * its head with its ids still being read (`full`: read while the engine renders).
   */
  extended: ExtendedRecord<CompletionRecord> | (ExtendedRecord<Pick<CompletionRecord, "seq" | "finish_reason">> & { full: PromiseLike<BaseIds | null> }) | null;
}): Promise<PlanOutcome> {
  const { mode, route, tokenizer, call, request, extended } = args;
  if (mode === "render") return { plan: null, why: "ROLLGATE_CONTINUATION=render" };
  if (!route) return { plan: null, why: args.noRoute ?? "the engine has no token-in route" };
  if (!extended) return { plan: null, why: "the call extends no recorded call" };
  const head = extended.record;
  if (head.finish_reason === "abort" || head.finish_reason === "error") return { plan: null, why: `the base call ended with ${head.finish_reason}` };
  const tc = request.tool_choice;
  const guided = tc === "required" || (tc !== undefined && typeof tc === "object");
  if (guided && route.parsedBy === "gateway") return { plan: null, why: "tool_choice needs the chat route's guided decoding" };

  const markers = await markersFor(tokenizer, call);
  if ("why" in markers) return { plan: null, why: markers.why };
  const { eot } = markers;

  const history = request.messages.slice(0, extended.index + 1);
  const newTurns = request.messages.slice(extended.index + 1);
  const role = newTurns.some((m) => isQuery(m, call.target.profile)) ? "user" : "tool";
  // A is only needed when the plan continues token-in. In auto mode that is when the history's
  // render differs from the recorded tokens, which B alone tells: A is rendered with B when this
  // engine's last plan needed it, else only once B says it is needed (the same renders either way).
  const key = markerKey(call);
  const renderOf = (text: string) => tokenizer.renderChat(call, [...history, sentinel(role, text)]);
  let fullRender: Promise<{ ids: number[]; maxModelLen: number | null }> | null = null;
  const renderA = () => (fullRender ??= tokenizer.renderChat(call, request.messages));
  // B2 only locates where the sentinel's turn starts. Where this engine's last plan found the
  // history reproduced and B1 ends in the very tokens a checked pair of renders had after the
  // history's end of turn (the sentinel's turn and the generation prompt), with the recorded
  // tokens before them, the pair would find the same place: the call is left to the chat route.
  const tailKey = `${key}\u0000${role}`;
  const tail = mode === "auto" && lastNeededA.get(key) === false ? sentinelTails.get(tailKey) : undefined;
  let secondRender = tail ? null : renderOf(SENTINELS[1]);
  if (!tail && (mode !== "auto" || lastNeededA.get(key) !== false)) renderA().catch(() => undefined);
  secondRender?.catch(() => undefined);
  const [b1, stored] = await Promise.all([renderOf(SENTINELS[0]), "full" in extended ? extended.full : extended.record]);
  if (!stored) return { plan: null, why: "the call extends no recorded call" };
  const base: BaseIds = stored;
  const B = b1.ids;
  const view = recordedView(base, eot);
  if (tail && B.length === view.length + tail.length && B[view.length - 1] === eot && firstDifference(B, [...view, ...tail]) === null) {
    return { plan: null, why: "the engine's rendering reproduces the recorded tokens" };
  }
  if (tail) renderA().catch(() => undefined);
  const b2 = await (secondRender ??= renderOf(SENTINELS[1]));
  const d = firstDifference(B, b2.ids);
  if (d === null || d === 0) return { plan: null, why: "the sentinel's turn was not found in the render" };
  const e = B.lastIndexOf(eot, d - 1);
  if (e < 0) return { plan: null, why: "the history's last turn has no end token" };
  if (d - e - 1 > MAX_HEADER_TOKENS) return { plan: null, why: "the end of the history's last turn is not next to the new turn" };
  remember(sentinelTails, tailKey, B.slice(e + 1));

  const divergesAt = firstDifference(B.slice(0, e + 1), view);
  if (mode === "auto") remember(lastNeededA, key, divergesAt !== null);
  if (mode === "auto" && divergesAt === null) return { plan: null, why: "the engine's rendering reproduces the recorded tokens" };
  const full = await renderA();
  const A = full.ids;
  for (let i = 0; i <= e; i++) {
    if (A[i] !== B[i]) return { plan: null, why: `the history renders differently before the new turns (token ${i})` };
  }
  if (A.length <= e + 1) return { plan: null, why: "the render has nothing after the history" };
  return { plan: { base, promptIds: [...view, ...A.slice(e + 1)], maxModelLen: full.maxModelLen, divergesAt } };
}
