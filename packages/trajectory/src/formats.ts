import type { RoutedExperts, Trace, Trajectory } from "@rollgate/protocol";

/**
 * Output adapters: one training sample per trace, in the shape each trainer consumes. Arrays are
 * unpadded per sample (each trainer pads its own batch). Every adapter keeps mask-1 logprobs exactly
 * as the engine gave them and mask-0 positions at 0. When the engine sent routed experts (R3), each
 * sample carries them for prompt + response (every position but the last; protocol
 * routed-experts.ts): verl and prime-rl as `routed_experts`, slime as `rollout_routed_experts`
 * (its `Sample` field).
 */

export const TRAINER_FORMATS = ["rollgate", "verl", "slime", "prime-rl"] as const;
export type TrainerFormat = (typeof TRAINER_FORMATS)[number];

/**
 * verl: the agent loop's `AgentLoopOutput` (`prompt_ids`, `response_ids`, `response_mask`,
 * `response_logprobs` exported as `rollout_log_probs`) as verl PR #5931's `TrajectoryAssembler`
 * batches it into `prompts` / `responses` / `response_mask` / `rollout_log_probs` (the rollout
 * logprobs verl's rollout correction #2953/#3694 consumes). Source: verl-project/verl PR #5931 and its agent loop.
 */
export interface VerlSample {
  prompts: number[];
  responses: number[];
  response_mask: (0 | 1)[];
  rollout_log_probs: number[];
  routed_experts?: RoutedExperts;
}

/**
 * slime: one `Sample` per trace, as Polar's `slime_bridge` builds them and slime's own
 * OpenAI/Anthropic adapters return `list[Sample]` (THUDM/slime, `Sample`): `tokens` is prompt + response, `response_length`
 * the response's length, and `loss_mask` / `rollout_log_probs` cover the response tokens only.
 * `status` is `Sample.Status`'s value as slime sets it from the last call's finish reason
 * (`length` → truncated, `abort` → aborted, else completed); `Sample.from_dict` requires it.
 */
export interface SlimeSample {
  tokens: number[];
  response_length: number;
  loss_mask: (0 | 1)[];
  rollout_log_probs: number[];
  status: "completed" | "truncated" | "aborted" | "failed";
  rollout_routed_experts?: RoutedExperts;
}

/**
 * prime-rl: the `tokens` of a verifiers `TrajectoryStep` (`TokensResponse`: `prompt_ids`,
 * `prompt_mask` all 0, `completion_ids`, `completion_mask`, `completion_logprobs`, `overlong_prompt`
 * (always false: a prompt over the context is refused and leaves no record), `is_truncated`),
 * which prime-rl's orchestrator (`orchestrator/trajectories.py`, `interleave_rollout`) trains on.
 * Source: PrimeIntellect-ai/verifiers and PrimeIntellect-ai/prime-rl.
 */
export interface PrimeRlSample {
  prompt_ids: number[];
  prompt_mask: 0[];
  completion_ids: number[];
  completion_mask: (0 | 1)[];
  completion_logprobs: number[];
  overlong_prompt: false;
  is_truncated: boolean;
  routed_experts?: RoutedExperts;
}

export interface TrainerFormatMap {
  rollgate: Trajectory;
  verl: VerlSample[];
  slime: SlimeSample[];
  "prime-rl": PrimeRlSample[];
}

function verl(t: Trace): VerlSample {
  return {
    prompts: t.prompt_ids.slice(),
    responses: t.response_ids.slice(),
    response_mask: t.loss_mask.slice(),
    rollout_log_probs: t.response_logprobs.slice(),
    ...(t.routed_experts ? { routed_experts: t.routed_experts } : {}),
  };
}

function slimeStatus(finishReason: string): SlimeSample["status"] {
  if (finishReason === "length") return "truncated";
  if (finishReason === "abort") return "aborted";
  if (finishReason === "error") return "failed";
  return "completed";
}

function slime(t: Trace): SlimeSample {
  return {
    tokens: t.prompt_ids.concat(t.response_ids),
    response_length: t.response_ids.length,
    loss_mask: t.loss_mask.slice(),
    rollout_log_probs: t.response_logprobs.slice(),
    status: slimeStatus(t.finish_reason),
    ...(t.routed_experts ? { rollout_routed_experts: t.routed_experts } : {}),
  };
}

function primeRl(t: Trace): PrimeRlSample {
  return {
    prompt_ids: t.prompt_ids.slice(),
    prompt_mask: t.prompt_ids.map(() => 0 as const),
    completion_ids: t.response_ids.slice(),
    completion_mask: t.loss_mask.slice(),
    completion_logprobs: t.response_logprobs.slice(),
    overlong_prompt: false,
    is_truncated: t.finish_reason === "length",
    ...(t.routed_experts ? { routed_experts: t.routed_experts } : {}),
  };
}

/** The trajectory in `format`; `rollgate` is the trajectory itself (traces + stats). */
export function toTrainerFormat<F extends TrainerFormat>(trajectory: Trajectory, format: F): TrainerFormatMap[F] {
  const out: { [K in TrainerFormat]: () => TrainerFormatMap[K] } = {
    rollgate: () => trajectory,
    verl: () => trajectory.traces.map(verl),
    slime: () => trajectory.traces.map(slime),
    "prime-rl": () => trajectory.traces.map(primeRl),
  };
  const make = out[format];
  if (make === undefined) throw new TypeError(`unknown trainer format ${String(format)}; use one of ${TRAINER_FORMATS.join(", ")}`);
  return make();
}
