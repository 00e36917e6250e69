import { createHash, hash, type Hash } from "node:crypto";
import type { AssistantOutput, CanonicalChatRequest, ChatMessage, CompletionRecord, ContentPart, RecordHead, ToolCall } from "@rollgate/protocol";

/**
 * Agents send earlier assistant turns back as they received them — or their own way — and the
 * engine renders them again through the chat template. Where the re-render differs from what the
 * engine generated, the trajectory breaks. Three layers close that gap (README "Trajectories"):
 *
 * 1. `matchEchoedHistory` / `restoreEchoedHistory` — each echoed assistant turn is matched to the
 *    session record that produced it and restored to exactly what the engine generated (content,
 *    reasoning, tool-call names and arguments; the agent's tool-call ids are kept);
 * 2. empirical normalisation (history-normalization.ts) — what the template cannot round-trip even
 *    so, learned per engine by trying a few forms of a turn against the record's own ids;
 * 3. `findExtendedRecord` — the recorded call the conversation continues, so the gateway can
 *    continue token-in from that record's own ids where the template still cannot round-trip
 *    (Qwen3 with thinking off, or reasoning dropped before a new user query).
 *
 * All pure: the records are read by the caller. They work on record heads (`recordHead`): the
 * answer, the request's message count and a hash of its conversation, so a call reads a few hundred
 * bytes per earlier call, not every earlier prompt.
 */

/** The part of a record these functions read. */
export type HeadLike = Pick<RecordHead, "message" | "message_count">;

type AssistantMessage = Extract<ChatMessage, { role: "assistant" }>;

/** Text of a message's content as vLLM's "string" content format joins it. */
function contentText(content: string | ContentPart[] | null | undefined): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content.map((p) => (p.type === "text" ? p.text : `[image:${p.image_url.url}]`)).join("\n");
}

/** JSON with sorted keys, so equal objects compare equal whatever their key order. */
function stable(v: unknown): string {
  if (v === undefined) return "null";
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(stable).join(",")}]`;
  const o = v as Record<string, unknown>;
  return `{${Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${stable(o[k])}`)
    .join(",")}}`;
}

type Tools = CanonicalChatRequest["tools"];

/**
 * A request's tools as a conversation key hashes them (sorted-key JSON, `[]` for none), with the
 * array it was made of. A call keys its conversation several times (to match its echoed turns, to
 * find the record it continues, for its own record's head): the gateway makes this once per call
 * and passes it to each, instead of each walking the tools (often most of the request's JSON) again.
 */
export interface ToolsText {
  readonly of: Tools;
  readonly text: string;
}

export function toolsText(tools: Tools): ToolsText {
  return { of: tools, text: stable(tools ?? []) };
}

/** The text of `tools`: `given`'s when it was made of this very array, else made now. */
function textOf(tools: Tools, given: ToolsText | undefined): string {
  return given && given.of === tools ? given.text : stable(tools ?? []);
}

/** Arguments compared by value: `{"a": 1}` and `{"a":1}` are the same call. */
function argsKey(args: string): string {
  try {
    return stable(JSON.parse(args));
  } catch {
    return `raw:${args}`;
  }
}

/**
 * Whether echoed arguments are the recorded call's. By value; and a recorded call whose arguments
 * are not a JSON object comes back the way an agent whose protocol carries arguments as an object
 * was given them: as `{}` when they are not JSON (cut by `max_tokens` mid-arguments; Anthropic's
 * tool_use `input`, Gemini's `args`), and as `{"value": v}` when they are the JSON `v` but not an
 * object (`5`, `[1, 2]`, `"text"`: Gemini's `args`, transforms/gemini.ts `parseArgs`).
 */
function sameArgs(echoed: string, recorded: string): boolean {
  const key = argsKey(echoed);
  if (key === argsKey(recorded)) return true;
  if (key === "{}") return !isJsonObject(recorded);
  return key.startsWith('{"value":') && wrappedValue(echoed, recorded);
}

/** Whether `echoed` is exactly `{"value": v}` (one key) and `recorded` is the JSON `v`, not an object. */
function wrappedValue(echoed: string, recorded: string): boolean {
  let wrapper: unknown;
  let v: unknown;
  try {
    wrapper = JSON.parse(echoed);
    v = JSON.parse(recorded);
  } catch {
    return false;
  }
  if (typeof wrapper !== "object" || wrapper === null || Array.isArray(wrapper)) return false;
  const keys = Object.keys(wrapper);
  if (keys.length !== 1 || keys[0] !== "value") return false;
  if (typeof v === "object" && v !== null && !Array.isArray(v)) return false;
  return stable((wrapper as { value: unknown }).value) === stable(v);
}

function isJsonObject(text: string): boolean {
  try {
    const v: unknown = JSON.parse(text);
    return typeof v === "object" && v !== null && !Array.isArray(v);
  } catch {
    return false;
  }
}

function sameCalls(echoed: readonly ToolCall[], recorded: readonly ToolCall[]): boolean {
  return (
    echoed.length === recorded.length &&
    echoed.every((c, i) => c.function.name === recorded[i]!.function.name && sameArgs(c.function.arguments, recorded[i]!.function.arguments))
  );
}

/**
 * A recorded call's arguments as an engine can take them back in a history: as recorded, except
 * arguments that are not JSON (the engine's own call cut by `max_tokens` mid-arguments, or written
 * malformed: vLLM streams such arguments as the model wrote them) go as "". vLLM and SGLang parse a
 * history call's arguments and refuse the request (400) when they do not parse, and render "" as
 * `{}`; the turn's own tokens are the record's, which a token-in continuation sends instead.
 */
function renderableArguments(args: string): string {
  if (args === "") return args;
  try {
    JSON.parse(args);
    return args;
  } catch {
    return "";
  }
}

/** The assistant message a record's answer is, as the engine generated it (arguments an engine can take back: renderableArguments). */
export function recordedAssistantMessage(record: { message: AssistantOutput }): AssistantMessage {
  const out = record.message;
  const m: AssistantMessage = { role: "assistant", content: out.content, reasoning: out.reasoning };
  if (out.tool_calls.length > 0) m.tool_calls = out.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: renderableArguments(c.function.arguments) } }));
  return m;
}

/**
 * Whether an echoed assistant message is the record's answer, serialised the agent's way: the same
 * visible text up to surrounding whitespace, the same tool calls (names, arguments by value), and
 * the same reasoning, none at all (agents drop the non-standard field), or only its end (the
 * OpenAI SDK's stream assembler keeps just the last streamed piece of a field it does not know).
 * An agent that really changed a turn (edited text, removed a call) does not match: its history is
 * its own, and a break in the trajectory is then the truth.
 */
export function echoesRecord(m: AssistantMessage, record: { message: AssistantOutput }): boolean {
  const out = record.message;
  if (contentText(m.content).trim() !== (out.content ?? "").trim()) return false;
  if (!sameCalls(m.tool_calls ?? [], out.tool_calls)) return false;
  const r = (m.reasoning ?? "").trim();
  const recorded = (out.reasoning ?? "").trim();
  return r === "" || r === recorded || (recorded.endsWith(r) && (m.reasoning ?? "").length < (out.reasoning ?? "").length);
}

/** The echoed assistant turn with the engine's own answer put back; the agent's tool-call ids are kept. */
function restore(m: AssistantMessage, record: { message: AssistantOutput }): AssistantMessage {
  const out = record.message;
  const restored: AssistantMessage = { role: "assistant", content: out.content, reasoning: out.reasoning };
  if (out.tool_calls.length > 0) {
    restored.tool_calls = out.tool_calls.map((c, i) => ({
      id: m.tool_calls?.[i]?.id ?? c.id,
      type: "function",
      function: { name: c.function.name, arguments: renderableArguments(c.function.arguments) },
    }));
  }
  return restored;
}

export interface EchoedHistory<R extends HeadLike = RecordHead> {
  /** The conversation with every matched assistant turn restored as generated. */
  messages: ChatMessage[];
  /** Per message: the record whose answer it is (assistant turns only), else null. */
  producers: (R | null)[];
}

/**
 * Matches each assistant turn of `messages` to the session record that produced it and restores
 * it. A turn is looked up by its tool-call ids first (the engine issued them and agents keep them),
 * then by content; among several candidates the latest record that answered a conversation of
 * exactly this turn's position wins, else the latest. When several records answered the same
 * words at that position (an agent and its sub-agent, in one session) and `tools` (the request's)
 * is given, the one whose conversation is this one (its head's `conversation_key`) wins first
 * (`toolsText`: the call's, when it made it; `ToolsText`).
 * Linear in the records plus the messages (a prefix is hashed only for such a tie).
 */
export function matchEchoedHistory<R extends HeadLike>(
  messages: readonly ChatMessage[],
  records: readonly R[],
  conversation?: { tools: Tools; toolsText?: ToolsText },
): EchoedHistory<R> {
  const byCallId = new Map<string, R>();
  const byText = new Map<string, R[]>();
  for (const r of records) {
    for (const c of r.message.tool_calls) if (c.id) byCallId.set(c.id, r);
    const key = (r.message.content ?? "").trim();
    const list = byText.get(key);
    if (list) list.push(r);
    else byText.set(key, [r]);
  }
  const producers: (R | null)[] = [];
  const out: ChatMessage[] = [];
  for (const [i, m] of messages.entries()) {
    if (m.role !== "assistant") {
      producers.push(null);
      out.push(m);
      continue;
    }
    let found: R | undefined;
    const ids = (m.tool_calls ?? []).map((c) => c.id);
    const byId = ids.length > 0 ? byCallId.get(ids[0]!) : undefined;
    if (byId && ids.every((id) => byCallId.get(id) === byId) && echoesRecord(m, byId)) found = byId;
    if (!found) {
      const candidates = (byText.get(contentText(m.content).trim()) ?? []).filter((r) => echoesRecord(m, r));
      // A retry answers the same position again; the agent kept the latest answer.
      const here = candidates.filter((r) => r.message_count === i);
      // The same words at the same position in another conversation of the session are not this turn.
      if (here.length > 1 && conversation) {
        const key = conversationKey(out, conversation.tools, conversation.toolsText);
        found = here.findLast((r) => (r as Partial<RecordHead>).conversation_key === key);
      }
      found ??= here.at(-1) ?? candidates.at(-1);
    }
    producers.push(found ?? null);
    out.push(found ? restore(m, found) : m);
  }
  return { messages: out, producers };
}

/** `matchEchoedHistory` without the provenance: the conversation with the engine's own answers put back. */
export function restoreEchoedHistory(messages: readonly ChatMessage[], records: readonly HeadLike[]): ChatMessage[] {
  return matchEchoedHistory(messages, records).messages;
}

/**
 * A message as the chat template sees it. Ids are left out: most templates render neither
 * tool-call ids nor tool_call_id, and agents (Gemini's) may mint their own (the continuation
 * planner re-checks the engine's renders, so a template that does render them is still safe).
 * An assistant turn's content counts without its surrounding whitespace, so a turn compares the
 * same whichever normalised form it was sent in.
 */
function messageKey(m: ChatMessage): string {
  const memo = keyMemo.get(m);
  if (memo && memoHolds(memo, m)) return memo.key;
  const key = computeMessageKey(m);
  const seen = memoOf(m, key);
  if (seen) keyMemo.set(m, seen);
  return key;
}

function computeMessageKey(m: ChatMessage): string {
  // Spelled out, the string stable() makes of the same arrays (keys are stored with records, so
  // they must not change): this runs over every message of every recorded call, and building the
  // arrays to walk them again was most of its cost on long conversations.
  switch (m.role) {
    case "system":
      return `["system",${JSON.stringify(contentText(m.content))}]`;
    case "user":
      return `["user",${JSON.stringify(contentText(m.content))},${stable(m.name ?? null)}]`;
    case "tool":
      return `["tool",${JSON.stringify(contentText(m.content))}]`;
    case "assistant": {
      let calls = "";
      for (const c of m.tool_calls ?? []) calls += `${calls ? "," : ""}[${stable(c.function.name)},${JSON.stringify(argsKey(c.function.arguments))}]`;
      return `["assistant",${JSON.stringify(contentText(m.content).trim())},${stable(m.reasoning ?? "")},[${calls}]]`;
    }
  }
}

/**
 * A message's key as computed, with every value it was computed from (each a string, null or
 * undefined). A call keys its messages when it looks for the record it continues and again when
 * its own record's head is written; the second time is a lookup, checked value by value (a
 * string compares by reference first), so a message changed in between is keyed again.
 */
interface KeyMemo {
  key: string;
  role: string;
  content: string | null | undefined;
  /** `name` of a user message, `reasoning` of an assistant one. */
  extra: string | null | undefined;
  /** An assistant message's tool calls: name, arguments, name, arguments, … */
  calls: (string | undefined)[] | null;
}
const keyMemo = new WeakMap<ChatMessage, KeyMemo>();

const plain = (v: unknown): v is string | null | undefined => v == null || typeof v === "string";

/** What `computeMessageKey` read of `m`, when all of it is plain values (else it is not memoised). */
function memoOf(m: ChatMessage, key: string): KeyMemo | null {
  if (!plain(m.content)) return null;
  const extra = m.role === "user" ? m.name : m.role === "assistant" ? m.reasoning : undefined;
  if (!plain(extra)) return null;
  let calls: (string | undefined)[] | null = null;
  if (m.role === "assistant" && m.tool_calls) {
    calls = [];
    for (const c of m.tool_calls) {
      const { name, arguments: args } = c.function;
      if (typeof name !== "string" || typeof args !== "string") return null;
      calls.push(name, args);
    }
  }
  return { key, role: m.role, content: m.content, extra, calls };
}

function memoHolds(memo: KeyMemo, m: ChatMessage): boolean {
  if (memo.role !== m.role || memo.content !== m.content) return false;
  if (memo.extra !== (m.role === "user" ? m.name : m.role === "assistant" ? m.reasoning : undefined)) return false;
  const calls = m.role === "assistant" ? m.tool_calls : undefined;
  if (!calls || !memo.calls) return !calls && !memo.calls;
  if (memo.calls.length !== 2 * calls.length) return false;
  for (let i = 0; i < calls.length; i++) {
    const f = calls[i]!.function;
    if (memo.calls[2 * i] !== f.name || memo.calls[2 * i + 1] !== f.arguments) return false;
  }
  return true;
}

/**
 * The digest `findExtendedRecord` made of a conversation's first `count` messages, by the first
 * message's object (the call's own record holds the same objects, in an array of its own when some
 * turns were normalised): that record's head's key then hashes only what follows, when the keys
 * of its first `count` messages are still those. Each part fed in turn gives the digest of their concatenation: parts
 * are "\u0000", the tools' JSON and keys, which start and end in ASCII, so no surrogate pair spans two.
 */
interface PrefixDigest {
  tools: string;
  keys: readonly string[];
  count: number;
  state: Hash;
}
const prefixDigests = new WeakMap<ChatMessage, PrefixDigest>();

/** A conversation's keys and its digest's state before its end (the tools, then each key). */
interface ConversationDigest {
  tools: string;
  keys: readonly string[];
  state: Hash;
}

/**
 * A conversation key's text is the tools' JSON, then "\u0000" and each message's key: fed to the
 * digest in turn (the same digest as the one string). `keys[from..to)` fed to `state`.
 */
function feedKeys(state: Hash, keys: readonly string[], from: number, to: number): Hash {
  for (let i = from; i < to; i++) state.update("\u0000").update(keys[i]!);
  return state;
}
const toolsDigest = (toolsText: string): Hash => createHash("sha256").update(toolsText);

function conversationDigest(messages: readonly ChatMessage[], toolsText: string): ConversationDigest {
  const keys = messages.map(messageKey);
  const prefix = messages[0] && prefixDigests.get(messages[0]);
  let state: Hash | null = null;
  let from = 0;
  // Only when the prefix it hashed is still what these messages key to (compared key by key).
  if (prefix && prefix.count <= keys.length && prefix.tools === toolsText) {
    let same = true;
    for (let i = 0; i < prefix.count && same; i++) same = prefix.keys[i] === keys[i];
    if (same) {
      state = prefix.state.copy();
      from = prefix.count;
    }
  }
  return { tools: toolsText, keys, state: feedKeys(state ?? toolsDigest(toolsText), keys, from, keys.length) };
}

/**
 * A hash of a conversation as the chat template sees it (messages by `messageKey`, and the tools,
 * which are rendered into the prompt's head). Equal keys: the engine renders the same prompt.
 * `given`: the tools' text, when the call made it (`ToolsText`).
 */
export function conversationKey(messages: readonly ChatMessage[], tools: Tools, given?: ToolsText): string {
  return conversationDigest(messages, textOf(tools, given)).state.digest("base64url");
}

/**
 * `conversationKey` of every prefix of `messages` (entry i: of messages[0..i), for i up to
 * messages.length), in one pass: feeding the parts in turn gives the same digest as one string.
 * `given` as for `conversationKey`.
 */
export function prefixConversationKeys(messages: readonly ChatMessage[], tools: Tools, given?: ToolsText): string[] {
  const keys = messages.map(messageKey);
  const state = toolsDigest(textOf(tools, given));
  const out = [state.copy().digest("base64url")];
  for (let i = 0; i < keys.length; i++) out.push(feedKeys(state, keys, i, i + 1).copy().digest("base64url"));
  return out;
}

/**
 * Conversations this process keyed for a record's head, by their key: what each message's key was
 * computed from (KeyMemo) and the digest's state before its end. The next call of the conversation
 * extends that record; where its first messages still hold those very values (compared value by
 * value: a string by reference, else character by character), their keys and digest are known
 * without a JSON of each message or a hash over the whole conversation. Bounded in bytes (the
 * texts held, counted at 2 bytes a character); the least recently used go first.
 */
interface KnownConversation {
  tools: string;
  memos: readonly KeyMemo[];
  state: Hash;
  bytes: number;
}
const knownConversations = new Map<string, KnownConversation>();
let knownBytes = 0;
const KNOWN_BUDGET_BYTES = 32 * 2 ** 20;

function rememberConversation(key: string, messages: readonly ChatMessage[], digest: ConversationDigest): void {
  const memos: KeyMemo[] = [];
  let bytes = 256 + 2 * digest.tools.length;
  for (const m of messages) {
    const memo = keyMemo.get(m);
    if (!memo || !memoHolds(memo, m)) return;
    memos.push(memo);
    bytes += 64 + 2 * (memo.key.length + (memo.content?.length ?? 0) + (memo.extra?.length ?? 0));
    for (const c of memo.calls ?? []) bytes += 2 * (c?.length ?? 0);
  }
  if (bytes > KNOWN_BUDGET_BYTES / 4) return;
  forgetConversation(key);
  knownConversations.set(key, { tools: digest.tools, memos, state: digest.state.copy(), bytes });
  knownBytes += bytes;
  for (const [k] of knownConversations) {
    if (knownBytes <= KNOWN_BUDGET_BYTES) break;
    forgetConversation(k);
  }
}

function forgetConversation(key: string): void {
  const known = knownConversations.get(key);
  if (!known) return;
  knownConversations.delete(key);
  knownBytes -= known.bytes;
}

/** Below this many characters of keys a conversation is hashed in one go and not kept: keeping it saves little. */
const KEEP_FROM_CHARS = 16 * 1024;

/**
 * The head of a record: what later calls read to restore history and find what they continue.
 * `given`: the record's tools' text, when its call made it (`ToolsText`).
 */
export function recordHead(record: CompletionRecord, given?: ToolsText): RecordHead {
  const { messages } = record.request;
  const tools = textOf(record.request.tools, given);
  let key: string;
  const keys = messages.map(messageKey);
  let chars = 0;
  for (const k of keys) chars += k.length;
  if (chars < KEEP_FROM_CHARS) {
    // One string, one digest: the same as feeding the parts in turn, at less CPU on short ones.
    let text = tools;
    for (const k of keys) text += `\u0000${k}`;
    key = hash("sha256", text, "base64url");
  } else {
    const digest = conversationDigest(messages, tools);
    key = digest.state.copy().digest("base64url");
    rememberConversation(key, messages, digest);
  }
  return {
    id: record.id,
    seq: record.seq,
    message: record.message,
    finish_reason: record.finish_reason,
    message_count: messages.length,
    conversation_key: key,
  };
}

export interface ExtendedRecord<R = RecordHead> {
  record: R;
  /** Index in the request's messages of the record's own answer; the new turns follow it. */
  index: number;
}

/**
 * The recorded call this request continues: the record whose request messages plus its own answer
 * are a prefix of the request's (restored) messages, with at least one new message after, and the
 * same tools (they are rendered into the prompt's head). The longest such prefix wins. Only turns
 * `matchEchoedHistory` attributed are candidates, so this costs one prefix comparison in practice.
 * `given`: the request's tools' text, when the call made it (`ToolsText`).
 */
export function findExtendedRecord<R extends HeadLike & Pick<RecordHead, "conversation_key">>(
  request: Pick<CanonicalChatRequest, "messages" | "tools">,
  history: Pick<EchoedHistory<R>, "producers">,
  given?: ToolsText,
): ExtendedRecord<R> | null {
  const messages = request.messages;
  let keys: string[] | undefined;
  // Made when first needed, once for every candidate.
  let tools: string | undefined;
  for (let i = messages.length - 2; i >= 1; i--) {
    const r = history.producers[i];
    if (!r || r.message_count !== i) continue;
    const known = knownConversations.get(r.conversation_key);
    if (known && known.memos.length === i && known.tools === (tools ??= textOf(request.tools, given)) && known.memos.every((memo, j) => memoHolds(memo, messages[j]!))) {
      // The record's conversation, message for message: its key is r's without hashing it again.
      if (messageKey(recordedAssistantMessage(r)) !== messageKey(messages[i]!)) continue;
      knownConversations.delete(r.conversation_key);
      knownConversations.set(r.conversation_key, known);
      for (let j = 0; j < i; j++) keyMemo.set(messages[j]!, known.memos[j]!);
      prefixDigests.set(messages[0]!, { tools: known.tools, keys: known.memos.map((memo) => memo.key), count: i, state: known.state });
      return { record: r, index: i };
    }
    keys ??= messages.map(messageKey);
    if (messageKey(recordedAssistantMessage(r)) !== keys[i]) continue;
    tools ??= textOf(request.tools, given);
    const state = feedKeys(toolsDigest(tools), keys, 0, i);
    if (state.copy().digest("base64url") === r.conversation_key) {
      prefixDigests.set(messages[0]!, { tools, keys, count: i, state });
      return { record: r, index: i };
    }
  }
  return null;
}
