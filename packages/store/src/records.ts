import { hash as digest } from "node:crypto";
import { CompletionRecord } from "@rollgate/protocol";
import { parseStored } from "./json.js";

/**
 * How a completion record is stored in its session's `records` hash (one field per seq).
 *
 * Format 1 (the first one, still read): the record's JSON. It starts with `{`.
 *
 * Format 2: binary, starting with the byte 0x02.
 *
 *   0x02, the base's seq in ASCII decimal (empty: no base), ";"
 *   u32le J, J bytes of JSON: { i: the record's id, d?: Delta, r: the rest of the record without
 *               its three arrays, its request holding only what the base lacks }
 *   u32le P, u32le O, u8 W (4 or 8)
 *   P × i32le   the prompt's ids after the prefix taken from the base
 *   O × i32le   output ids
 *   O × W-byte little-endian floats   output logprobs (float32 when every one of the record's
 *               values is exactly a float32, as vLLM's and SGLang's are; else float64: always exact)
 *
 * A record extends a base: an earlier-written record of the same session. `d.p` ids of the base's
 * `prompt_ids ++ output_ids` start its prompt, `d.m` of the base's request messages start its
 * messages, `d.r` says the request's other fields (sampling, tools, …) are the base's, and `d.e`
 * lists the echoed turns that are the base's answer. Only what is new is stored, so a
 * conversation of n calls costs its tokens once, not n times.
 * The base's seq sits in ASCII at the front so a Lua script can follow the chain (RECORD_CHAIN_SCRIPT).
 */
export const RECORD_FORMAT_2 = 0x02;

interface Delta {
  /** Ids taken from the base's prompt ++ output. */
  p: number;
  /** Messages taken from the base's request. */
  m: number;
  /** 1: the request's fields besides messages are the base's. */
  r: 0 | 1;
  /**
   * Echoed answers: [index among the stored messages, field, field of the base's answer] for each
   * assistant message's `content`, `reasoning` or `tool_calls` that is the base's answer's (stored as null).
   */
  e?: [number, EchoField, EchoField][];
}

type EchoField = "content" | "reasoning" | "tool_calls";
const TEXT_FIELDS = ["content", "reasoning"] as const;
/** Shorter echoes are not worth a reference. */
const MIN_ECHO = 16;

/** What the store remembers of a written record to delta the next ones against it. */
export interface BaseCandidate {
  seq: number;
  /** The record's id (checked when a record extending it is written). */
  id: string;
  /** prompt_ids ++ output_ids */
  ids: Int32Array;
  /** How many of `ids` are the prompt's. */
  promptLength: number;
  /** A hash of each request message's JSON (`messageHash`). */
  messages: string[];
  /** A hash of the request's other fields' JSON. */
  rest: string;
  /** Its answer (tool calls as JSON), which the next call of its conversation usually echoes. */
  answer: { content: string | null; reasoning: string | null; tool_calls: string | null };
}

// One-shot digests: about half the CPU of createHash().update().digest() on short strings.
const hash = (s: string) => digest("sha1", s, "base64");

/**
 * A hash of a request message, equal for two messages exactly when their JSON is (what a delta's
 * `m` counts, so it must not say equal where the JSON differs). Remembered in memory only, never
 * stored. Hashed from `fingerprint`, not from the JSON: the JSON of a long message costs a scan
 * for characters to escape and a copy, more than hashing the text itself.
 */
export function messageHash(m: unknown): string {
  return hash(fingerprint(m));
}

// Whether a string has no lone surrogate, its UTF-8 then being its own (String.prototype.isWellFormed,
// Node 20; free for one-byte strings; not in the ES2023 lib's types).
const wellFormed = (s: string) => (s as unknown as { isWellFormed(): boolean }).isWellFormed();

/**
 * A string that determines `v`'s JSON and is determined by it, as JSON.stringify sees values:
 * strings length-prefixed (text without surrogate halves as is, else its JSON, so the digest's
 * UTF-8 never merges two strings), numbers, booleans and null as their JSON, arrays counted, object
 * keys in their order and without the ones JSON leaves out. Anything else (a toJSON, a class) is
 * its own JSON, length-prefixed. JSON.stringify's errors (a BigInt) are thrown as they were.
 */
function fingerprint(v: unknown): string {
  if (typeof v === "string") return wellFormed(v) ? `s${v.length}:${v}` : `j${JSON.stringify(v)}`;
  if (v === null || typeof v !== "object") return `p${JSON.stringify(v) ?? "null"};`;
  const proto = Object.getPrototypeOf(v) as unknown;
  if (typeof (v as { toJSON?: unknown }).toJSON === "function" || !(Array.isArray(v) ? proto === Array.prototype : proto === Object.prototype || proto === null)) {
    const json = JSON.stringify(v);
    return `o${json.length}:${json}`;
  }
  if (Array.isArray(v)) {
    let out = `[${v.length}`;
    // A hole, undefined, a function or a symbol: "pnull;", as JSON writes null.
    for (let i = 0; i < v.length; i++) out += fingerprint(v[i]);
    return `${out}]`;
  }
  let out = "{";
  const o = v as Record<string, unknown>;
  for (const k of Object.keys(o)) {
    const x = o[k];
    if (x === undefined || typeof x === "function" || typeof x === "symbol") continue;
    out += `${wellFormed(k) ? `k${k.length}:${k}` : `K${JSON.stringify(k)}`}${fingerprint(x)}`;
  }
  return `${out}}`;
}

const INT32_MIN = -(2 ** 31);
const INT32_MAX = 2 ** 31 - 1;

/** Whether every value is an integer that fits an int32 (format 2 stores ids so). */
function allInt32(ids: readonly number[]): boolean {
  for (const x of ids) if (!Number.isInteger(x) || x < INT32_MIN || x > INT32_MAX) return false;
  return true;
}

/** Whether every value is exactly a float32 (format 2 then stores the logprobs in 4 bytes each). */
function allFloat32(xs: readonly number[]): boolean {
  for (let i = 0; i < xs.length; i++) if (Math.fround(xs[i]!) !== xs[i]) return false;
  return true;
}

function commonPrefix(a: Int32Array, b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

function commonCount(a: readonly string[], b: readonly string[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

export interface Encoded {
  value: Buffer | string;
  /** What to remember of this record as a base for later ones (null when it was stored as JSON). */
  candidate: BaseCandidate | null;
  /** The base it extends when its prompt holds all of the base's ids: the base is then superseded. */
  supersedes: number | null;
  /** The base it extends and text only that record holds (its id as stored), to check it still is. */
  base: { seq: number; holds: string } | null;
}

/**
 * Encodes a record in format 2, as a delta of the candidate that shares the longest prompt prefix
 * with it. Falls back to format 1 (JSON) for ids that are not int32 (never seen from an engine).
 */
export function encodeRecord(record: CompletionRecord, bases: readonly BaseCandidate[]): Encoded {
  const { prompt_ids, output_ids, output_logprobs, ...rest } = record;
  if (!allInt32(prompt_ids) || !allInt32(output_ids) || output_logprobs.length !== output_ids.length) {
    return { value: JSON.stringify(record), candidate: null, supersedes: null, base: null };
  }
  const { messages, ...requestRest } = rest.request;
  const messageHashes = messages.map(messageHash);
  const restHash = hash(JSON.stringify(requestRest));

  // The first candidate (in the list's order) with the longest common prefix. A candidate with no
  // more ids than the best prefix so far cannot beat it, and once the whole prompt is matched none
  // can: neither is compared (a session holds up to 16 candidates, often sharing the whole prompt).
  let base: BaseCandidate | null = null;
  let p = 0;
  for (const c of bases) {
    if (p === prompt_ids.length) break;
    if (c.seq === record.seq || c.ids.length <= p) continue;
    const n = commonPrefix(c.ids, prompt_ids);
    if (n > p) {
      p = n;
      base = c;
    }
  }
  let delta: Delta | null = null;
  if (base) delta = { p, m: commonCount(base.messages, messageHashes), r: base.rest === restHash ? 1 : 0 };

  // The record's JSON part: its request keeps only the messages (and fields) the base lacks, and
  // of those no copy of the base's answer.
  let kept = delta ? messages.slice(delta.m) : messages;
  if (delta && base) {
    const echoes: NonNullable<Delta["e"]> = [];
    kept = kept.map((m, i) => {
      if (m.role !== "assistant") return m;
      let copy: Record<string, unknown> | null = null;
      const echo = (f: EchoField, src: EchoField) => {
        copy ??= { ...m };
        copy[f] = null;
        echoes.push([i, f, src]);
      };
      for (const f of TEXT_FIELDS) {
        const v = m[f];
        if (typeof v !== "string" || v.length < MIN_ECHO) continue;
        const src = TEXT_FIELDS.find((g) => base.answer[g] === v);
        if (src) echo(f, src);
      }
      if (m.tool_calls?.length && base.answer.tool_calls && JSON.stringify(m.tool_calls) === base.answer.tool_calls) echo("tool_calls", "tool_calls");
      return (copy ?? m) as typeof m;
    });
    if (echoes.length) delta.e = echoes;
  }
  const request = { messages: kept, ...(delta?.r ? {} : requestRest) };
  // The record's id first (the append script checks a base by it), then the delta and the rest.
  const { id, ...others } = rest;
  const meta = `${idTag(id)}${delta ? `"d":${JSON.stringify(delta)},` : ""}"r":${JSON.stringify({ ...others, request })}}`;

  const suffix = prompt_ids.length - p;
  const out = output_ids.length;
  // prompt ++ output: what later records compare against, and from `p` on what this one stores.
  const ids = new Int32Array(prompt_ids.length + out);
  ids.set(prompt_ids);
  ids.set(output_ids, prompt_ids.length);
  const lps = allFloat32(output_logprobs) ? new Float32Array(output_logprobs) : new Float64Array(output_logprobs);
  const headText = `\x02${base ? base.seq : ""};`;
  const metaLen = Buffer.byteLength(meta);
  const stored = littleEndian(ids.subarray(p));
  const lpBytes = littleEndian(lps);
  // One buffer, written in place (not a head concatenated with the arrays: one copy less).
  const buf = Buffer.allocUnsafe(headText.length + 4 + metaLen + 9 + stored.length + lpBytes.length);
  let o = buf.write(headText, 0, "latin1");
  o = buf.writeUInt32LE(metaLen, o);
  o += buf.write(meta, o, "utf8");
  o = buf.writeUInt32LE(suffix, o);
  o = buf.writeUInt32LE(out, o);
  o = buf.writeUInt8(lps.BYTES_PER_ELEMENT, o);
  o += stored.copy(buf, o);
  lpBytes.copy(buf, o);

  const supersedes = base && p === base.ids.length ? base.seq : null;
  const answer = {
    content: record.message.content,
    reasoning: record.message.reasoning,
    tool_calls: record.message.tool_calls.length ? JSON.stringify(record.message.tool_calls) : null,
  };
  return {
    value: buf,
    candidate: { seq: record.seq, id: record.id, ids, promptLength: prompt_ids.length, messages: messageHashes, rest: restHash, answer },
    supersedes,
    base: base ? { seq: base.seq, holds: idTag(base.id) } : null,
  };
}

/** How the JSON part of a record of format 2 starts: its id, which nothing else there can precede. */
function idTag(id: string): string {
  return `{"i":${JSON.stringify(id)},`;
}

/** The seq of the record a stored value extends, or null (format 1, or format 2 without a base). */
export function baseOf(raw: Buffer): number | null {
  if (raw[0] !== RECORD_FORMAT_2) return null;
  const end = raw.indexOf(0x3b /* ; */, 1);
  if (end <= 1) return null;
  return Number(raw.toString("latin1", 1, end));
}

// The record's fields besides the arrays, checked as the whole record was before.
const RecordWithoutIds = CompletionRecord.omit({ prompt_ids: true, output_ids: true, output_logprobs: true });
const FIELD_ORDER = Object.keys(CompletionRecord.shape) as (keyof CompletionRecord)[];

/**
 * Decodes stored records (format 1 or 2) into full CompletionRecords. `raw` must hold every base
 * the wanted records extend (transitively); each record is decoded once however many extend it.
 * Only the wanted records are checked against the schema (what a base gives a wanted record is
 * checked as part of it), so reading one record of a long chain costs one parse, not one per base.
 * `what` names the session in errors.
 */
export function decodeRecords(raw: ReadonlyMap<number, Buffer>, wanted: readonly number[], what: string): Map<number, CompletionRecord> {
  const done = new Map<number, Decoded>();
  const check = new Set(wanted);
  const decodeOne = (seq: number): CompletionRecord => {
    const chain = baseChain(raw, seq, done, what);
    for (let i = chain.length - 1; i >= 0; i--) {
      const s = chain[i]!;
      done.set(s, decodeValue(raw.get(s)!, done, `record ${s} of ${what}`, check.has(s)));
    }
    const got = done.get(seq)!;
    // A record decoded as a base of an earlier wanted one and wanted itself too.
    if (!got.checked) done.set(seq, decodeValue(raw.get(seq)!, done, `record ${seq} of ${what}`, true));
    return done.get(seq)!.record;
  };
  const out = new Map<number, CompletionRecord>();
  for (const seq of wanted) out.set(seq, decodeOne(seq));
  return out;
}

/**
 * `seq` and the records it is a delta of, down to the first one already decoded (in `done`) or
 * with no base: decoded from the end back. A missing base or a cycle is an error naming the record.
 */
function baseChain(raw: ReadonlyMap<number, Buffer>, seq: number, done: ReadonlyMap<number, Decoded>, what: string): number[] {
  const chain: number[] = [];
  const seen = new Set<number>();
  let at: number | null = seq;
  while (at !== null && !done.has(at)) {
    if (seen.has(at)) throw new Error(`stored record ${seq} of ${what}: its bases form a cycle`);
    const value = raw.get(at);
    if (!value) throw new Error(`stored record ${chain.at(-1) ?? seq} of ${what} extends record ${at}, which is missing`);
    chain.push(at);
    seen.add(at);
    at = baseOf(value);
  }
  return chain;
}

/**
 * A decoded record. `checked`: it went through the schema and has its arrays; otherwise it is a
 * base read only for what it gives the records extending it (its request, its answer and `ids`).
 */
interface Decoded {
  record: CompletionRecord;
  checked: boolean;
  /** prompt ++ output, when it is of format 2 (records of format 1 are never bases). */
  ids: Int32Array | null;
  /** How many of `ids` are the prompt's (format 2). */
  promptLength?: number;
}

/**
 * Only the prompt and output ids of the record `seq` (what a token-in continuation needs), as
 * typed arrays of their own: its chain is decoded as bases are, without the schema pass over its
 * request or its logprobs, nor a JS array built of ids that are only compared. A record of format
 * 1 is decoded whole. `raw` as for decodeRecords.
 */
export function decodeRecordIds(raw: ReadonlyMap<number, Buffer>, seq: number, what: string): { prompt_ids: Int32Array; output_ids: Int32Array } {
  const own = raw.get(seq);
  if (!own) throw new Error(`stored record ${seq} of ${what} is missing`);
  if (own[0] !== RECORD_FORMAT_2) {
    const { prompt_ids, output_ids } = decodeRecords(raw, [seq], what).get(seq)!;
    return { prompt_ids: Int32Array.from(prompt_ids), output_ids: Int32Array.from(output_ids) };
  }
  const done = new Map<number, Decoded>();
  const chain = baseChain(raw, seq, done, what);
  for (let i = chain.length - 1; i >= 0; i--) {
    const s = chain[i]!;
    done.set(s, decodeValue(raw.get(s)!, done, `record ${s} of ${what}`, false));
  }
  const { ids, promptLength } = done.get(seq)!;
  return { prompt_ids: ids!.slice(0, promptLength), output_ids: ids!.slice(promptLength) };
}

function decodeValue(raw: Buffer, decoded: ReadonlyMap<number, Decoded>, what: string, validate: boolean): Decoded {
  if (raw[0] !== RECORD_FORMAT_2) return { record: parseStored(CompletionRecord, raw.toString("utf8"), what), checked: true, ids: null };
  try {
    const baseSeq = baseOf(raw);
    const base = baseSeq === null ? null : decoded.get(baseSeq)!;
    let o = raw.indexOf(0x3b, 1) + 1;
    const metaLen = raw.readUInt32LE(o);
    o += 4;
    const meta = JSON.parse(raw.toString("utf8", o, o + metaLen)) as { i: string; d?: Delta; r: Record<string, unknown> & { request: Record<string, unknown> } };
    meta.r.id = meta.i;
    o += metaLen;
    const suffix = raw.readUInt32LE(o);
    const out = raw.readUInt32LE(o + 4);
    const lpWidth = raw.readUInt8(o + 8);
    o += 9;
    if (o + 4 * (suffix + out) + lpWidth * out !== raw.length) throw new Error("its length does not match its counts");
    if (lpWidth !== 4 && lpWidth !== 8) throw new Error(`unknown logprob width ${lpWidth}`);
    const d = meta.d ?? { p: 0, m: 0, r: 0 };
    if (d.p > 0 || d.m > 0 || d.r || d.e) {
      if (!base) throw new Error("it has a delta but no base");
      if (!base.ids) throw new Error("its base is of format 1");
      if (d.p > base.ids.length || d.m > base.record.request.messages.length) throw new Error("its delta is longer than its base");
    }
    // prompt ++ output: the base's first `p` ids, then the stored ones (typed copies: a chain of
    // bases costs a memcpy per base, not a loop).
    const ids = new Int32Array(d.p + suffix + out);
    if (base?.ids && d.p > 0) ids.set(base.ids.subarray(0, d.p));
    fromLittleEndian(ids.subarray(d.p), raw.subarray(o, (o += 4 * (suffix + out))));

    const stored = meta.r.request as { messages: Record<string, unknown>[] } & Record<string, unknown>;
    const { messages: own, ...ownRest } = stored;
    for (const [i, f, src] of d.e ?? []) {
      if (!base || !own[i] || own[i][f] !== null) throw new Error("it echoes an answer it has no place for");
      own[i][f] = base.record.message[src];
    }
    const request = {
      messages: d.m > 0 ? [...base!.record.request.messages.slice(0, d.m), ...own] : own,
      ...(d.r ? requestRest(base!.record.request) : ownRest),
    };
    // A base that is not wanted itself is used as stored: what it gives a wanted record is checked there.
    if (!validate) return { record: { ...meta.r, request } as unknown as CompletionRecord, checked: false, ids, promptLength: d.p + suffix };

    const lps = lpWidth === 4 ? new Float32Array(out) : new Float64Array(out);
    fromLittleEndian(lps, raw.subarray(o));
    // Plain packed arrays, as JSON.parse gives them (the builders read them token by token).
    const promptLength = d.p + suffix;
    const prompt_ids: number[] = [];
    for (let i = 0; i < promptLength; i++) prompt_ids.push(ids[i]!);
    const output_ids: number[] = [];
    for (let i = promptLength; i < ids.length; i++) output_ids.push(ids[i]!);
    const output_logprobs: number[] = [];
    // `+ 0` turns -0 into 0, as format 1's JSON did.
    for (let i = 0; i < out; i++) output_logprobs.push(lps[i]! + 0);

    const rest = RecordWithoutIds.safeParse({ ...meta.r, request });
    if (!rest.success) throw new Error(`it does not match its schema: ${rest.error.message}`);
    const full = { ...rest.data, prompt_ids, output_ids, output_logprobs } as Record<string, unknown>;
    // The keys in the schema's order, as a parse of the whole record gives them.
    const ordered: Record<string, unknown> = {};
    for (const k of FIELD_ORDER) if (full[k] !== undefined) ordered[k] = full[k];
    return { record: ordered as CompletionRecord, checked: true, ids };
  } catch (err) {
    throw new Error(`stored ${what} is corrupt: ${(err as Error).message}`);
  }
}

const BIG_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 0;

/** The typed array's bytes, little-endian (a view when the machine is, a swapped copy when not). */
function littleEndian(a: Int32Array | Float32Array | Float64Array): Buffer {
  const bytes = Buffer.from(a.buffer, a.byteOffset, a.byteLength);
  if (!BIG_ENDIAN) return bytes;
  const copy = Buffer.from(bytes);
  return a.BYTES_PER_ELEMENT === 8 ? copy.swap64() : copy.swap32();
}

/** Fills `into` from little-endian bytes (copied, since a reply's bytes need not be aligned). */
function fromLittleEndian(into: Int32Array | Float32Array | Float64Array, bytes: Buffer): void {
  const target = Buffer.from(into.buffer, into.byteOffset, into.byteLength);
  bytes.copy(target);
  if (BIG_ENDIAN) void (into.BYTES_PER_ELEMENT === 8 ? target.swap64() : target.swap32());
}

function requestRest(request: CompletionRecord["request"]): Omit<CompletionRecord["request"], "messages"> {
  const { messages: _m, ...rest } = request;
  return rest;
}

/**
 * The records this process wrote lately, per session, as bases for the next ones: the last record
 * of each of the session's conversations (an agent and its sub-agents interleave them; a record
 * that holds all of its base's ids replaces it), a few per session, within a byte budget over all
 * sessions (least recently written sessions go first). Only an optimisation: a record whose
 * base is not here (another replica wrote it, the budget dropped it) is stored whole, and every
 * candidate is a record already in Redis, so nothing here can make a stored record unreadable.
 */
export class RecordBases {
  private readonly sessions = new Map<string, BaseCandidate[]>();
  private bytes = 0;
  constructor(
    private readonly perSession = 16,
    private readonly budgetBytes = 64 * 2 ** 20,
  ) {}

  of(sid: string): readonly BaseCandidate[] {
    return this.sessions.get(sid) ?? [];
  }

  /**
   * The record `seq` of the session, when this process wrote it and still remembers it, and it is
   * the record `id` (record ids are unique: a session deleted and made again under its id, by
   * this process or another, has records of other ids). What it holds is what was stored: a
   * record is written once, under a seq no other call takes.
   */
  find(sid: string, seq: number, id: string): BaseCandidate | null {
    const list = this.sessions.get(sid);
    if (!list) return null;
    for (let i = list.length - 1; i >= 0; i--) {
      const c = list[i]!;
      if (c.seq === seq) return c.id === id ? c : null;
    }
    return null;
  }

  add(sid: string, c: BaseCandidate, supersedes: number | null = null): void {
    const list = this.sessions.get(sid) ?? [];
    this.sessions.delete(sid); // re-inserted last: the Map's order is the eviction order
    const old = supersedes === null ? -1 : list.findIndex((x) => x.seq === supersedes);
    if (old >= 0) this.bytes -= size(list.splice(old, 1)[0]!);
    list.push(c);
    this.bytes += size(c);
    while (list.length > this.perSession) this.bytes -= size(list.shift()!);
    this.sessions.set(sid, list);
    for (const [other, l] of this.sessions) {
      if (this.bytes <= this.budgetBytes || other === sid) break;
      this.drop(other, l);
    }
  }

  drop(sid: string, list = this.sessions.get(sid)): void {
    if (!list) return;
    for (const c of list) this.bytes -= size(c);
    this.sessions.delete(sid);
  }

  /** Bytes held (ids and hashes), for tests. */
  get heldBytes(): number {
    return this.bytes;
  }
}

const size = (c: BaseCandidate) => c.ids.byteLength + 40 * (c.messages.length + 1) + 64;
