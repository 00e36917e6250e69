import { randomUUID } from "node:crypto";
import type { CanonicalChatRequest, ClientProtocol, CompletionRecord, RecordHead, Session, WeightVersion } from "@rollgate/protocol";
import { rankMember, type SessionStore, type TaskStore } from "@rollgate/store";
import {
  StreamAccumulator,
  applyNormalizations,
  applySessionSampling,
  findExtendedRecord,
  matchEchoedHistory,
  prefixConversationKeys,
  recordHead,
  reasoningTokensOf,
  resultAsEvents,
  toolsText,
  type EchoedHistory,
  type EngineResult,
  type EngineStreamEvent,
  type ToolsText,
} from "@rollgate/transforms";
import type { Logger } from "pino";
import { pausePlan } from "../engines/capabilities.js";
import { checkAnswer, checkFinish, checkOutputPiece } from "../engines/answer-check.js";
import { EngineError } from "../engines/errors.js";
import type { EngineRegistry, RankTarget } from "../engines/registry.js";
import type { GateSlot, PauseGate } from "../ops/pause-gate.js";
import type { Rerouter } from "../ops/reroute.js";
import { adapterFor, type EngineAdapter } from "../engines/adapter.js";
import { SGLANG_GENERATE_ENGINE_PARSED, cutContinuationRoute, historyRoute, parseAnswer, type TokenInCall, type TokenInRoute } from "../engines/token-in.js";
import { engineTokenizer } from "../engines/tokenizer.js";
import type { EngineCall } from "../engines/call.js";
import { expectsChatRoute, planContinuation, promptContinues, type BaseIds, type ContinuationMode } from "./continuation.js";
import { HistoryNormalizer } from "./history-normalizer.js";
import type { PendingCalls } from "./pending-calls.js";
import { LeftWhileHeld } from "./lost-calls.js";
import { addCut, continuationPrompt, continuationRequest, joinContinuation, type CutGeneration } from "./pause-continuation.js";
import { recordedResult, replayDifference } from "./replay.js";
import { HoldReleases } from "./token-budget.js";

/** A promise of the engine's prompt ids and the callback an adapter tells them with. */
function promptIdsTold(): { ids: Promise<number[]>; tell: (ids: number[]) => void } {
  let tell: (ids: number[]) => void = () => undefined;
  const ids = new Promise<number[]>((resolve) => (tell = resolve));
  return { ids, tell };
}
const noIds = (): null => null;

/**
 * An answer's usage as recorded: the counts of the ids recorded (an engine's own counts that
 * disagree with its ids are not taken: the session's token limits and the task's events read
 * these), its cache hits, and its reasoning tokens when they can be counted.
 */
function recordedUsage(result: EngineResult, reasoningEnd: string | null | undefined): EngineResult["usage"] {
  const usage = { ...result.usage, prompt_tokens: result.prompt_ids.length, completion_tokens: result.output_ids.length };
  const reasoning = reasoningTokensOf(result, reasoningEnd);
  return reasoning === undefined ? usage : { ...usage, reasoning_tokens: reasoning };
}

/** How far from its own number a branch's call may find the source call it asks again (calls an agent sent together). */
const REPLAY_REORDER = 4;
/**
 * How often a call waiting for its session's max_total_tokens looks again at the holds: a release
 * on this gateway wakes it at once, one on another replica is seen at the next look.
 */
const HOLD_POLL_MS = 50;
/** How long a call's max_total_tokens hold counts when its gateway never releases it (it died). */
const DEFAULT_TOKEN_HOLD_TTL_MS = 900_000;

const ABORTED = 'the engine aborted the call (finish_reason "abort") outside a pause of this gateway: its answer was cut short';

/** The engine could not serve the call (unreachable, or a 5xx): worth another rank, unlike a refusal. */
function rankFailed(err: unknown): boolean {
  return err instanceof EngineError && (err.kind === "unreachable" || (err.kind === "rejected" && err.status === 502));
}

/**
 * Why a call's rank failed it before the engine produced anything for it, or null: it could not be
 * reached (no response headers), it answered 503 (down), or a streamed call's engine stream broke
 * off after its start and before its first token (`started`). Such a call may be made again on
 * another rank: nothing of it was sampled, so asking again draws the answer afresh. An answer that
 * broke off later, or an error of the engine's own (a 400, a 500), is not retried.
 */
function diedBeforeAnswer(err: unknown, streamed: boolean, started: boolean): "unreachable" | "down" | "broken_off" | null {
  if (!(err instanceof EngineError)) return null;
  if (err.beforeAnswer) return err.kind === "unreachable" ? "unreachable" : "down";
  return streamed && started && err.kind === "unreachable" ? "broken_off" : null;
}

/**
 * Whether an echoed assistant turn of `agent`'s request is not surely matched to its producer:
 * none was found, or one was found by its text while the turn's tool calls carry an id that record
 * did not issue, or that record answered another conversation (`history`: the turns as restored).
 */
function unsurelyMatched(agent: CanonicalChatRequest, history: EchoedHistory, tools: ToolsText): boolean {
  let keys: string[] | undefined;
  return history.producers.some((producer, i) => {
    const m = agent.messages[i]!;
    if (m.role !== "assistant") return false;
    if (!producer) return true;
    const id = m.tool_calls?.[0]?.id;
    if (id) return !producer.message.tool_calls.some((c) => c.id === id);
    keys ??= prefixConversationKeys(history.messages, agent.tools, tools);
    return producer.conversation_key !== keys[i];
  });
}

/** A call refused before it reached an engine (session limits); `status` and `code` go to the agent. */
export class CallRejected extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code: string,
  ) {
    super(message);
  }
}

/** The session a call was authorised for, as the route read it (see prepare). */
export interface CallAuth {
  session: Session;
  tokenHash?: string;
  seq?: number;
  heads?: Promise<RecordHead[]>;
}

export interface PreparedCall {
  session: Session;
  /**
   * The hash of the token the call was authorised with: its record is stored only if the session
   * still has it (not one deleted meanwhile, nor one made again under its id for another rollout).
   */
  tokenHash?: string;
  adapter: EngineAdapter;
  reroutedFrom: { engine: number; dp_rank: number } | null;
  /** Set when pauses cut the call and it was continued token-in: how often, and each output token's weight version. */
  continued?: { cuts: number; versions: WeightVersion[] };
  protocol: ClientProtocol;
  seq: number;
  target: RankTarget;
  engineCall: EngineCall;
  weightVersion: string | null;
  startedAt: number;
  /**
   * The request's tools as conversation keys hash them, made once for the call: its echoed turns
   * are matched, the record it continues is found and its own record's head is keyed with it.
   */
  toolsText: ToolsText;
  /**
   * Set when the call goes to the engine as token ids: it continues a recorded one token-in (see
   * continuation.ts; `base` is that record's seq), or its engine is an SGLang that serves every
   * call through /generate (an in-place pause can fall inside it). Null: the chat route renders.
   */
  tokenIn: { route: TokenInRoute; promptIds: number[]; maxModelLen: number | null; base: number | null } | null;
  /** A branch's replayed call: the source session's record that answers it (no engine call). */
  replay?: CompletionRecord;
  /**
   * Set when the call goes to the chat route before its continuation plan is made (its session's
   * last plan, or for its first its engine key's, kept the chat route): called once the engine call
   * is sent, with the engine's prompt ids as its first chunk tells them (null where the adapter
   * cannot tell them before the answer is complete). A prompt that continues the recorded call
   * needs no plan; otherwise the plan is made. The engine's answer is held until then; a token-in
   * plan aborts that engine call and the call goes token-in instead.
   */
  planning?: (enginePrompt: Promise<number[] | null> | null) => Promise<PreparedCall["tokenIn"]>;
}

type TokenIn = PreparedCall["tokenIn"];

/**
 * One agent LLM call, whatever the client protocol: apply the session's limits and sampling,
 * route to its sticky rank, call the engine, and append the completion record.
 */
export class ChatCaller {
  constructor(
    private readonly deps: {
      registry: EngineRegistry;
      sessions: SessionStore;
      tasks: TaskStore;
      pause: PauseGate;
      rerouter: Rerouter;
      log: Logger;
      /** Told of every recorded call (metrics). */
      observe?: (record: CompletionRecord, call: PreparedCall) => void;
      /** ROLLGATE_CONTINUATION (default auto): when a call continues a recorded one token-in. */
      continuation?: ContinuationMode;
      /** Told of a Redis write that failed and was given up (metrics). */
      countError?: (what: string) => void;
      /** Records being written after their call was answered, and calls that ended without one. */
      pending: PendingCalls;
      /** Which engines the gateway loaded the current weights onto (their own version is checked there). */
      loadedWeights?: { loadedOn(engine: number, version: string): boolean };
      /** Told of an engine whose answer came from weights other than the ones it was loaded with (its ranks are drained once that is confirmed). */
      staleWeights?: (engine: number) => void;
      /** Told of a call made again on another rank after its rank failed it before answering anything (metrics). */
      countRetry?: (engine: number, dpRank: number, reason: string) => void;
      /** Told of a call that found its rank unreachable (the rank is probed at once, engine-health.ts). */
      rankUnreachable?: (member: string) => void;
      /** ROLLGATE_TOKEN_HOLD_TTL_S: how long a call's max_total_tokens hold counts if its gateway never releases it. */
      tokenHoldTtlMs?: number;
    },
  ) {}

  get pending(): PendingCalls {
    return this.deps.pending;
  }

  /** What this gateway learned of each engine's template re-rendering of echoed turns. */
  readonly normalizer = new HistoryNormalizer();

  /**
   * Per session: whether its last planned call kept the chat route. It decides whether the next
   * call goes there before its plan is made: a session's histories keep reproducing, or keep
   * diverging, while the engine key's last plan (`expectsChatRoute`, the fallback) flips with
   * whichever of its concurrent sessions planned last. Bounded: past the cap it starts over.
   */
  private readonly keptChat = new Map<string, boolean>();

  /**
   * `auth`: the session as the route read it, with its token hash (the record is stored only while
   * the session is still the one of that token), the call's sequence number when the route took it
   * already (with its session read) and the session's record heads when the route read them with it.
   */
  async prepare(auth: CallAuth, protocol: ClientProtocol, canonical: CanonicalChatRequest, signal: AbortSignal): Promise<PreparedCall> {
    const { session: given, seq: takenSeq, heads } = auth;
    const taken: { seq: Promise<number> | null } = { seq: takenSeq === undefined ? null : Promise.resolve(takenSeq) };
    try {
      const prepared = await this.prepareTaken(given, protocol, canonical, signal, takenSeq, taken, heads);
      if (auth.tokenHash !== undefined) prepared.tokenHash = auth.tokenHash;
      return prepared;
    } catch (err) {
      // Refused or failed before the engine: the call will have no record (its number may still be on its way).
      taken.seq?.then(
        (seq) => {
          this.deps.pending.settle(given.id, seq, auth.tokenHash);
          this.holdReleased(given.id);
        },
        () => undefined,
      );
      throw err;
    }
  }

  private async prepareTaken(
    given: Session,
    protocol: ClientProtocol,
    canonical: CanonicalChatRequest,
    signal: AbortSignal,
    takenSeq: number | undefined,
    taken: { seq: Promise<number> | null },
    readWithSession: Promise<RecordHead[]> | undefined,
  ): Promise<PreparedCall> {
    const { session, reroutedFrom } = await this.deps.rerouter.ensureHealthy(given);
    const { limits, counts, assignment } = session;
    if (!assignment) throw new CallRejected("session has no engine assignment", 500, "no_assignment");
    if (limits.max_total_tokens !== undefined && counts.prompt_tokens + counts.completion_tokens >= limits.max_total_tokens) {
      throw new CallRejected(`session used its max_total_tokens (${limits.max_total_tokens})`, 400, "session_token_limit");
    }
    // Independent reads: sent together (one round trip's wait instead of three).
    const hasHistory = canonical.messages.some((m) => m.role === "assistant");
    // The previous call's record may still be on its way (it was answered first): this process's
    // own writes for the session are awaited before its records are read.
    const written = hasHistory ? this.deps.pending.local(session.id) : null;
    const [seq, readHeads, model] = await Promise.all([
      takenSeq ?? (taken.seq = this.takeSeq(session.id)),
      hasHistory ? (written ? written.then(() => this.deps.sessions.recordHeads(session.id)) : (readWithSession ?? this.deps.sessions.recordHeads(session.id))) : null,
      this.servedModel(assignment.engine),
    ]);
    let heads = readHeads;
    if (limits.max_llm_calls !== undefined && seq >= limits.max_llm_calls) {
      throw new CallRejected(`session used its max_llm_calls (${limits.max_llm_calls})`, 400, "session_call_limit");
    }
    const target = this.deps.registry.target(assignment.engine, assignment.dp_rank);
    const adapter = adapterFor(target.engine.kind);
    if (!adapter) throw new CallRejected(`engine kind ${target.engine.kind} is not supported yet`, 501, "engine_unsupported");
    // Re-read when the call passes the pause gate (complete/stream): a paused call runs on the new weights.
    const weightVersion = this.deps.pause.weights;
    // Echoed history: each assistant turn is restored from the session's own records (what the
    // engine generated). Only the records' small heads are read, once per call and only when
    // there are such turns; the one full record a token-in continuation needs is read after.
    let history: EchoedHistory | null = null;
    const tools = toolsText(canonical.tools);
    if (heads && canonical.messages.some((m) => m.role === "assistant")) {
      history = matchEchoedHistory(canonical.messages, heads, { tools: canonical.tools, toolsText: tools });
      // An echoed turn no record answers may be the answer of an earlier call another replica
      // served: still being stored, or stored just after these heads were read (with the session,
      // or before this call's number was taken). So may a turn matched only by its text to a record
      // that is not its own (the same answer given in another conversation of the session, a
      // sub-agent's). When an earlier call has no head in what was read and a turn is not surely
      // matched, the session's earlier calls are waited for and the heads read again (only the new ones).
      if (heads.filter((h) => h.seq < seq).length < seq && unsurelyMatched(canonical, history, tools)) {
        await this.deps.pending.earlierSettled(session.id, seq);
        heads = await this.deps.sessions.recordHeads(session.id);
        history = matchEchoedHistory(canonical.messages, heads, { tools: canonical.tools, toolsText: tools });
      }
    }
    const request: CanonicalChatRequest = {
      ...canonical,
      messages: history?.messages ?? canonical.messages,
      sampling: applySessionSampling(canonical.sampling, session.sampling),
    };
    const engineCall: EngineCall = {
      target,
      model,
      request,
      requestId: `${session.id}-${seq}`,
      signal,
      dispatcher: this.deps.registry.dispatcher,
    };
    // Capabilities are probed once per engine; a call never waits on a failed probe.
    const caps = await this.deps.registry.capabilities(assignment.engine).catch(() => null);
    const pauseMode = caps ? pausePlan(target.engine.kind, caps, target.profile).mode : null;
    const guided = request.tool_choice === "required" || typeof request.tool_choice === "object";
    // A freeze-in-place pause may fall inside any call: the answer is then read as it arrives and
    // each token stamped with the weight version current when it came. On SGLang that is its chat
    // stream when it carries the ids (capabilities.ts `streamedIds`), else /generate, which has no
    // guided decoding: such calls then stay on the chat route.
    const chatStamps = pauseMode === "in_place" && caps?.streamedIds === true;
    const viaGenerate = pauseMode === "in_place" && !guided && !chatStamps;
    if (pauseMode === "keep" || viaGenerate || chatStamps) engineCall.stamp = () => this.deps.pause.weights;
    if (caps?.streamedIds) engineCall.streamedIds = true;
    // A branch's calls up to a few past its branch point may be replayed (calls sent together cross
    // it in either order; a source call that failed leaves its answer to a later number).
    const mayReplay = !!session.replay && seq < session.replay.calls + REPLAY_REORDER;
    let planned = history ? await this.restoreAndPlan(engineCall, history, tools, session.id, seq, caps, !mayReplay && !viaGenerate) : null;
    // Fitted only to calls the engine answers (a replayed call's tokens are its source's: it returns before).
    const tokenLimit = limits.max_total_tokens;
    if (planned && "planning" in planned) {
      // Near the session's token limit the plan is made first: the call's prompt must be known to fit it.
      if (tokenLimit !== undefined && !(await this.fitBudget(session.id, seq, engineCall, null, tokenLimit, false))) planned = await planned.planning(null);
    }
    if (planned && "planning" in planned) {
      return { session, adapter, reroutedFrom, protocol, seq, target, weightVersion, startedAt: Date.now(), toolsText: tools, engineCall, tokenIn: null, planning: planned.planning };
    }
    let tokenIn = planned;
    // A branch's replayed call, compared as the engine would have been asked (echoed turns restored and normalised).
    const replay = mayReplay ? await this.replaySource(session, seq, engineCall.request) : null;
    if (replay) {
      // Not fitted (its source spent the tokens), but held until its record counts them: a call fitted meanwhile must not be given them too.
      if (tokenLimit !== undefined) await this.deps.sessions.holdTokens(session.id, seq, replay.prompt_ids.length + replay.output_ids.length, this.tokenHoldTtlMs);
      return { session, adapter, reroutedFrom, protocol, seq, target, weightVersion, startedAt: Date.now(), toolsText: tools, engineCall, tokenIn: null, replay };
    }
    if (viaGenerate && !tokenIn) {
      const rendered = await engineTokenizer.renderChat(engineCall, engineCall.request.messages);
      tokenIn = { route: SGLANG_GENERATE_ENGINE_PARSED, promptIds: rendered.ids, maxModelLen: rendered.maxModelLen, base: null };
    }
    if (tokenLimit !== undefined) await this.fitBudget(session.id, seq, engineCall, tokenIn?.promptIds ?? null, tokenLimit);
    return { session, adapter, reroutedFrom, protocol, seq, target, weightVersion, startedAt: Date.now(), toolsText: tools, engineCall, tokenIn };
  }

  /** Wakes this gateway's calls waiting for their session's max_total_tokens when a call here releases its hold. */
  private readonly holds = new HoldReleases();

  private get tokenHoldTtlMs(): number {
    return this.deps.tokenHoldTtlMs ?? DEFAULT_TOKEN_HOLD_TTL_MS;
  }

  /** A call of the session ended without a record: once its settle (which drops its hold) is stored, waiting calls look again. */
  private holdReleased(sid: string): void {
    const writes = this.deps.pending.local(sid);
    if (!writes) return this.holds.released(sid);
    const wake = () => this.holds.released(sid);
    writes.then(wake, wake);
  }
  /** Each engine's context length (by URL), asked once: it bounds every call's prompt plus answer. */
  private readonly contextLengths = new Map<string, Promise<number | null>>();

  private contextLength(call: EngineCall): Promise<number | null> {
    const url = call.target.engine.url;
    let known = this.contextLengths.get(url);
    if (!known) {
      known = engineTokenizer.maxModelLen(call).catch(() => {
        this.contextLengths.delete(url);
        return null;
      });
      this.contextLengths.set(url, known);
    }
    return known;
  }

  /**
   * Fits the call into what its session has left of its max_total_tokens (token-budget.ts): its
   * engine max_tokens is capped so that its prompt and answer fit. The prompt is counted when the
   * gateway knows it (`promptIds`: a token-in call), else rendered by the engine's tokenizer once
   * the engine's context no longer fits in what is left (`render` false: false is returned then,
   * and nothing held). A call whose prompt alone does not fit is refused. While the session's other
   * calls in flight, on any replica, hold what it needs, it waits for them. The session's counts are
   * read here: the route's read may predate the record of a call of the session that ended since.
   */
  private async fitBudget(sid: string, seq: number, call: EngineCall, promptIds: number[] | null, limit: number, render = true): Promise<boolean> {
    const asked = call.request.sampling.max_tokens;
    const contextLength = await this.contextLength(call);
    let promptLength = promptIds?.length ?? null;
    for (;;) {
      // Read, fitted and held in one step on Redis: the session's calls on every replica are seen.
      const fit = await this.deps.sessions.fitHold(sid, seq, { limit, promptLength, asked, contextLength, ttlMs: this.tokenHoldTtlMs });
      if (fit.fits) {
        if (fit.maxTokens !== asked) call.request = { ...call.request, sampling: { ...call.request.sampling, max_tokens: fit.maxTokens } };
        return true;
      }
      if (fit.why === "closed") throw new CallRejected(`session ${sid} is closed`, 403, "session_closed");
      if (fit.why === "limit") throw new CallRejected(`session used its max_total_tokens (${limit})`, 400, "session_token_limit");
      if (fit.why === "prompt_unknown") {
        if (!render) return false;
        promptLength = await engineTokenizer.renderChat(call, call.request.messages).then(
          (rendered) => rendered.ids.length,
          (err: unknown) => {
            call.signal.throwIfAborted();
            // No render (an engine without /tokenize): the answer alone is capped at what is left.
            this.deps.log.warn({ session: sid, seq, err: (err as Error).message }, "cannot count the call's prompt: only its answer is capped at what the session has left");
            return 0;
          },
        );
        continue;
      }
      if (fit.heldByOthers === 0) {
        throw new CallRejected(
          `the call's prompt (${promptLength} tokens) does not fit in what is left of the session's max_total_tokens (${limit}): ${limit - fit.used} tokens`,
          400,
          "session_token_limit",
        );
      }
      // The session's other calls hold the rest: once one of them is counted, what is left is read again.
      await this.holds.next(sid, call.signal, HOLD_POLL_MS);
      call.signal.throwIfAborted();
    }
  }

  /**
   * The call's number, taken apart from the session read (see authorizeSession `takeSeq`). A
   * session closed since that read refuses the call as a closed session does: its close counted
   * the pending calls already, and would neither wait for this one nor count it.
   */
  private async takeSeq(sid: string): Promise<number> {
    const seq = await this.deps.sessions.nextSeq(sid);
    if (seq === null) throw new CallRejected(`session ${sid} is closed`, 403, "session_closed");
    return seq;
  }

  /**
   * The record that answers a branch's call `seq`, or null when the call is past the branch point
   * (sampled). The branch replays the source's recorded calls below `replay.calls`, each once: a
   * call is answered by the source's call of its own number when it asked the same, or failing
   * that by a neighbouring one that asked it and that no earlier call of the branch was answered
   * with (an agent that sends calls together, such as opencode's title request beside its first
   * step, numbers them in whichever order they reach the gateway; a source call that failed left
   * no record, and the agent's retry took the next number). A call is past the branch point when
   * its number is, when every recorded answer below the point has been given (the source's failed
   * calls leave fewer answers than numbers), or when it asks what a source call from the point on
   * asked (sent together with the last replayed one, it came first). Otherwise the branch has left
   * the recorded path: the session notes where (the rollout ends `replay_diverged`) and the call
   * is refused.
   */
  private async replaySource(session: Session, seq: number, request: CanonicalChatRequest): Promise<CompletionRecord | null> {
    const replay = session.replay!;
    const source = (n: number) => this.deps.sessions.record(replay.session_id, n);
    const own = seq < replay.calls ? await source(seq) : null;
    const difference = own ? replayDifference(own.request, request) : null;
    if (own && !difference) return own;
    const near: { record: CompletionRecord; asked: boolean }[] = [];
    for (let other = Math.max(0, seq - REPLAY_REORDER); other < Math.min(replay.calls, seq + REPLAY_REORDER + 1); other++) {
      const sibling = other === seq ? own : await source(other);
      if (sibling) near.push({ record: sibling, asked: other !== seq && !replayDifference(sibling.request, request) });
    }
    // Past the point and asking nothing the source asked before it (every call of a branch that
    // replayed in order): sampled, without waiting for the branch's earlier calls.
    if (seq >= replay.calls && !near.some((n) => n.asked)) return null;
    // Two calls may ask the same and have been answered differently (parallel workers given one
    // prompt): a source call an earlier call of this branch was answered with is not given again.
    const used = await this.replayedEarlier(session.id, seq);
    const unused = near.filter((n) => !used.has(n.record.id));
    const answer = unused.find((n) => n.asked);
    if (answer) return answer.record;
    if (seq >= replay.calls) return null;
    // A deleted source has no records left: not a branch that diverged, and not one past its point.
    if (!own && !(await this.deps.sessions.get(replay.session_id))) return this.diverged(session, seq, `the source session ${replay.session_id} was deleted while this branch replayed it`);
    if (unused.length === 0) return null;
    for (let later = replay.calls; later <= seq + REPLAY_REORDER; later++) {
      const after = await source(later);
      if (after && !replayDifference(after.request, request)) return null;
    }
    return this.diverged(session, seq, difference ?? `the source's call ${seq} has no record (it failed), and no call near it asked this`);
  }

  private async diverged(session: Session, seq: number, message: string): Promise<never> {
    await this.deps.sessions.markReplayDiverged(session.id, { call: seq, message });
    throw new CallRejected(`the branch left the replayed rollout at call ${seq}: ${message}`, 409, "replay_diverged");
  }

  /**
   * The source records the branch's calls before `seq` were answered with, as far back as one of
   * them could have taken a neighbour of `seq` (once those calls are stored). Read only when a call
   * is not its own number's: an agent's calls sent together, rare.
   */
  private async replayedEarlier(sid: string, seq: number): Promise<Set<string>> {
    await this.deps.pending.earlierSettled(sid, seq);
    const used = new Set<string>();
    for (let earlier = Math.max(0, seq - 2 * REPLAY_REORDER); earlier < seq; earlier++) {
      const replayedFrom = (await this.deps.sessions.record(sid, earlier))?.replayed_from;
      if (replayedFrom) used.add(replayedFrom);
    }
    return used;
  }

  /** Each token's text by the engine's tokenizer: one (cached) detokenize per distinct id. */
  private async tokenTexts(engineIndex: number, ids: readonly number[]): Promise<string[]> {
    const distinct = [...new Set(ids)];
    const texts = await Promise.all(distinct.map((id) => this.deps.registry.decode(engineIndex, [id])));
    const byId = new Map(distinct.map((id, i) => [id, texts[i]!]));
    return ids.map((id) => byId.get(id)!);
  }

  private servedModel(engine: number): Promise<string> {
    return this.deps.registry.servedModel(engine).catch((err: Error) => {
      throw new EngineError(`cannot read the engine's model name: ${err.message}`, 502, "unreachable", "cannot read the engine's model name");
    });
  }

  /**
   * Echoed history, step two and three: the restored turns get the forms this engine's template
   * re-renders faithfully (learned empirically where the profile asks for it), then the call is
   * planned: continued token-in from a recorded call's own ids, or left to the engine to render.
   * Planning never fails a call: anything that goes wrong falls back to rendering.
   *
   * `overlap`: the call may go to the chat route before its plan is made. It does (`planning` is
   * returned) when the plan has renders to wait for and the session's last plan (for its first, the
   * engine key's) kept the chat route.
   */
  private async restoreAndPlan(
    call: EngineCall,
    history: EchoedHistory,
    tools: ToolsText,
    sid: string,
    seq: number,
    caps: Awaited<ReturnType<EngineRegistry["capabilities"]>> | null,
    overlap: boolean,
  ): Promise<TokenIn | { planning: NonNullable<PreparedCall["planning"]> }> {
    const profile = call.target.profile;
    const restored = history.producers.flatMap((p, i) => (p ? [i] : []));
    const mode = this.deps.continuation ?? "auto";
    try {
      const found = findExtendedRecord(call.request, history, tools);
      // The extended record's ids: read while the engine renders (awaited only where its ids are
      // needed; in render mode only when a form is to be learned), never left unobserved.
      let reading: ReturnType<SessionStore["recordIds"]> | null = null;
      const readFull = (record: { seq: number; id: string }) => {
        if (!reading) (reading = this.deps.sessions.recordIds(sid, record.seq, record.id)).catch(() => undefined);
        return reading;
      };
      if (found && mode !== "render") void readFull(found.record);
      if (profile.history_normalization === "empirical") {
        let messages = applyNormalizations(history.messages, restored, this.normalizer.learned(call));
        if (found) {
          const learned = await this.normalizer.learn(engineTokenizer, { ...call, request: { ...call.request, messages } }, messages, found.index, () => readFull(found.record));
          if (learned) messages = applyNormalizations(history.messages, restored, this.normalizer.learned(call));
        }
        call.request = { ...call.request, messages };
      }
      if (mode === "render") return null;
      const chosen = caps ? historyRoute(call.target.engine.kind, caps, profile) : { route: null, why: "the engine's capabilities are not known yet" };
      const extended = found ? { record: found.record, index: found.index, full: readFull(found.record) } : null;
      const plan = () =>
        planContinuation({
          mode,
          route: chosen.route,
          ...(chosen.route ? {} : { noRoute: chosen.why }),
          tokenizer: engineTokenizer,
          call,
          request: call.request,
          extended,
        }).then(
          (outcome): TokenIn => {
            if (!outcome.plan || !chosen.route) {
              this.deps.log.debug({ session: sid, seq, why: outcome.plan ? "no route" : outcome.why }, "call rendered by the engine");
              return null;
            }
            this.deps.log.debug({ session: sid, seq, base: outcome.plan.base.seq, diverges_at: outcome.plan.divergesAt, route: chosen.route.name }, "call continues token-in");
            return { route: chosen.route, promptIds: outcome.plan.promptIds, maxModelLen: outcome.plan.maxModelLen, base: outcome.plan.base.seq };
          },
          (err: unknown) => this.planFailed(call, sid, seq, err),
        );
      const planAndNote = () =>
        plan().then((tokenIn) => {
          this.noteKeptChat(sid, tokenIn === null);
          return tokenIn;
        });
      if (!chosen.route || !extended) return await plan();
      if (overlap && mode === "auto" && (this.keptChat.get(sid) ?? expectsChatRoute(call))) {
        // Called after the engine call is sent (answer()): the engine takes the call first. When
        // its first chunk brings its prompt and that continues the recorded call, the chat route
        // was right and no render is asked of the engine; otherwise the plan's renders are made.
        const { full } = extended;
        return {
          planning: async (enginePrompt) => {
            if (enginePrompt && (await this.continuesRecorded(call, enginePrompt, full))) {
              this.deps.log.debug({ session: sid, seq }, "call rendered by the engine: its prompt continues the recorded tokens");
              this.noteKeptChat(sid, true);
              return null;
            }
            return planAndNote();
          },
        };
      }
      return await planAndNote();
    } catch (err) {
      return this.planFailed(call, sid, seq, err);
    }
  }

  /** The session's last plan kept the chat route, or not (bounded: past the cap it starts over). */
  private noteKeptChat(sid: string, kept: boolean): void {
    if (this.keptChat.size >= 4096 && !this.keptChat.has(sid)) this.keptChat.clear();
    this.keptChat.set(sid, kept);
  }

  /** Whether the engine's prompt (null: not told) continues the recorded call's ids; a failed read is a no (the plan decides). */
  private async continuesRecorded(call: EngineCall, enginePrompt: Promise<number[] | null>, full: PromiseLike<BaseIds | null>): Promise<boolean> {
    try {
      const [ids, base] = await Promise.all([enginePrompt, full]);
      return ids !== null && base !== null && (await promptContinues(engineTokenizer, call, base, ids));
    } catch {
      return false;
    }
  }

  private planFailed(call: EngineCall, sid: string, seq: number, err: unknown): null {
    if (call.signal.aborted) throw err;
    this.deps.log.warn({ session: sid, seq, err: (err as Error).message }, "token-in planning failed; the engine renders this call");
    return null;
  }

  /** The engine call of a prepared call: token-in when planned, else the adapter's chat route. */
  private send(call: PreparedCall, signal: AbortSignal, stream: false, onPromptIds?: EngineCall["onPromptIds"]): Promise<EngineResult>;
  private send(call: PreparedCall, signal: AbortSignal, stream: true, onPromptIds?: EngineCall["onPromptIds"]): AsyncGenerator<EngineStreamEvent>;
  private send(call: PreparedCall, signal: AbortSignal, stream: boolean, onPromptIds?: EngineCall["onPromptIds"]): Promise<EngineResult> | AsyncGenerator<EngineStreamEvent> {
    const engineCall: EngineCall = { ...call.engineCall, signal, request: { ...call.engineCall.request, stream } };
    if (onPromptIds) engineCall.onPromptIds = onPromptIds;
    if (call.tokenIn) {
      const tokenInCall: TokenInCall = { ...engineCall, tokenIds: call.tokenIn.promptIds, maxModelLen: call.tokenIn.maxModelLen };
      return stream ? call.tokenIn.route.generateStream(tokenInCall) : call.tokenIn.route.generate(tokenInCall);
    }
    return stream ? call.adapter.chatStream(engineCall) : call.adapter.chat(engineCall);
  }

  /** Prompt tokens of a request on the session's engine (Anthropic count_tokens); records nothing. */
  async countTokens(session: Session, canonical: CanonicalChatRequest, signal: AbortSignal): Promise<number> {
    if (!session.assignment) throw new CallRejected("session has no engine assignment", 500, "no_assignment");
    const target = this.deps.registry.target(session.assignment.engine, session.assignment.dp_rank);
    const adapter = adapterFor(target.engine.kind);
    if (!adapter) throw new CallRejected(`engine kind ${target.engine.kind} is not supported yet`, 501, "engine_unsupported");
    const model = await this.deps.registry.servedModel(session.assignment.engine);
    return adapter.countTokens({ target, model, request: canonical, signal, dispatcher: this.deps.registry.dispatcher });
  }

  /**
   * A non-streamed call: the same call as stream() (one state machine), drained. The engine is
   * still asked for one whole answer (no stream on the wire); the agent gets the final answer.
   */
  async complete(call: PreparedCall): Promise<EngineResult> {
    const events = this.run(call, false);
    for (;;) {
      const next = await events.next();
      if (next.done) return next.value;
    }
  }

  /**
   * Yields the engine's events as they come; the record is written once the stream has ended. An
   * abort-mode pause that cuts the stream is not shown to the agent: its finish is held back, and
   * after resume the answer goes on token-in in the same stream (the agent sees only latency).
   */
  stream(call: PreparedCall): AsyncGenerator<EngineStreamEvent, EngineResult> {
    return this.run(call, true);
  }

  /**
   * One agent call, streamed or not (`streamed` only decides how each engine attempt goes over
   * the wire). Each attempt waits while inference is paused. If an abort-mode pause cuts it (the
   * engine answers finish_reason "abort" with the tokens so far), that finish is held back, the
   * call waits for resume and is continued token-in from those tokens on the same rank (or, if
   * the rank was drained or fails the continuation, on another), so the agent receives one answer.
   * Returns the whole answer at once: its record is written after (PendingCalls), so the agent
   * does not wait for Redis.
   */
  private async *run(call: PreparedCall, streamed: boolean): AsyncGenerator<EngineStreamEvent, EngineResult> {
    const answer = { recorded: false };
    try {
      return yield* this.answer(call, streamed, answer);
    } finally {
      // Failed, refused or left by the agent: no record will come.
      if (!answer.recorded) {
        this.deps.pending.settle(call.session.id, call.seq, call.tokenHash);
        this.holdReleased(call.session.id);
      }
    }
  }

  private async *answer(call: PreparedCall, streamed: boolean, answer: { recorded: boolean }): AsyncGenerator<EngineStreamEvent, EngineResult> {
    // A branch's replayed call: the source's answer, no engine.
    if (call.replay) {
      // An agent that asked for logprobs reads their tokens' text, as it would a sampled answer's.
      // The engine is asked only to spell them: one that cannot leaves them unspelled, not the call failed.
      const texts = call.engineCall.request.client_logprobs
        ? await this.tokenTexts(call.target.engineIndex, call.replay.output_ids).catch((err: Error) => {
            this.deps.log.warn({ session_id: call.session.id, seq: call.seq, err: err.message }, "cannot spell a replayed answer's tokens: its logprobs go without their text");
            return undefined;
          })
        : undefined;
      const result = recordedResult(call.replay, texts);
      if (streamed) yield* resultAsEvents(result);
      this.record(call, result);
      answer.recorded = true;
      return result;
    }
    /** What a streamed agent has been given so far, over every attempt (a cut answer's message). */
    const shown = streamed ? new StreamAccumulator() : null;
    let cut: CutGeneration | null = null;
    let movedAfterFailure = false;
    /** Set once the call was made again on another rank after its own died before answering (once per call). */
    let retriedElsewhere = false;
    /** A streamed agent was sent the answer's start (its first frame): an attempt after it does not send it again. */
    let startShown = false;
    for (;;) {
      const held = Date.now();
      // The gate throws only when the agent leaves while it holds the call (see LeftWhileHeld).
      const slot = await this.deps.pause.enter(call.engineCall.signal, rankMember(call.target.engineIndex, call.target.dpRank)).catch(() => {
        throw new LeftWhileHeld(Date.now() - held);
      });
      // Read once the gate is open: a call that waited through a pause runs on the new weights.
      const version = (call.weightVersion = this.deps.pause.weights);
      if (cut) await this.moveCall(call, { failed: false, retry: false });
      let yielded = false;
      /** What the engine sent on this attempt: its stream's start, and anything of its answer. */
      let startCame = false;
      let answerCame = false;
      let heldFinish = false;
      let piece: EngineResult | null = null;
      // A call whose plan is still being made goes to the chat route now, on a signal of its own.
      const planning = call.planning;
      call.planning = undefined;
      const speculative = planning ? new AbortController() : null;
      // The engine's prompt ids, where its first chunk tells them (before the answer is complete).
      const told = planning && call.adapter.tellsPromptFirst(call.engineCall, streamed) ? promptIdsTold() : null;
      const events = this.attempt(call, cut, speculative ? AbortSignal.any([slot.signal, speculative.signal]) : slot.signal, streamed, told?.tell);
      try {
        const first = events.next();
        if (planning) {
          // Its first event (or whole answer) waits for the plan; a token-in plan drops it all:
          // the engine call is aborted, nothing of it is shown or recorded, and the call is sent
          // token-in (under another request id: the engine may not have let go of this one yet).
          first.catch(() => undefined);
          // The ids come before the first event, if at all: a call that ends or fails first told none.
          const tokenIn = await planning(told && Promise.race([told.ids, first.then(noIds, noIds)]));
          if (tokenIn) {
            speculative!.abort();
            await first.catch(() => undefined);
            call.tokenIn = tokenIn;
            call.engineCall = { ...call.engineCall, requestId: `${call.engineCall.requestId}-ti` };
            continue;
          }
        }
        for (let next = await first; ; next = await events.next()) {
          if (next.done) {
            piece = next.value;
            break;
          }
          const event = next.value;
          if (event.type === "start") startCame = true;
          else answerCame = true;
          if (event.type === "finish" && event.finish_reason === "abort") {
            if (this.canContinue(call) && (await this.cutByPause(event.finish_reason, slot))) heldFinish = true;
            // Cut short by the engine itself (another controller paused or aborted it, or it is
            // shutting down): the tokens so far are not the policy's answer, and every protocol
            // would show them as a finished turn. The call fails as the engine's (a lost call).
            else throw new EngineError(ABORTED, 502, "rejected");
          } else if (event.type === "finish") {
            // vLLM's "error" (the request failed part way) or any reason that is not the end of an answer.
            checkFinish(event.finish_reason);
            // The last token's version as it would be recorded: stamped as it came, or the attempt's.
            this.checkEngineWeights(call, event.engine_weight_version, call.engineCall.stamp ? this.deps.pause.weights : version);
          }
          // The agent already has its start; usage is told once, for the whole answer.
          if ((event.type === "start" && (cut || startShown)) || (event.type === "usage" && (heldFinish || cut)) || heldFinish) continue;
          shown?.push(event);
          yielded = true;
          if (event.type === "start") startShown = true;
          yield event;
        }
      } catch (err) {
        // A cut call whose rank failed while paused goes on elsewhere (once): it has tokens to
        // keep, if the agent has seen nothing of the continuation yet.
        if (cut && !yielded && !movedAfterFailure && rankFailed(err) && (await this.moveCall(call, { failed: true, retry: false }))) {
          movedAfterFailure = true;
          continue;
        }
        const from = call.target;
        // A rank that died before it answered anything of the call (the agent has at most the
        // answer's start): the call is made again on another healthy rank, once, instead of being
        // lost. Not a cut call (it has tokens of its own), nor one whose engine answered anything.
        const died = !cut && !answerCame && !retriedElsewhere ? diedBeforeAnswer(err, streamed, startCame) : null;
        if (died || (err instanceof EngineError && err.kind === "unreachable")) this.deps.rankUnreachable?.(rankMember(from.engineIndex, from.dpRank));
        if (died && (await this.moveCall(call, { failed: true, retry: true }))) {
          retriedElsewhere = true;
          this.deps.countRetry?.(from.engineIndex, from.dpRank, died);
          this.deps.log.warn(
            { session: call.session.id, seq: call.seq, from: { engine: from.engineIndex, dp_rank: from.dpRank }, to: { engine: call.target.engineIndex, dp_rank: call.target.dpRank }, reason: died, err: (err as Error).message },
            "a call's rank failed before answering anything: the call is made again on another rank",
          );
          continue;
        }
        await this.noteFailure(call, err);
        throw err;
      } finally {
        // Left early (the agent went away, or a step here failed): the engine's stream is closed
        // too, as a for-await loop would, before the slot is given back.
        try {
          await events.return(null);
        } finally {
          slot.release();
        }
      }
      // Only a continuation whose budget was spent has no answer of its own (and is not cut).
      if (heldFinish && piece) {
        cut = addCut(cut, piece, version);
        continue;
      }
      // The agent got the cut pieces and the rest as one answer: it is recorded as one, and a
      // streamed agent is told its usage once, for the whole of it.
      const result = cut ? await this.joinCut(call, cut, piece, version, shown?.result() ?? null) : piece!;
      if (cut) yield { type: "usage", usage: result.usage };
      this.record(call, result);
      answer.recorded = true;
      return result;
    }
  }

  /**
   * One engine attempt of a call: its events, returning the engine's whole answer (null: a cut
   * call whose max_tokens was already spent, which ends on "length"). Streamed, the events come as
   * the engine sends them; else the engine's one answer is told as events once it has arrived.
   */
  private async *attempt(
    call: PreparedCall,
    cut: CutGeneration | null,
    signal: AbortSignal,
    streamed: boolean,
    onPromptIds?: EngineCall["onPromptIds"],
  ): AsyncGenerator<EngineStreamEvent, EngineResult | null> {
    const next = cut ? await this.continuationCall(call, cut, signal, streamed) : null;
    if (cut) {
      this.deps.log.info({ session: call.session.id, seq: call.seq, tokens_so_far: cut.outputIds.length }, streamed ? "continuing a stream cut by a pause" : "continuing a call cut by a pause");
      if (!next) {
        yield { type: "finish", finish_reason: "length", stop_reason: null };
        return null;
      }
    }
    // Whatever the engine sent is checked before the agent is shown any of it (answer-check.ts).
    const vocabSize = call.target.profile.vocab_size;
    if (!streamed) {
      const result = next ? await next.route.generate(next.call) : await this.send(call, signal, false, onPromptIds);
      checkAnswer(result, vocabSize);
      yield* resultAsEvents(result);
      return result;
    }
    const piece = new StreamAccumulator();
    let logprobsSoFar = 0;
    // A continuation's parser is primed with the text the agent already has.
    const events = next && cut ? next.route.generateStream({ ...next.call, primeText: await engineTokenizer.detokenize(next.call, cut.outputIds) }) : this.send(call, signal, true, onPromptIds);
    for await (const event of events) {
      if (event.type === "delta") {
        checkOutputPiece(event.token_ids, event.logprobs, vocabSize, logprobsSoFar);
        logprobsSoFar += event.logprobs.length;
      }
      piece.push(event);
      yield event;
    }
    if (!piece.isFinished) throw new EngineError("the engine stream ended without a finish reason", 502, "bad_response");
    const result = piece.result();
    checkAnswer(result, vocabSize, true);
    return result;
  }

  /**
   * Moves a call with its session to another rank. A cut call goes on where it was, unless its
   * rank was drained during the pause or (`failed`) just failed the continuation: then it moves
   * like its session (the new rank prefills prompt + tokens so far). A call whose rank died before
   * answering anything (`retry`) is made again there. The record says where it came from. False
   * when there was nowhere to go.
   */
  private async moveCall(call: PreparedCall, { failed, retry }: { failed: boolean; retry: boolean }): Promise<boolean> {
    const moved = failed ? await this.deps.rerouter.moveOff(call.session) : await this.deps.rerouter.ensureHealthy(call.session);
    const { session, reroutedFrom } = moved;
    if (!reroutedFrom || !session.assignment) return false;
    const target = this.deps.registry.target(session.assignment.engine, session.assignment.dp_rank);
    const adapter = adapterFor(target.engine.kind);
    if (!adapter) return false;
    // A call made again keeps its prompt: sent as token ids (token-in) or with its ids on the chat
    // route, those ids and their route hold only on an engine of the same kind and profile.
    const sameEngine = target.engine.kind === call.target.engine.kind && target.profile.name === call.target.profile.name;
    if (retry && (call.tokenIn || call.engineCall.promptIds) && !sameEngine) return false;
    if (!retry) this.deps.log.info({ session: session.id, seq: call.seq, from: reroutedFrom, to: target.dpRank, failed }, "a cut call moves to another rank");
    const model = await this.servedModel(session.assignment.engine);
    // Another request id: the failed rank may share its engine with the new one, and may not have let go of the first.
    const requestId = retry ? `${call.engineCall.requestId}-retry` : call.engineCall.requestId;
    Object.assign(call, { session, target, adapter, reroutedFrom: call.reroutedFrom ?? reroutedFrom, engineCall: { ...call.engineCall, target, model, requestId } });
    return true;
  }

  /** An engine answer ended by a pause (not refused or cut for another reason). */
  private async cutByPause(finishReason: string, slot: GateSlot): Promise<boolean> {
    return finishReason === "abort" && (await this.deps.pause.cutByPause(slot));
  }

  /**
   * Whether an answer a pause cut can be continued: only where the model profile declares a gateway
   * parser (the whole answer's text is parsed again). Otherwise the cut answer is the answer.
   */
  private canContinue(call: PreparedCall): boolean {
    return cutContinuationRoute(call.target.engine.kind, call.target.profile) !== null;
  }

  /** The token-in call that continues a cut answer, or null when its max_tokens is already spent. */
  private async continuationCall(call: PreparedCall, cut: CutGeneration, signal: AbortSignal, stream: boolean): Promise<{ route: TokenInRoute; call: TokenInCall } | null> {
    const route = cutContinuationRoute(call.target.engine.kind, call.target.profile);
    if (!route) throw new EngineError(`the ${call.target.profile.name} profile declares no gateway parser: a cut answer cannot be continued`, 502, "rejected");
    const request = continuationRequest(cut, call.engineCall.request);
    if (!request) return null;
    const { promptIds: _chatPrompt, ...engineCall } = call.engineCall;
    const base = { ...engineCall, signal, requestId: `${call.engineCall.requestId}-cont${cut.cuts}`, request: { ...request, stream } };
    const maxModelLen = request.sampling.max_tokens === undefined ? await engineTokenizer.maxModelLen(base) : null;
    return { route, call: { ...base, tokenIds: continuationPrompt(cut), maxModelLen } };
  }

  /**
   * The whole answer of a continued call: every piece's tokens; the message is what a streamed
   * agent was shown (`shown`: its pieces were parsed with the text before them), else it is parsed
   * from the whole text.
   */
  private async joinCut(call: PreparedCall, cut: CutGeneration, rest: EngineResult | null, version: WeightVersion, shown: EngineResult | null): Promise<EngineResult> {
    let answer = shown ? { message: shown.message, finish_reason: shown.finish_reason } : null;
    if (!answer) {
      const text = await engineTokenizer.detokenize(call.engineCall, cut.outputIds.concat(rest?.output_ids ?? []));
      answer = parseAnswer(call.engineCall, text, rest?.finish_reason ?? "length");
    }
    const { result, versions } = joinContinuation(cut, rest, version, answer);
    call.continued = { cuts: cut.cuts, versions };
    return result;
  }

  /**
   * An engine failure leaves a note on the session (the trajectory's stats list it); a client that
   * left does not. The note is a detail: a write that fails is logged and counted, and the agent
   * still gets the engine's error (whether the call is lost is decided where it is answered).
   */
  private async noteFailure(call: PreparedCall, err: unknown): Promise<void> {
    if (!(err instanceof EngineError)) return;
    const failure = { seq: call.seq, at: new Date().toISOString(), kind: err.kind, message: err.message, dp_rank: call.target.dpRank };
    try {
      await this.deps.sessions.appendFailure(call.session.id, failure);
    } catch (writeErr) {
      this.deps.countError?.("failed_call_note");
      this.deps.log.warn({ session_id: call.session.id, seq: call.seq, failure, err: (writeErr as Error).message }, "cannot note a failed engine call on its session");
    }
  }

  /**
   * The engine's own weight version of an answer (SGLang tells it with each one) against the one
   * the gateway records for its last token. Where the gateway loaded that version onto this engine
   * the two agree, unless the engine restarted (or was reloaded behind the gateway) on other
   * weights: its tokens were then not sampled by the policy version the record would name. Such an
   * answer is not recorded under the gateway's version: the call fails as lost (its rollout is
   * retried, not trained on), and the engine's ranks are drained until its weights are loaded
   * again (once the health check confirms it: this replica may be the one behind). Where the
   * gateway did not load the weights (a version set without `load`), the engine's label names
   * nothing the gateway knows, and the call is recorded as before.
   */
  private checkEngineWeights(call: PreparedCall, engineVersion: string | undefined, recorded: string | null): void {
    if (engineVersion === undefined || recorded === null || engineVersion === recorded) return;
    if (!this.deps.loadedWeights?.loadedOn(call.target.engineIndex, recorded)) return;
    const why = `the engine reports weight version ${engineVersion}, not ${recorded} which it loaded: it restarted on other weights (pause, load the weights again, resume)`;
    this.deps.log.warn({ engine: call.target.engine.url, dp_rank: call.target.dpRank, engine_weight_version: engineVersion, weight_version: recorded }, "an engine answered from other weights than it was loaded with: the call is lost and the engine drained");
    this.deps.staleWeights?.(call.target.engineIndex);
    throw new EngineError(
      `engine ${call.target.engine.url}: ${why}; the answer is not recorded`,
      502,
      "rejected",
      `the engine answered from weights other than the policy version ${recorded}: the answer is not recorded`,
    );
  }

  /**
   * The weight versions of a call's tokens: from the continuation of a cut call, else from the
   * stamps an answer read as it arrived carries (a freeze-in-place pause changed the weights inside
   * the call when they differ), else the version the call started under.
   */
  private versionsOf(call: PreparedCall, result: EngineResult): { weight_version: WeightVersion; output_weight_versions?: WeightVersion[] } {
    if (call.continued) return { weight_version: call.weightVersion, output_weight_versions: call.continued.versions };
    const stamps = result.output_versions;
    if (!stamps || stamps.length === 0 || stamps.length !== result.output_ids.length) return { weight_version: call.weightVersion };
    const last = stamps.at(-1) ?? null;
    return stamps.every((v) => v === last) ? { weight_version: last } : { weight_version: last, output_weight_versions: stamps };
  }

  /**
   * Writes the call's record and task event once the agent's answer has gone out (the next turn
   * of the event loop); the session's readers and its next call wait for it (PendingCalls).
   */
  private record(call: PreparedCall, result: EngineResult): void {
    const record = this.recordOf(call, result);
    // Told now: the request's metrics (its engine time) are read when its answer ends.
    this.deps.observe?.(record, call);
    const written = new Promise<void>((resolve, reject) => {
      setImmediate(() => {
        this.write(call, record).then(resolve, reject);
      });
    });
    this.deps.pending.track(call.session.id, call.seq, written);
    // Its tokens are in the session's counts once stored, in the step that drops its hold on the budget.
    const release = () => this.holds.released(call.session.id);
    written.then(release, release);
  }

  private recordOf(call: PreparedCall, result: EngineResult): CompletionRecord {
    const { request } = call.engineCall;
    const source = call.replay;
    // A replayed answer was sampled where and under the weights its source was.
    const versions = source
      ? { weight_version: source.weight_version, ...(source.output_weight_versions ? { output_weight_versions: source.output_weight_versions } : {}) }
      : this.versionsOf(call, result);
    const record: CompletionRecord = {
      id: `cmpl-${randomUUID()}`,
      session_id: call.session.id,
      seq: call.seq,
      created_at: new Date(call.startedAt).toISOString(),
      protocol: call.protocol,
      engine: source?.engine ?? call.target.engine.url,
      dp_rank: source?.dp_rank ?? call.target.dpRank,
      weight_version: versions.weight_version,
      request: {
        messages: request.messages,
        // A replayed answer's tokens and logprobs were drawn with its source's sampling, not this session's.
        sampling: source ? source.request.sampling : request.sampling,
        ...(request.tools ? { tools: request.tools } : {}),
        ...(request.tool_choice ? { tool_choice: request.tool_choice } : {}),
        ...(request.enable_thinking !== undefined ? { enable_thinking: request.enable_thinking } : {}),
        ...(request.chat_template_kwargs !== undefined ? { chat_template_kwargs: request.chat_template_kwargs } : {}),
        ...(request.reasoning_effort !== undefined ? { reasoning_effort: request.reasoning_effort } : {}),
      },
      prompt_ids: result.prompt_ids,
      output_ids: result.output_ids,
      output_logprobs: result.output_logprobs,
      finish_reason: result.finish_reason,
      message: result.message,
      // The reasoning count is kept with the answer: a branch replaying it has no token text to count from.
      usage: recordedUsage(result, call.target.profile.reasoning_end),
      latency_ms: Date.now() - call.startedAt,
      ...(call.reroutedFrom ? { rerouted_from: call.reroutedFrom } : {}),
      ...(versions.output_weight_versions ? { output_weight_versions: versions.output_weight_versions } : {}),
      ...(call.continued ? { continued_after_pause: call.continued.cuts } : {}),
      ...(result.routed_experts ? { routed_experts: result.routed_experts } : {}),
      ...(source ? { replayed_from: source.id } : {}),
    };
    return record;
  }

  private async write(call: PreparedCall, record: CompletionRecord): Promise<void> {
    const taskId = call.session.metadata.task_id;
    // The record and the task's progress event are written together (one round trip's wait).
    await Promise.all([
      this.deps.sessions.appendRecord(record, recordHead(record, call.toolsText), call.tokenHash).then((stored) => {
        // The session was deleted (or made again under its id) while the call ran: its record is nobody's.
        if (!stored) this.deps.log.warn({ session_id: record.session_id, seq: record.seq }, "a call's session was deleted while it ran: its record is dropped");
      }),
      typeof taskId === "string"
        ? // Fenced on the session: a call of an attempt another took over (or of a task that ended) is not the task's progress.
          this.deps.tasks.appendAttemptEvent(taskId, record.session_id, "llm_call", {
            seq: record.seq,
            prompt_tokens: record.usage.prompt_tokens,
            completion_tokens: record.usage.completion_tokens,
            cached_tokens: record.usage.cached_tokens,
            finish_reason: record.finish_reason,
            latency_ms: record.latency_ms,
            // A branch's replayed call: its tokens are its source's, not the engine's work now.
            ...(record.replayed_from ? { replayed: true } : {}),
          })
        : null,
    ]);
  }
}
