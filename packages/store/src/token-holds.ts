import type { LuaScript } from "./scripts.js";

/**
 * HOLDS: a session's `max_total_tokens` shared by its calls in flight on every gateway replica.
 * Each call fitted to the budget holds its worst case in the session's token-holds hash (seq ->
 * "tokens:deadline ms"), in the session's slot, from its fit until its record is stored
 * (APPEND_RECORD_SCRIPT) or it ends without one (settle, give back): those steps delete the field
 * in the step that counts or drops the call. A hold past its deadline (its gateway died before
 * either) no longer counts, so a dead replica's holds do not block the budget for ever.
 */

/**
 * The gateway's `fitCall` (apps/gateway llm/token-budget.ts) in Lua: fit_call(left, prompt length
 * or nil, asked or nil, context length or nil) -> true, max_tokens (nil: uncapped), hold | false,
 * why. The two are run against one table of cases (token-budget-lua.test.ts) so they cannot drift.
 */
export const FIT_CALL_LUA = `
local function fit_call(left, prompt, asked, mml)
  if prompt == nil then
    if mml ~= nil and mml <= left then return true, asked, mml end
    return false, 'prompt_unknown'
  end
  local room = left - prompt
  if room < 1 then return false, 'over' end
  local allowed = asked
  if allowed == nil and mml ~= nil then allowed = mml - prompt end
  if allowed ~= nil and allowed <= room then return true, asked, prompt + allowed end
  return true, room, prompt + room
end
`;

// Fits call ARGV[1] into what its session has left, in one step: reads the session's counts, sums
// the other live holds (dropping expired ones), fits the call and holds its worst case. KEYS:
// session, token holds. ARGV: seq, limit, prompt length or "", asked max_tokens or "", context
// length or "", hold lifetime ms. Returns {"fit", used, held by others, hold, max_tokens or -1},
// {"closed"}, {"limit", used}, or {why, used, held by others} (why: prompt_unknown, over).
export const FIT_HOLD_SCRIPT: LuaScript = {
  name: "rollgateSessionFitHold",
  numberOfKeys: 2,
  lua: `${FIT_CALL_LUA}
local s = redis.call('HMGET', KEYS[1], 'state', 'prompt_tokens', 'completion_tokens')
if s[1] ~= 'open' then return {'closed'} end
local used = (tonumber(s[2]) or 0) + (tonumber(s[3]) or 0)
local limit = tonumber(ARGV[2])
if used >= limit then return {'limit', used} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = 0
local holds = redis.call('HGETALL', KEYS[2])
for i = 1, #holds, 2 do
  if holds[i] ~= ARGV[1] then
    local tokens, deadline = string.match(holds[i + 1], '^(%d+):(%d+)$')
    if not tokens or tonumber(deadline) <= now then
      redis.call('HDEL', KEYS[2], holds[i])
    else
      held = held + tonumber(tokens)
    end
  end
end
local fits, max_tokens, hold = fit_call(limit - used - held, tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if not fits then return {max_tokens, used, held} end
redis.call('HSET', KEYS[2], ARGV[1], string.format('%d:%d', hold, now + tonumber(ARGV[6])))
return {'fit', used, held, hold, max_tokens or -1}
`,
};

// Holds exactly ARGV[2] tokens for call ARGV[1] of an open session, with no fit (a branch's
// replayed call: its tokens are its source's, already spent). KEYS: session, token holds. ARGV:
// seq, tokens, hold lifetime ms. Returns 1, or 0 when the session is not open.
export const HOLD_TOKENS_SCRIPT: LuaScript = {
  name: "rollgateSessionHoldTokens",
  numberOfKeys: 2,
  lua: `
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], ARGV[1], string.format('%d:%d', tonumber(ARGV[2]), now + tonumber(ARGV[3])))
return 1
`,
};

/** What a call asks of its session's budget. */
export interface HoldRequest {
  limit: number;
  /** The call's prompt in tokens, when known. */
  promptLength: number | null;
  /** The max_tokens asked (by the agent or the session's sampling), if any. */
  asked: number | undefined;
  /** The engine's context length, when known. */
  contextLength: number | null;
  /** How long the hold counts if its call's gateway never releases it. */
  ttlMs: number;
}

/** What the session's budget answered: `used` its recorded total, `heldByOthers` its other calls' live holds. */
export type HoldAnswer =
  | { fits: true; maxTokens: number | undefined; hold: number; used: number; heldByOthers: number }
  | { fits: false; why: "closed" }
  | { fits: false; why: "limit"; used: number }
  | { fits: false; why: "prompt_unknown" | "over"; used: number; heldByOthers: number };

export function holdArgs(seq: number, r: HoldRequest): string[] {
  const opt = (n: number | null | undefined) => (n === null || n === undefined ? "" : String(n));
  return [String(seq), String(r.limit), opt(r.promptLength), opt(r.asked), opt(r.contextLength), String(Math.max(1, Math.round(r.ttlMs)))];
}

export function parseHoldAnswer(raw: unknown): HoldAnswer {
  const [kind, used, held, hold, maxTokens] = raw as [string, number?, number?, number?, number?];
  if (kind === "fit") return { fits: true, maxTokens: maxTokens === -1 ? undefined : Number(maxTokens), hold: Number(hold), used: Number(used), heldByOthers: Number(held) };
  if (kind === "closed") return { fits: false, why: "closed" };
  if (kind === "limit") return { fits: false, why: "limit", used: Number(used) };
  if (kind === "prompt_unknown" || kind === "over") return { fits: false, why: kind, used: Number(used), heldByOthers: Number(held) };
  throw new Error(`unexpected token hold answer: ${JSON.stringify(raw)}`);
}
