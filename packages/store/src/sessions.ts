import { hash } from "node:crypto";
import { secretsEqual, Session, type CompletionRecord, LostCall, RecordHead, ReplayDiverged, type CreateSessionRequest } from "@rollgate/protocol";
import type { RedisClient } from "./client.js";
import { parseStored } from "./json.js";
import { keys, type Keys } from "./keys.js";
import { decodeRecordIds, decodeRecords, encodeRecord, RecordBases, type Encoded } from "./records.js";
import { scriptCommands, type LuaScript } from "./scripts.js";
import { FIT_HOLD_SCRIPT, HOLD_TOKENS_SCRIPT, holdArgs, parseHoldAnswer, type HoldAnswer, type HoldRequest } from "./token-holds.js";

export type SessionAssignment = NonNullable<Session["assignment"]>;

/** What an agent call needs in one round trip: the session, its token hash and its routing. */
export interface SessionForCall {
  session: Session;
  tokenHash: string;
  /** The call's sequence number, when it was asked for (`takeSeq`) and taken in the same step. */
  seq?: number;
}

export function hashToken(token: string): string {
  return hash("sha256", token, "hex");
}

export function tokenMatches(token: string, storedHash: string): boolean {
  // The digest as bytes straight away (not hex, then decoded back): this runs on every agent call.
  return secretsEqual(hash("sha256", token, "buffer"), Buffer.from(storedHash, "hex"));
}

/**
 * How long a session id closed before it was opened stays unopenable. Its attempt was taken over
 * (or its task cancelled) while its worker had not opened it yet; that worker, stalled, may open
 * it any time later. Bounded so ids closed at random do not pile up for good.
 */
const CLOSED_UNOPENED_TTL_S = 7 * 24 * 3600;

// Creates a session unless its id is taken (0) or was closed before it was opened (-1), in one
// step. KEYS: session, closed-unopened mark. ARGV: token hash, then the other fields as name,
// value pairs.
const CREATE_SCRIPT: LuaScript = {
  name: "rollgateSessionCreate",
  numberOfKeys: 2,
  lua: `
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
if redis.call('HSETNX', KEYS[1], 'token_hash', ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
`,
};

// Closes an open session in one step and returns the rank it held, so a double close never frees
// the slot twice. A closed session fits no more calls: its token holds (HOLDS) go. KEYS: session,
// token holds. ARGV: closed_at.
const CLOSE_SCRIPT: LuaScript = {
  name: "rollgateSessionClose",
  numberOfKeys: 2,
  lua: `
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return false end
redis.call('HSET', KEYS[1], 'state', 'closed', 'closed_at', ARGV[1])
redis.call('DEL', KEYS[2])
return redis.call('HGET', KEYS[1], 'rank_member') or ''
`,
};

// Closes the session if it is open and answers it as it now is, in one step: [1 when this call
// closed it, the rank it held ('' if none), its fields as HGETALL lists them]; nil when there is
// no such session. A fourth element: how many of its calls are pending (PENDING) as it closes.
// With ARGV[2] "1" and none pending (its records and failed-call notes are final then), also its
// records (HGETALL) and its failed-call notes (LRANGE) as a fifth and sixth: a trajectory asked
// for with the close needs no read of its own.
// Its token holds (HOLDS) go. A session id closed before anything was opened under it is marked
// so (KEYS[6]): an attempt taken over before its stalled worker opened its session must not open
// it later. KEYS: session, pending calls, records, failures, token holds, closed-unopened mark.
// ARGV: closed_at, "1" for the records or "", the mark's ttl.
const CLOSE_AND_GET_SCRIPT: LuaScript = {
  name: "rollgateSessionCloseAndGet",
  numberOfKeys: 6,
  lua: `
if not redis.call('HGET', KEYS[1], 'static') then
  redis.call('SET', KEYS[6], ARGV[1], 'EX', ARGV[3])
  return false
end
local closed = 0
local member = ''
if redis.call('HGET', KEYS[1], 'state') == 'open' then
  redis.call('HSET', KEYS[1], 'state', 'closed', 'closed_at', ARGV[1])
  redis.call('DEL', KEYS[5])
  closed = 1
  member = redis.call('HGET', KEYS[1], 'rank_member') or ''
end
local pending = redis.call('ZCARD', KEYS[2])
if ARGV[2] == '1' and pending == 0 then
  return {closed, member, redis.call('HGETALL', KEYS[1]), pending, redis.call('HGETALL', KEYS[3]), redis.call('LRANGE', KEYS[4], 0, -1)}
end
return {closed, member, redis.call('HGETALL', KEYS[1]), pending}
`,
};

/** A failed LLM call's note on its session (the trajectory's stats list them). */
export interface FailedCallNote {
  seq: number;
  at: string;
  kind: string;
  message: string;
  dp_rank: number;
}

// A session's hash and, when ARGV[1] is "1" and the session is open, the next sequence number
// taken in the same step (as a last pair, "#seq" and the number) and marked pending until its
// record is appended or the call ends without one (see PENDING below). No number is taken for a
// session that does not exist (the increment would make its hash again) or is closed, nor when
// ARGV[2] is a token hash that is not the session's (a session deleted and made again under its
// id since the caller checked the token: that call is refused, and must not use up a number).
// KEYS: session, pending calls. ARGV: "1" to take a number, the token hash checked or "".
const FOR_CALL_SCRIPT: LuaScript = {
  name: "rollgateSessionForCall",
  numberOfKeys: 2,
  lua: `
local h = redis.call('HGETALL', KEYS[1])
if ARGV[1] == '1' and redis.call('HGET', KEYS[1], 'state') == 'open' and (ARGV[2] == '' or redis.call('HGET', KEYS[1], 'token_hash') == ARGV[2]) then
  local seq = redis.call('HINCRBY', KEYS[1], 'next_seq', 1) - 1
  redis.call('ZADD', KEYS[2], seq, seq)
  h[#h + 1] = '#seq'
  h[#h + 1] = tostring(seq)
end
return h
`,
};

// PENDING: every call's sequence number is in the session's pending set from when it is taken
// until its record is stored (APPEND_RECORD_SCRIPT) or the call ends without one (settleCall). The
// agent is answered before its record is stored; whoever must see every record (close, trajectory)
// waits until the set is empty, on any replica. Takes the next number and marks it pending, only
// while the session is open (-1 otherwise): a close reads the pending set in the step that closes,
// so a number taken after it would be a call that close neither waited for nor counted (and the
// increment would make a deleted session's hash again). KEYS: session, pending calls.
const NEXT_SEQ_SCRIPT: LuaScript = {
  name: "rollgateSessionNextSeq",
  numberOfKeys: 2,
  lua: `
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return -1 end
local seq = redis.call('HINCRBY', KEYS[1], 'next_seq', 1) - 1
redis.call('ZADD', KEYS[2], seq, seq)
return seq
`,
};

// Stores a completion record and its head and adds its usage to the session's counters, in one
// step. A record stored as a delta of a base (records.ts) is written only if the base is still the
// record it was encoded against (a session deleted and made again under its id has other records):
// else nothing is written and 0 returned. The call stops being pending (PENDING) once its record
// is stored, and its token hold (HOLDS) goes: its tokens are in the counts now. KEYS: records,
// record heads, session, pending calls, token holds. ARGV: seq, record,
// head json, prompt, completion and cached tokens, base seq or "", how the base's JSON part starts
// (its id; it follows the format byte, the base's own base seq, ";" and 4 bytes of length), the
// hash of the token the call was authorised with or "": with one, nothing is written (-1) unless
// the session still has that token (a session deleted while the call ran, or made again under its
// id for another rollout, must not get the record, the counts, nor lose a pending mark of its own).
const APPEND_RECORD_SCRIPT: LuaScript = {
  name: "rollgateSessionAppendRecord",
  numberOfKeys: 5,
  lua: `
if ARGV[9] ~= '' and redis.call('HGET', KEYS[3], 'token_hash') ~= ARGV[9] then return -1 end
if ARGV[7] ~= '' then
  local base = redis.call('HGET', KEYS[1], ARGV[7])
  if not base or string.byte(base, 1) ~= 2 then return 0 end
  local semi = string.find(base, ';', 2, true)
  if not semi or string.sub(base, semi + 5, semi + 4 + #ARGV[8]) ~= ARGV[8] then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'llm_calls', 1)
redis.call('HINCRBY', KEYS[3], 'prompt_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[3], 'completion_tokens', ARGV[5])
redis.call('HINCRBY', KEYS[3], 'cached_tokens', ARGV[6])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return 1
`,
};

// A record and every record it extends (records.ts, format 2), in one step: [seq, value, seq,
// value, …] from the asked one down. The base's seq is the ASCII between the format byte and ";".
// KEYS: records. ARGV: seq.
const RECORD_CHAIN_SCRIPT: LuaScript = {
  name: "rollgateSessionRecordChain",
  numberOfKeys: 1,
  lua: `
local out = {}
local seq = ARGV[1]
local left = redis.call('HLEN', KEYS[1])
while seq and left > 0 do
  local v = redis.call('HGET', KEYS[1], seq)
  if not v then break end
  out[#out + 1] = seq
  out[#out + 1] = v
  left = left - 1
  seq = string.match(v, '^\\2(%d+);')
end
return out
`,
};

// Counts lost calls on a session and keeps the first cause. An unverified note (from a call that
// could not be authenticated while Redis was away) carries the hash of the token it presented and
// is written only if that token is the session's. KEYS: session. ARGV: count, first cause json,
// token hash or "". Returns 1, or 0 when there is no such session (or the token is not its own).
const LOST_CALL_SCRIPT: LuaScript = {
  name: "rollgateSessionLostCalls",
  numberOfKeys: 1,
  lua: `
local hash = redis.call('HGET', KEYS[1], 'token_hash')
if not hash then return 0 end
if ARGV[3] ~= '' and ARGV[3] ~= hash then return 0 end
redis.call('HINCRBY', KEYS[1], 'lost_calls', ARGV[1])
redis.call('HSETNX', KEYS[1], 'lost_first', ARGV[2])
return 1
`,
};

// Gives back the number of a call that never was one (its body failed before anything was asked of
// the engine), if the session still has the token it was taken under: it is no longer pending, and
// when no later number was taken since, the next call takes it again (a session limit counts
// numbers: a refused body must not use one up). Its token hold (HOLDS), if any, goes. KEYS:
// session, pending calls, token holds. ARGV: token hash, seq.
const GIVE_BACK_SCRIPT: LuaScript = {
  name: "rollgateSessionGiveBack",
  numberOfKeys: 3,
  lua: `
if redis.call('HGET', KEYS[1], 'token_hash') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[3], ARGV[2])
if redis.call('ZREM', KEYS[2], ARGV[2]) == 1 and tonumber(redis.call('HGET', KEYS[1], 'next_seq')) == tonumber(ARGV[2]) + 1 then
  redis.call('HSET', KEYS[1], 'next_seq', ARGV[2])
  return 1
end
return 0
`,
};

// Moves an open session to another rank, only if it is still on the rank the mover read (ARGV[1]):
// calls of one session that find its rank drained at once move it once, not once each. KEYS:
// session. ARGV: the rank member it was read on, the new assignment json, the new rank member.
const REASSIGN_SCRIPT: LuaScript = {
  name: "rollgateSessionReassign",
  numberOfKeys: 1,
  lua: `
if redis.call('HGET', KEYS[1], 'state') ~= 'open' or redis.call('HGET', KEYS[1], 'rank_member') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'assignment', ARGV[2], 'rank_member', ARGV[3])
return 1
`,
};

// A call that ended without a record is no longer pending, if its session still has the token the
// call was authorised with: a session deleted and made again under its id has pending calls of its
// own under the same numbers. Its token hold (HOLDS), if any, goes. KEYS: session, pending calls,
// token holds. ARGV: token hash, seq.
const SETTLE_SCRIPT: LuaScript = {
  name: "rollgateSessionSettleCall",
  numberOfKeys: 3,
  lua: `
if redis.call('HGET', KEYS[1], 'token_hash') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[3], ARGV[2])
return redis.call('ZREM', KEYS[2], ARGV[2])
`,
};

// Gives one slot back on a rank, never below zero. KEYS: rank load. ARGV: member.
const RELEASE_SCRIPT: LuaScript = {
  name: "rollgateRankRelease",
  numberOfKeys: 1,
  lua: `
local load = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if load and load > 0 then redis.call('ZINCRBY', KEYS[1], -1, ARGV[1]) end
return 1
`,
};

// The record heads a reader lacks, in one step (RecordHeadCache): how many heads the session has,
// then [seq, head, …] for each asked-for hole and for every seq from `from` up to the session's
// next_seq. -1 when the head the reader checks is not the one stored (the session was deleted and
// made again under its id), -2 when more than `limit` seqs would have to be looked at (the reader
// reads the whole hash instead). KEYS: record heads, session. ARGV: seq to check or "", its head
// as read, from, limit, hole seqs…
const RECORD_HEADS_SINCE_SCRIPT: LuaScript = {
  name: "rollgateSessionRecordHeadsSince",
  numberOfKeys: 2,
  lua: `
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return {-1} end
local upto = tonumber(redis.call('HGET', KEYS[2], 'next_seq') or '0') or 0
local from = tonumber(ARGV[3])
if upto - from > tonumber(ARGV[4]) then return {-2} end
local out = {redis.call('HLEN', KEYS[1])}
for i = 5, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v then
    out[#out + 1] = ARGV[i]
    out[#out + 1] = v
  end
end
for s = from, upto - 1 do
  local v = redis.call('HGET', KEYS[1], tostring(s))
  if v then
    out[#out + 1] = tostring(s)
    out[#out + 1] = v
  end
end
return out
`,
};

/** Sessions whose parse is kept (sessionOf); the oldest go first. */
const PARSED_SESSIONS_MAX = 100_000;

function deepFreeze(o: object): void {
  Object.freeze(o);
  for (const v of Object.values(o)) if (v && typeof v === "object" && !Object.isFrozen(v)) deepFreeze(v);
}

const sessionScripts = (redis: RedisClient) =>
  scriptCommands(redis, { create: CREATE_SCRIPT, forCall: FOR_CALL_SCRIPT, nextSeq: NEXT_SEQ_SCRIPT, close: CLOSE_SCRIPT, closeAndGet: CLOSE_AND_GET_SCRIPT, appendRecord: APPEND_RECORD_SCRIPT, recordChain: RECORD_CHAIN_SCRIPT, lostCalls: LOST_CALL_SCRIPT, release: RELEASE_SCRIPT, headsSince: RECORD_HEADS_SINCE_SCRIPT, settle: SETTLE_SCRIPT, giveBack: GIVE_BACK_SCRIPT, reassign: REASSIGN_SCRIPT, fitHold: FIT_HOLD_SCRIPT, holdTokens: HOLD_TOKENS_SCRIPT });

/** One session's record heads as last read, in call order, and where each is stored. */
interface KnownHeads {
  heads: readonly RecordHead[];
  /** Each head with its hash field's seq. */
  entries: readonly { seq: number; head: RecordHead; bytes?: number }[];
  /** The highest seq that has a head, and its head's stored text (checked on the next read). */
  last: { seq: number; raw: string } | null;
  /** Seqs below `last` that had no head when read (calls pending, failed or refused). */
  holes: readonly number[];
  bytes: number;
}

/** A head as read: its hash field's seq, and its stored text when just read. */
type HeadEntry = { seq: number; head: RecordHead; raw?: string; bytes?: number };

/** At most this many holes are asked about again; past that the whole hash is read. */
const MAX_HOLES = 256;
/** At most this many seqs past the last known head are looked up one by one in Redis. */
const MAX_SCAN = 256;

/**
 * Record heads already read and parsed, per session, so a call reads and parses only the heads
 * written since the last one (a session's calls read them all on every call, and their number
 * grows with the session). Heads are append-only: a seq's head is written once, with its record,
 * and only deleted with the whole session. So what was read stays true unless the session was
 * deleted and made again under its id: each read checks the last known head is still the one
 * stored, and that the known and the new ones are all the hash holds (else it reads it whole).
 * Bounded in bytes over all sessions; the least recently read go first.
 */
class RecordHeadCache {
  private readonly sessions = new Map<string, KnownHeads>();
  private bytes = 0;
  constructor(private readonly budgetBytes: number) {}

  get(sid: string): KnownHeads | undefined {
    return this.sessions.get(sid);
  }

  set(sid: string, known: KnownHeads): void {
    this.drop(sid);
    if (known.bytes > this.budgetBytes / 4 || known.holes.length > MAX_HOLES) return;
    this.sessions.set(sid, known);
    this.bytes += known.bytes;
    for (const [other, k] of this.sessions) {
      if (this.bytes <= this.budgetBytes) break;
      this.sessions.delete(other);
      this.bytes -= k.bytes;
    }
  }

  drop(sid: string): void {
    const k = this.sessions.get(sid);
    if (!k) return;
    this.sessions.delete(sid);
    this.bytes -= k.bytes;
  }
}

/** Deep-frozen head: shared by every later read of its session. */
function frozenHead(raw: string, seq: string, sid: string): RecordHead {
  const head = parseStored(RecordHead, raw, `record head ${seq} of session ${sid}`);
  deepFreeze(head);
  return head;
}

/** What is known of a session's heads from its stored ones (seq: the hash field), in call order as the heads say. */
function knownHeads(entries: HeadEntry[], last: KnownHeads["last"] = null): KnownHeads {
  let bytes = 0;
  for (const e of entries) {
    if (e.raw !== undefined && (!last || e.seq > last.seq)) last = { seq: e.seq, raw: e.raw };
    e.bytes ??= 2 * (e.raw?.length ?? 0) + 64;
    bytes += e.bytes;
  }
  const have = new Set(entries.map((e) => e.seq));
  const holes: number[] = [];
  for (let s = 0; last && s < last.seq && holes.length <= MAX_HOLES; s++) if (!have.has(s)) holes.push(s);
  entries.sort((a, b) => a.head.seq - b.head.seq);
  return { heads: entries.map((e) => e.head), entries: entries.map(({ seq, head, bytes }) => ({ seq, head, bytes })), last, holes, bytes };
}

/**
 * The session key family: `session` (a hash: static JSON, state, token hash, assignment, counters),
 * `records` (a hash of seq → completion record, stored as records.ts says) and `heads` (seq →
 * record head JSON). All share the session's hash tag.
 */
export class SessionStore {
  private readonly k: Keys;
  private readonly scripts: ReturnType<typeof sessionScripts>;
  /** Recently written records, to store the next ones as deltas of them (records.ts). */
  private readonly bases: RecordBases;
  /**
   * The session last parsed for each recent id, with the stored text it was parsed from (its
   * static JSON and assignment): a session is read on every call, and that part rarely changes.
   */
  private readonly parsed = new Map<string, { raw: string; session: Session }>();
  /** Record heads read and parsed before (recordHeads). */
  private readonly heads: RecordHeadCache;
  constructor(
    private readonly redis: RedisClient,
    prefix: string,
    options: { baseCacheBytes?: number; headCacheBytes?: number } = {},
  ) {
    this.k = keys(prefix);
    this.scripts = sessionScripts(redis);
    this.bases = new RecordBases(16, options.baseCacheBytes);
    this.heads = new RecordHeadCache(options.headCacheBytes ?? 64 * 2 ** 20);
  }

  /**
   * Creates a session: "taken" when the id is, "closed" when it was closed before it was opened
   * (the rank's slot `assign` took for it is given back then).
   */
  async create(
    id: string,
    req: CreateSessionRequest,
    tokenHash: string,
    assignment: SessionAssignment,
    rankMember: string,
    now: Date,
  ): Promise<"created" | "taken" | "closed"> {
    const fields = {
      static: JSON.stringify({
        id,
        created_at: now.toISOString(),
        model: req.model ?? null,
        sampling: req.sampling,
        limits: req.limits,
        affinity_key: req.affinity_key ?? null,
        metadata: req.metadata,
        replay: req.replay ?? null,
      }),
      state: "open",
      closed_at: "",
      assignment: JSON.stringify(assignment),
      rank_member: rankMember,
      llm_calls: "0",
      prompt_tokens: "0",
      completion_tokens: "0",
      cached_tokens: "0",
      next_seq: "0",
    };
    const created = await this.scripts.create(this.k.session(id), this.k.sessionClosedUnopened(id), tokenHash, ...Object.entries(fields).flat());
    if (created === 1) return "created";
    await this.scripts.release(this.k.rankLoad(), rankMember);
    return created === -1 ? "closed" : "taken";
  }

  /** Whether this id was closed before a session was opened under it (it cannot be opened). */
  async closedUnopened(id: string): Promise<boolean> {
    return (await this.redis.exists(this.k.sessionClosedUnopened(id))) === 1;
  }

  /**
   * The session of an agent call. `takeSeq`: the call's sequence number is taken in the same step
   * (one command instead of two; none is taken when the session is missing or closed, nor when
   * `tokenHash` is given and is not the session's: the caller checked its token against that one).
   */
  async getForCall(id: string, { takeSeq = false, tokenHash = "" }: { takeSeq?: boolean; tokenHash?: string } = {}): Promise<SessionForCall | null> {
    let h: Record<string, string>;
    let seq: number | undefined;
    if (takeSeq) {
      const flat = (await this.scripts.forCall(this.k.session(id), this.k.pendingCalls(id), "1", tokenHash)) as string[];
      h = {};
      for (let i = 0; i + 1 < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
      if (h["#seq"] !== undefined) seq = Number(h["#seq"]);
    } else {
      h = await this.redis.hgetall(this.k.session(id));
    }
    return this.fromHash(id, h, seq);
  }

  private fromHash(id: string, h: Record<string, string>, seq?: number): SessionForCall | null {
    if (!h.static || !h.token_hash) return null;
    const session = this.sessionOf(id, h);
    return seq === undefined ? { session, tokenHash: h.token_hash } : { session, tokenHash: h.token_hash, seq };
  }

  /**
   * A session from its stored hash. When its static JSON and assignment are the text last parsed
   * for this id, only the fields that change call by call are read (and checked) again; anything
   * unusual (lost calls, a diverged branch, a value that is not a count) takes the full parse.
   */
  private sessionOf(id: string, h: Record<string, string>): Session {
    const raw = `${h.static}\u0000${h.assignment ?? ""}`;
    const hit = this.parsed.get(id);
    if (hit && hit.raw === raw && !h.lost_first && !h.replay_diverged && (h.state === "open" || h.state === "closed")) {
      const counts = {
        llm_calls: Number(h.llm_calls ?? 0),
        prompt_tokens: Number(h.prompt_tokens ?? 0),
        completion_tokens: Number(h.completion_tokens ?? 0),
        cached_tokens: Number(h.cached_tokens ?? 0),
      };
      const lost = Number(h.lost_calls ?? 0);
      if (Number.isInteger(lost) && Number.isInteger(counts.llm_calls) && Number.isInteger(counts.prompt_tokens) && Number.isInteger(counts.completion_tokens) && Number.isInteger(counts.cached_tokens)) {
        return { ...hit.session, state: h.state, closed_at: h.closed_at || null, counts, lost_calls: { count: lost, first: null }, replay_diverged: null };
      }
    }
    const stat = JSON.parse(h.static!) as Record<string, unknown>;
    const session = parseStored(
      Session,
      JSON.stringify({
        ...stat,
        state: h.state,
        closed_at: h.closed_at || null,
        assignment: h.assignment ? JSON.parse(h.assignment) : null,
        counts: {
          llm_calls: Number(h.llm_calls ?? 0),
          prompt_tokens: Number(h.prompt_tokens ?? 0),
          completion_tokens: Number(h.completion_tokens ?? 0),
          cached_tokens: Number(h.cached_tokens ?? 0),
        },
        lost_calls: { count: Number(h.lost_calls ?? 0), first: h.lost_first ? JSON.parse(h.lost_first) : null },
        replay_diverged: h.replay_diverged ? JSON.parse(h.replay_diverged) : null,
      }),
      `session ${id}`,
    );
    // Shared by every later read of the session: frozen, so no caller can change another's copy.
    for (const v of Object.values(session)) if (v && typeof v === "object") deepFreeze(v);
    if (!this.parsed.has(id) && this.parsed.size >= PARSED_SESSIONS_MAX) {
      const oldest = this.parsed.keys().next().value;
      if (oldest !== undefined) this.parsed.delete(oldest);
    }
    this.parsed.set(id, { raw, session });
    return session;
  }

  async get(id: string): Promise<Session | null> {
    return (await this.getForCall(id))?.session ?? null;
  }

  /** Moves an open session to another rank (its old rank was drained). */
  /**
   * Moves the session to `rankMember`, if it is open and still on `from` (the rank it was read on):
   * false when another call moved it first, or it closed, and nothing changed.
   */
  async reassign(id: string, from: string, assignment: SessionAssignment, rankMember: string): Promise<boolean> {
    return Number(await this.scripts.reassign(this.k.session(id), from, JSON.stringify(assignment), rankMember)) === 1;
  }

  /** How many call numbers the session gave out (recorded, failed or lost calls alike). */
  async numberedCalls(id: string): Promise<number> {
    return Number((await this.redis.hget(this.k.session(id), "next_seq")) ?? 0);
  }

  async rankMember(id: string): Promise<string | null> {
    return this.redis.hget(this.k.session(id), "rank_member");
  }

  /** Returns true when this call closed it, false when it was already closed. */
  async close(id: string, now: Date): Promise<boolean> {
    // Two steps, because the session and the routing keys live in different cluster slots.
    const member = await this.scripts.close(this.k.session(id), this.k.tokenHolds(id), now.toISOString());
    if (typeof member !== "string") return false;
    this.bases.drop(id);
    this.heads.drop(id);
    this.parsed.delete(id);
    if (member !== "") await this.scripts.release(this.k.rankLoad(), member);
    return true;
  }

  /**
   * Closes the session (if still open) and answers it as it is now, closed: one round trip for
   * what a close and a read took. Null when there is no such session. `released`: the second
   * step, the rank's slot given back (the routing keys live in another cluster slot), already
   * sent; the caller awaits it, so what it reads next shares that step's round trip.
   */
  async closeAndGet(
    id: string,
    now: Date,
    { records = false }: { records?: boolean } = {},
  ): Promise<(SessionForCall & { pendingCalls: number; released: Promise<void>; final?: { records: CompletionRecord[]; failures: FailedCallNote[] } }) | null> {
    const keys = [this.k.session(id), this.k.pendingCalls(id), this.k.records(id), this.k.failures(id), this.k.tokenHolds(id), this.k.sessionClosedUnopened(id)];
    let res: [number, string, string[], number, Buffer[]?, string[]?] | null;
    if (records) {
      // Binary: the records are stored as bytes (records.ts); the rest is read as the text it is.
      const b = (await this.scripts.closeAndGetBuffer(...keys, now.toISOString(), "1", String(CLOSED_UNOPENED_TTL_S))) as [number, Buffer, Buffer[], number, Buffer[]?, Buffer[]?] | null;
      res = b && [b[0], b[1].toString(), b[2].map(String), b[3], b[4], b[5]?.map(String)];
    } else {
      res = (await this.scripts.closeAndGet(...keys, now.toISOString(), "", String(CLOSED_UNOPENED_TTL_S))) as typeof res;
    }
    if (!res) return null;
    const [closedNow, member, flat, pendingCalls, recordsFlat, failuresRaw] = res;
    let released: Promise<void> = Promise.resolve();
    if (closedNow === 1) {
      this.bases.drop(id);
      this.heads.drop(id);
      if (member !== "") released = this.scripts.release(this.k.rankLoad(), member).then(() => undefined);
    }
    const h: Record<string, string> = {};
    for (let i = 0; i + 1 < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
    let closed: SessionForCall | null;
    let final: { records: CompletionRecord[]; failures: FailedCallNote[] } | undefined;
    try {
      closed = this.fromHash(id, h);
      if (closed && recordsFlat && failuresRaw) {
        const raw = new Map<number, Buffer>();
        for (let i = 0; i + 1 < recordsFlat.length; i += 2) raw.set(Number(recordsFlat[i]!.toString()), recordsFlat[i + 1]!);
        const seqs = [...raw.keys()].sort((a, b) => a - b);
        final = { records: [...decodeRecords(raw, seqs, `session ${id}`).values()], failures: failuresRaw.map((r) => JSON.parse(r) as FailedCallNote) };
      }
    } catch (err) {
      released.catch(() => {}); // the parse error is the one reported
      throw err;
    }
    // A closed session takes no more calls: its parse is not kept.
    this.parsed.delete(id);
    if (!closed) {
      // Nothing to answer with: the slot's release is still waited for (its failure is the caller's), never left unobserved.
      await released;
      return null;
    }
    return { ...closed, pendingCalls, released, ...(final ? { final } : {}) };
  }

  /** Notes where a branch's agent left the replayed path (the first note stays). */
  async markReplayDiverged(id: string, diverged: ReplayDiverged): Promise<void> {
    await this.redis.hsetnx(this.k.session(id), "replay_diverged", JSON.stringify(ReplayDiverged.parse(diverged)));
  }

  /**
   * Reserves the next sequence number (records are ordered by when their call started) and marks
   * the call pending until its record is stored or settleCall says it has none. Null when the
   * session is not open (closed, or gone, since the caller read it): the call must be refused.
   */
  async nextSeq(id: string): Promise<number | null> {
    const seq = Number(await this.scripts.nextSeq(this.k.session(id), this.k.pendingCalls(id)));
    return seq < 0 ? null : seq;
  }

  /** A call that ends without a record (refused, failed, the agent left) is no longer pending. */
  async settleCall(id: string, ...seqs: number[]): Promise<void> {
    if (seqs.length === 0) return;
    const fields = seqs.map(String);
    await this.redis.multi().zrem(this.k.pendingCalls(id), ...fields).hdel(this.k.tokenHolds(id), ...fields).exec();
  }

  /**
   * Call `seq`, authorised with the token of hash `tokenHash`, ended without a record: it is no
   * longer pending, unless its session was deleted meanwhile (and perhaps made again under its id:
   * the new session's call of that number stays pending).
   */
  async settleOwnCall(id: string, seq: number, tokenHash: string): Promise<void> {
    await this.scripts.settle(this.k.session(id), this.k.pendingCalls(id), this.k.tokenHolds(id), tokenHash, String(seq));
  }

  /**
   * Call `seq`, authorised with the token of hash `tokenHash`, never was one (its body failed before
   * the engine was asked anything): no longer pending, and taken again by the session's next call
   * when it is still the last number taken (GIVE_BACK). True when it was given back; false when a
   * later number was taken since (it stays a gap) or the session is no longer that token's.
   */
  async giveBackCall(id: string, seq: number, tokenHash: string): Promise<boolean> {
    return Number(await this.scripts.giveBack(this.k.session(id), this.k.pendingCalls(id), this.k.tokenHolds(id), tokenHash, String(seq))) === 1;
  }

  /**
   * Fits call `seq` into what the session has left of its max_total_tokens beside its other calls'
   * live holds on every replica, and holds its worst case if it fits, in one step (token-holds.ts
   * HOLDS). The hold goes when the call's record is stored or it ends without one.
   */
  async fitHold(id: string, seq: number, request: HoldRequest): Promise<HoldAnswer> {
    return parseHoldAnswer(await this.scripts.fitHold(this.k.session(id), this.k.tokenHolds(id), ...holdArgs(seq, request)));
  }

  /**
   * Holds `tokens` of the session's max_total_tokens for call `seq` with no fit: a branch's
   * replayed call, whose tokens are counted when its record is stored (released as fitHold's are).
   */
  async holdTokens(id: string, seq: number, tokens: number, ttlMs: number): Promise<void> {
    await this.scripts.holdTokens(this.k.session(id), this.k.tokenHolds(id), String(seq), String(tokens), String(Math.max(1, Math.round(ttlMs))));
  }

  /** The session's calls whose record is not stored yet and that have not ended without one, in order. */
  async pendingCalls(id: string): Promise<number[]> {
    return (await this.redis.zrange(this.k.pendingCalls(id), "0", "-1")).map(Number);
  }

  /**
   * Appends a record and its head (the small part later calls of the session read on every call;
   * see RecordHead). With `tokenHash` (the token its call was authorised with), only while the
   * session still has that token: false when it was deleted or made again under its id meanwhile,
   * and nothing was written.
   */
  async appendRecord(record: CompletionRecord, head: RecordHead, tokenHash?: string): Promise<boolean> {
    const sid = record.session_id;
    const u = record.usage;
    const headJson = JSON.stringify(head);
    const write = (encoded: Encoded) =>
      // One script instead of a six-command MULTI: the same atomic write, a fraction of the client work.
      this.scripts.appendRecord(
        this.k.records(sid),
        this.k.recordHeads(sid),
        this.k.session(sid),
        this.k.pendingCalls(sid),
        this.k.tokenHolds(sid),
        String(record.seq),
        encoded.value,
        headJson,
        String(u.prompt_tokens),
        String(u.completion_tokens),
        String(u.cached_tokens),
        encoded.base ? String(encoded.base.seq) : "",
        encoded.base?.holds ?? "",
        tokenHash ?? "",
      );
    let encoded = encodeRecord(record, this.bases.of(sid));
    let written = Number(await write(encoded));
    if (written === 0) {
      // What this process remembers of the session is not what Redis holds: forget it, store whole.
      this.bases.drop(sid);
      encoded = encodeRecord(record, []);
      written = Number(await write(encoded));
    }
    if (written < 0) {
      this.bases.drop(sid);
      return false;
    }
    // Only once it is stored: a later record may then extend it.
    if (encoded.candidate) this.bases.add(sid, encoded.candidate, encoded.supersedes);
    return true;
  }

  async records(id: string): Promise<CompletionRecord[]> {
    const all = await this.redis.hgetallBuffer(this.k.records(id));
    const raw = new Map(Object.entries(all).map(([seq, value]) => [Number(seq), value]));
    const seqs = [...raw.keys()].sort((a, b) => a - b);
    return [...decodeRecords(raw, seqs, `session ${id}`).values()];
  }

  /**
   * Adds `lost.count` lost calls to a session (`lost.first` is kept only if it has none yet).
   * `presentedTokenHash`: the note comes from a call whose token was not checked; it counts only
   * if the token is the session's. False when nothing was written (no such session, other token).
   */
  async noteLostCalls(id: string, lost: { count: number; first: LostCall }, presentedTokenHash: string | null = null): Promise<boolean> {
    const res = await this.scripts.lostCalls(this.k.session(id), String(lost.count), JSON.stringify(LostCall.parse(lost.first)), presentedTokenHash ?? "");
    return res === 1;
  }

  /** Notes an LLM call that failed (no tokens: the trajectory's stats list it). */
  async appendFailure(id: string, failure: { seq: number; at: string; kind: string; message: string; dp_rank: number }): Promise<void> {
    await this.redis.rpush(this.k.failures(id), JSON.stringify(failure));
  }

  async failures(id: string): Promise<FailedCallNote[]> {
    const raw = await this.redis.lrange(this.k.failures(id), 0, -1);
    return raw.map((r) => JSON.parse(r) as FailedCallNote);
  }

  /**
   * Every record's head, in call order. Heads read before are not read or parsed again: only the
   * ones written since (RecordHeadCache), so a call's cost does not grow with its session.
   */
  async recordHeads(id: string): Promise<RecordHead[]> {
    const known = this.heads.get(id);
    if (known?.last) {
      const { seq: lastSeq, raw: lastRaw } = known.last;
      const res = (await this.scripts.headsSince(this.k.recordHeads(id), this.k.session(id), String(lastSeq), lastRaw, String(lastSeq + 1), String(MAX_SCAN), ...known.holes.map(String))) as (number | string)[];
      const n = Number(res[0]);
      if (n >= 0 && n === known.heads.length + (res.length - 1) / 2) {
        if (res.length === 1) return [...known.heads];
        const entries: HeadEntry[] = known.entries.slice();
        for (let i = 1; i + 1 < res.length; i += 2) {
          const seq = String(res[i]);
          const raw = String(res[i + 1]);
          entries.push({ seq: Number(seq), raw, head: frozenHead(raw, seq, id) });
        }
        const merged = knownHeads(entries, known.last);
        // Concurrent reads of one session: the one that saw more heads is kept.
        const now = this.heads.get(id);
        if (!now || now.heads.length <= merged.heads.length) this.heads.set(id, merged);
        return [...merged.heads];
      }
      // Not what was known (made again under its id) or too far behind: read whole.
    }
    const all = await this.redis.hgetall(this.k.recordHeads(id));
    const entries = Object.entries(all).map(([seq, raw]) => ({ seq: Number(seq), raw, head: frozenHead(raw, seq, id) }));
    const read = knownHeads(entries);
    this.heads.set(id, read);
    return [...read.heads];
  }

  /** One record by its sequence number. */
  async record(id: string, seq: number): Promise<CompletionRecord | null> {
    const chain = (await this.scripts.recordChainBuffer(this.k.records(id), String(seq))) as Buffer[];
    if (chain.length === 0) return null;
    const raw = new Map<number, Buffer>();
    for (let i = 0; i < chain.length; i += 2) raw.set(Number(chain[i]!.toString()), chain[i + 1]!);
    return decodeRecords(raw, [seq], `session ${id}`).get(seq)!;
  }

  /**
   * The prompt and output ids of one record (decoded as records.ts `decodeRecordIds` says, typed
   * arrays), or null when there is none. `recordId`: the record's id as its head gives it; when
   * this process wrote that very record and still remembers it as a base (RecordBases), its ids
   * are answered from there, without reading and decoding its chain of bases from Redis.
   */
  async recordIds(id: string, seq: number, recordId?: string): Promise<{ seq: number; prompt_ids: Int32Array; output_ids: Int32Array } | null> {
    const known = recordId === undefined ? null : this.bases.find(id, seq, recordId);
    // Copies: the remembered ids stay as written whatever the caller does with its own.
    if (known) return { seq, prompt_ids: known.ids.slice(0, known.promptLength), output_ids: known.ids.slice(known.promptLength) };
    const chain = (await this.scripts.recordChainBuffer(this.k.records(id), String(seq))) as Buffer[];
    if (chain.length === 0) return null;
    const raw = new Map<number, Buffer>();
    for (let i = 0; i < chain.length; i += 2) raw.set(Number(chain[i]!.toString()), chain[i + 1]!);
    return { seq, ...decodeRecordIds(raw, seq, `session ${id}`) };
  }

  /** Drops everything the session holds (its rank slot is released first if still open). */
  async delete(id: string, now: Date): Promise<boolean> {
    await this.close(id, now);
    this.bases.drop(id);
    this.heads.drop(id);
    this.parsed.delete(id);
    const n = await this.redis.del(this.k.session(id), this.k.records(id), this.k.recordHeads(id), this.k.failures(id), this.k.pendingCalls(id), this.k.tokenHolds(id));
    return n > 0;
  }
}
