"""GRPO helpers: a group's rewards → advantages, and a group's trajectories → the arrays one
policy-gradient step consumes. Plain lists; no numpy needed (``numpy.asarray`` takes them as is).

A member that did not complete (failed, timed out, cancelled, no callback) or has no reward is
left out of the group's statistics and of the step, and the result says which and why: training
on an infrastructure failure as if the policy had earned reward 0 would teach the wrong thing.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .routing import decode_routed_experts

JSON = Dict[str, Any]
METHODS = ("mean_std", "mean", "leave_one_out")


@dataclass(frozen=True)
class GroupAdvantages:
    """One advantage per group member (None for a member left out), and how they were made."""

    advantages: List[Optional[float]]
    method: str
    mean: Optional[float]
    std: Optional[float]
    # member index → why it was left out
    excluded: Dict[int, str] = field(default_factory=dict)

    @property
    def included(self) -> List[int]:
        return [i for i, a in enumerate(self.advantages) if a is not None]

    @property
    def zero_variance(self) -> bool:
        """Every included member got the same reward: the group carries no learning signal."""
        return bool(self.included) and all(self.advantages[i] == 0.0 for i in self.included)

    def describe(self) -> str:
        parts = ["%d/%d members" % (len(self.included), len(self.advantages))]
        if self.mean is not None:
            parts.append("mean %.4f" % self.mean)
        if self.std is not None:
            parts.append("std %.4f" % self.std)
        if self.zero_variance:
            parts.append("no signal (equal rewards)")
        for i, why in sorted(self.excluded.items()):
            parts.append("member %d left out: %s" % (i, why))
        return ", ".join(parts)


def advantages(
    rewards: Sequence[Optional[float]],
    method: str = "mean_std",
    eps: float = 1e-6,
    ddof: int = 1,
    excluded: Optional[Mapping[int, str]] = None,
) -> GroupAdvantages:
    """Advantages of one group's rewards.

    ``method``:
      ``mean_std``: ``(r - mean) / (std + eps)`` (GRPO, DeepSeekMath). ``std`` uses ``ddof`` (1, the
        sample std, as verl's and TRL's ``torch.std``; 0 for the population std).
      ``mean``: ``r - mean`` (Dr. GRPO: no std normalisation).
      ``leave_one_out``: ``r_i - mean of the others`` (RLOO).
    A reward of None (and any index in ``excluded``) is left out: its advantage is None and the
    statistics use the others. With fewer than two members left, every advantage is 0.
    """
    if method not in METHODS:
        raise ValueError("method must be one of %s, got %r" % (", ".join(METHODS), method))
    why: Dict[int, str] = dict(excluded or {})
    values: Dict[int, float] = {}
    for i, r in enumerate(rewards):
        if i in why:
            continue
        if r is None:
            why[i] = "no reward"
        elif isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r):
            # numbers.Real: numpy's int64 / float32 rewards count too (neither is an int or a float).
            why[i] = "reward %r is not a finite number" % (r,)
        else:
            values[i] = float(r)
    n = len(values)
    out: List[Optional[float]] = [None] * len(rewards)
    if n == 0:
        return GroupAdvantages(out, method, None, None, why)
    if len(set(values.values())) == 1:
        # Equal rewards carry no signal: exactly 0, which float sums do not give (3 x 0.1 averages to 0.10000000000000002).
        only = next(iter(values.values()))
        for i in values:
            out[i] = 0.0
        return GroupAdvantages(out, method, only, 0.0, why)
    mean = math.fsum(values.values()) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values.values()) / (n - ddof)) if n - ddof > 0 else 0.0
    for i, r in values.items():
        if n < 2:
            out[i] = 0.0
        elif method == "mean_std":
            out[i] = (r - mean) / (std + eps)
        elif method == "mean":
            out[i] = r - mean
        else:
            out[i] = r - (mean * n - r) / (n - 1)
    return GroupAdvantages(out, method, mean, std, why)


def member_problem(result: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why a group member's result cannot be trained on, or None when it can."""
    if result is None:
        return "no result (its callback never came)"
    status = result.get("status")
    if status != "completed":
        err = result.get("error") or {}
        detail = ": %s: %s" % (err.get("kind"), err.get("message")) if err else ""
        return "%s%s" % (status, detail)
    if result.get("reward") is None:
        return "completed without a reward (no evaluator?)"
    lost = _lost_calls(result)
    if lost:
        # A result put together from a session (the session API): a lost call's tokens may be
        # missing from the traces, so the rollout is not whole. Tasks never score such a rollout.
        first = lost.get("first") or {}
        return "lost %d call(s) to infrastructure (first: %s: %s): the trajectory is not whole" % (lost["count"], first.get("kind"), first.get("message"))
    return None


def _lost_calls(result: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    trajectory = result.get("trajectory")
    stats = trajectory.get("stats") if isinstance(trajectory, Mapping) else None
    lost = stats.get("lost_calls") if isinstance(stats, Mapping) else None
    return lost if isinstance(lost, Mapping) and lost.get("count") else None


def _grader_failed(result: Optional[Mapping[str, Any]]) -> bool:
    return bool(result) and result.get("status") == "failed" and (result.get("error") or {}).get("kind") == "evaluator_error"


def group_advantages(
    results: Sequence[Optional[Mapping[str, Any]]],
    method: str = "mean_std",
    eps: float = 1e-6,
    ddof: int = 1,
    evaluator_error_reward: Optional[float] = None,
) -> GroupAdvantages:
    """Advantages of a group from its task results (as ``wait_group`` returns them), failed members left out and said so.

    ``evaluator_error_reward``: the reward of a member whose grader failed (``evaluator_error``)
    instead of leaving it out. An agent can break its grader (delete what it reads, ``chmod`` its
    folder); left out, that escapes a bad score, so set it to the task's lowest reward when the
    graders are sound and only an agent can make them fail.
    """
    scored = {i for i, r in enumerate(results) if evaluator_error_reward is not None and _grader_failed(r)}
    excluded = {i: p for i, p in ((i, member_problem(r)) for i, r in enumerate(results)) if p is not None and i not in scored}
    rewards = [evaluator_error_reward if i in scored else None if i in excluded or r is None else r.get("reward") for i, r in enumerate(results)]
    return advantages(rewards, method=method, eps=eps, ddof=ddof, excluded=excluded)


@dataclass
class StepBatch:
    """The arrays of one step, one sample per trace of every included member.

    Each sample: ``input_ids`` (prompt + response token ids), ``loss_mask`` (1 on tokens the policy
    sampled, 0 on prompt, tool results and template glue), ``old_logprobs`` (the engine's logprob of
    each sampled token, 0 elsewhere), ``advantages`` (the member's advantage on every trainable token,
    0 elsewhere), ``weight_versions`` (the policy version that sampled each token, None on the
    prompt: mask stale tokens with it), ``prompt_length``, ``task_id``, ``member``, ``trace``,
    ``kind`` (the trace's kind: ``main``, ``sub_agent``, ``compaction`` or ``side_request``, to weight
    or drop some, docs/trace-kinds.md); and,
    when the engine sent them, ``routed_experts`` (one row per input position but the last, decoded
    by ``rollgate.decode_routed_experts``) for routing replay.
    """

    samples: List[JSON]
    # task id (or "<group id> member <k>" for a member without a result) → why it is not in the step
    skipped: Dict[str, str] = field(default_factory=dict)

    def column(self, name: str) -> List[Any]:
        return [s[name] for s in self.samples]

    @property
    def input_ids(self) -> List[List[int]]:
        return self.column("input_ids")

    @property
    def loss_mask(self) -> List[List[int]]:
        return self.column("loss_mask")

    @property
    def old_logprobs(self) -> List[List[float]]:
        return self.column("old_logprobs")

    @property
    def advantages(self) -> List[List[float]]:
        return self.column("advantages")

    @property
    def trainable_tokens(self) -> int:
        return sum(sum(m) for m in self.loss_mask)

    def extend(self, other: "StepBatch") -> "StepBatch":
        self.samples.extend(other.samples)
        self.skipped.update(other.skipped)
        return self


def step_batch(results: Sequence[Optional[Mapping[str, Any]]], adv: GroupAdvantages) -> StepBatch:
    """A group's trajectories → the step's arrays (see ``StepBatch``); members without an advantage are skipped."""
    if len(results) != len(adv.advantages):
        raise ValueError("results (%d) and advantages (%d) are not of one group" % (len(results), len(adv.advantages)))
    batch = StepBatch([])
    # A member without a result has no id: it is named by its group (any member's) and number, so
    # the members missing from two groups do not share one key when batches are extended.
    group = next((r.get("group_id") for r in results if r and r.get("group_id")), None)
    for member, (result, a) in enumerate(zip(results, adv.advantages)):
        task_id = str(result.get("id")) if result else ("%s member %d" % (group, member) if group else "member %d" % member)
        if a is None:
            batch.skipped[task_id] = adv.excluded.get(member, "no advantage")
            continue
        trajectory = result.get("trajectory") if result else None
        traces = trajectory.get("traces") if isinstance(trajectory, Mapping) else None
        if not traces:
            batch.skipped[task_id] = "no trajectory (the agent made no LLM call?)"
            continue
        for k, trace in enumerate(traces):
            prompt = list(trace["prompt_ids"])
            mask = [int(m) for m in trace["loss_mask"]]
            pad = [0] * len(prompt)
            routed = trace.get("routed_experts")
            batch.samples.append(
                {
                    **({"routed_experts": decode_routed_experts(routed)} if routed else {}),
                    "task_id": task_id,
                    "member": member,
                    "trace": k,
                    # A trajectory from a gateway older than trace kinds has none: its traces are main ones.
                    "kind": trace.get("kind", "main"),
                    "prompt_length": len(prompt),
                    "input_ids": prompt + list(trace["response_ids"]),
                    "loss_mask": pad + mask,
                    "old_logprobs": [0.0] * len(prompt) + [float(lp) for lp in trace["response_logprobs"]],
                    "advantages": [0.0] * len(prompt) + [a if m else 0.0 for m in mask],
                    "weight_versions": [None] * len(prompt) + list(trace["weight_versions"]),
                }
            )
    return batch
