import type { SimTokenizer } from "../tokenizer.js";
import type { Snapshot, SnapshotCall } from "./snapshot.js";
import type { ParsedOutput } from "./types.js";

/**
 * gpt-oss output (the harmony format) as vLLM reads it with `--reasoning-parser openai_gptoss
 * --tool-call-parser openai`: the generated token ids are split into messages
 * `[<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY<|end|>`
 * (the last one ending with `<|call|>` or `<|return|>`). The `analysis` channel is reasoning; the
 * `final` channel and recipient-less `commentary` (preambles) are content; a message to
 * `functions.NAME` is a tool call whose arguments are its body as written. A message still open
 * (an aborted answer) counts with what it has.
 */

interface HarmonyMessage {
  channel: string;
  recipient: string | null;
  body: string;
  /** A terminator (`<|end|>`, `<|call|>`, `<|return|>`) closed it. */
  closed: boolean;
  /** `<|message|>` was seen: the header is complete. */
  started: boolean;
}

interface Markers {
  start: number;
  channel: number;
  message: number;
  terminators: Set<number>;
}

const markersOf = new WeakMap<SimTokenizer, Markers>();
function markers(tok: SimTokenizer): Markers {
  let m = markersOf.get(tok);
  if (!m) {
    const id = (s: string) => tok.tokenId(s) ?? -1;
    m = { start: id("<|start|>"), channel: id("<|channel|>"), message: id("<|message|>"), terminators: new Set([id("<|end|>"), id("<|call|>"), id("<|return|>")]) };
    markersOf.set(tok, m);
  }
  return m;
}

/** UTF-8 text of ids; without `final`, a trailing incomplete character is held back. */
function text(tok: SimTokenizer, ids: readonly number[], final: boolean): string {
  const dec = new TextDecoder("utf-8", { fatal: false });
  let out = "";
  for (const id of ids) out += dec.decode(tok.tokenBytes(id), { stream: true });
  return final ? out + dec.decode() : out;
}

function parseHeader(header: string): { channel: string; recipient: string | null } {
  const channel = /<\|channel\|>\s*([^\s<]+)/.exec(header)?.[1] ?? "";
  const recipient = /(?:^|\s)to=([^\s<]+)/.exec(header)?.[1] ?? null;
  return { channel, recipient };
}

export function harmonyMessages(tok: SimTokenizer, ids: readonly number[], final: boolean): HarmonyMessage[] {
  const mk = markers(tok);
  const out: HarmonyMessage[] = [];
  let i = 0;
  while (i < ids.length) {
    if (ids[i] === mk.start) i++;
    const headerStart = i;
    while (i < ids.length && ids[i] !== mk.message && !mk.terminators.has(ids[i]!)) i++;
    const header = tok.decode(ids.slice(headerStart, i));
    const { channel, recipient } = parseHeader(header);
    if (i >= ids.length || ids[i] !== mk.message) {
      out.push({ channel, recipient, body: "", closed: i < ids.length, started: false });
      i++;
      continue;
    }
    i++;
    const bodyStart = i;
    while (i < ids.length && !mk.terminators.has(ids[i]!)) i++;
    const closed = i < ids.length;
    out.push({ channel, recipient, body: text(tok, ids.slice(bodyStart, i), final || closed), closed, started: true });
    i++;
  }
  return out;
}

function isCall(m: HarmonyMessage): boolean {
  return m.recipient !== null && m.recipient.startsWith("functions.") && m.recipient.length > "functions.".length;
}

export function parseHarmony(tok: SimTokenizer, ids: readonly number[], toolParsing: boolean): ParsedOutput {
  const msgs = harmonyMessages(tok, ids, true).filter((m) => m.started);
  const reasoning = msgs.filter((m) => m.channel === "analysis").map((m) => m.body);
  const visible = msgs.filter((m) => !isCall(m) && (m.channel === "final" || m.channel === "commentary")).map((m) => m.body);
  const calls = toolParsing ? msgs.filter(isCall).map((m) => ({ name: m.recipient!.slice("functions.".length), arguments: m.body })) : [];
  return {
    reasoning: reasoning.length > 0 ? reasoning.join("\n") : null,
    content: visible.length > 0 && visible.join("") !== "" ? visible.join("\n") : null,
    toolCalls: calls,
    toolsCalled: calls.length > 0,
  };
}

/** What a streaming harmony parser has sent after these ids. */
export function harmonySnapshot(tok: SimTokenizer, ids: readonly number[], final: boolean, toolParsing: boolean): Snapshot {
  const msgs = harmonyMessages(tok, ids, final);
  let reasoning = "";
  let content = "";
  const calls: SnapshotCall[] = [];
  for (const m of msgs) {
    if (toolParsing && isCall(m)) {
      calls.push({ name: m.started ? m.recipient!.slice("functions.".length) : null, args: m.body });
      continue;
    }
    if (!m.started) continue;
    if (m.channel === "analysis") reasoning += (reasoning && m.body ? "\n" : "") + m.body;
    else if (!isCall(m) && (m.channel === "final" || m.channel === "commentary")) content += (content && m.body ? "\n" : "") + m.body;
  }
  return { reasoning, content, calls };
}
