import type { EngineResult } from "@rollgate/transforms";
import { EngineError } from "./errors.js";

/**
 * What an engine's answer must be to be a sample of the policy, checked before any of it is shown
 * or recorded: each id a token of the model's vocabulary (an integer in [0, vocab_size), any
 * non-negative integer when the profile does not say), each logprob a log-probability (finite and
 * at most 0: a positive one is a logit, as vLLM's `--logprobs-mode raw_logits` sends), one logprob
 * per output token, a prompt of at least one token, and no text without any token. An answer that
 * is not fails the call (a lost call) rather than being recorded: the trajectory's checks would
 * refuse it only later, after the rollout it belongs to was scored, and a positive logprob would
 * pass them.
 */

const badAnswer = (what: string) => new EngineError(`the engine's answer is not a sample of the model: ${what}`, 502, "bad_response");

function checkIds(ids: readonly number[], vocabSize: number | null, what: string): void {
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    if (!Number.isInteger(id) || id < 0 || (vocabSize !== null && id >= vocabSize)) {
      throw badAnswer(`${what}[${i}] = ${id} is not a token id in [0, ${vocabSize ?? "∞"})`);
    }
  }
}

function checkLogprob(lp: number, position: number): void {
  if (!Number.isFinite(lp) || lp > 0) throw badAnswer(`output token ${position} has logprob ${lp}, not a log-probability`);
}

/** One streamed piece of an answer: its output ids and their logprobs (`from`: how many tokens came before it). */
export function checkOutputPiece(ids: readonly number[], logprobs: readonly { logprob: number }[], vocabSize: number | null, from: number): void {
  checkIds(ids, vocabSize, "output_ids");
  for (let i = 0; i < logprobs.length; i++) checkLogprob(logprobs[i]!.logprob, from + i);
}

/**
 * A whole answer, as it is about to be shown whole or recorded. `piecesChecked`: its output came
 * as streamed pieces, each already checked (checkOutputPiece); only the rest is checked here.
 */
export function checkAnswer(result: EngineResult, vocabSize: number | null, piecesChecked = false): void {
  if (result.prompt_ids.length === 0) throw badAnswer("its prompt has no token ids");
  // Text comes from tokens: an engine may send text after the tokens it came from (a parser that
  // held it), never text with none at all.
  const m = result.message;
  if (result.output_ids.length === 0 && (m.content || m.reasoning || m.tool_calls.length > 0)) throw badAnswer("its text came with no token ids");
  if (result.output_logprobs.length !== result.output_ids.length) {
    throw badAnswer(`${result.output_ids.length} output ids but ${result.output_logprobs.length} logprobs`);
  }
  checkIds(result.prompt_ids, vocabSize, "prompt_ids");
  if (piecesChecked) return;
  checkIds(result.output_ids, vocabSize, "output_ids");
  for (let i = 0; i < result.output_logprobs.length; i++) checkLogprob(result.output_logprobs[i]!, i);
}

/**
 * The finish reasons that end an answer of the model: its own end of turn ("stop", and the chat
 * route's "tool_calls") or a limit on its length ("length"). vLLM's "repetition" (its opt-in
 * `repetition_detection` cut a looping answer) is a length limit too: it comes here as "length"
 * (engineFinish). Anything else is not an answer: "abort" (handled apart: a pause's cut is
 * continued), vLLM's "error" (a request-level failure, retryable), SGLang's `{type: "abort"}` with
 * an error, or a reason a newer engine added. Shown to an agent, such an answer would be a finished
 * turn the reward scores; it fails the call instead (502, a lost call the agent may retry).
 */
const ANSWER_FINISHES: ReadonlySet<string> = new Set(["stop", "length", "tool_calls"]);

/** An engine's finish reason as the gateway tells it: vLLM's "repetition" is a cut by a limit, as "length". */
export function engineFinish(reason: string): string {
  return reason === "repetition" ? "length" : reason;
}

/**
 * The finish reason of an answer one of the agent's stop strings ended (`stopReason`: the engine's
 * matched stop, vLLM's `stop_reason`, SGLang's `matched_stop`; a string only for a stop string).
 * The chat routes say "tool_calls" once a call was parsed, even when the stop string cut it; the
 * agent is told "stop" (its stop sequence), never "tool_calls", which would have it run a cut call.
 */
export function stopStringFinish(reason: string, stopReason: string | number | null | undefined): string {
  return reason === "tool_calls" && typeof stopReason === "string" ? "stop" : reason;
}

/** Fails the call unless `reason` ends an answer of the model (ANSWER_FINISHES). */
export function checkFinish(reason: string): void {
  if (ANSWER_FINISHES.has(reason)) return;
  throw new EngineError(`the engine ended the call with finish_reason ${JSON.stringify(reason)}, which does not end an answer of the model: its answer is not recorded`, 502, "rejected");
}
