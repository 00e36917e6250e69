"""A session's samples in a trainer's format, as ``Client.trajectory(..., format=...)`` returns them."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

JSON = Dict[str, Any]


class TrainerSamples(List[JSON]):
    """One sample per trace (a plain list of the gateway's dicts), with what the answer said around them.

    ``lost_calls`` is the session's (``{"count", "first"}``): a call lost to infrastructure may have
    left tokens out of the traces (an answer the agent got whose record never came reads as masked
    glue in the next call), so a rollout with any is not whole and should not be trained on;
    ``whole`` says so. ``builder`` and ``format`` are the ones the samples were built with.
    """

    def __init__(self, samples: List[JSON], builder: Optional[str], format: Optional[str], lost_calls: Optional[JSON]) -> None:
        super().__init__(samples)
        self.builder = builder
        self.format = format
        self.lost_calls: JSON = dict(lost_calls) if lost_calls is not None else {"count": 0, "first": None}

    @property
    def whole(self) -> bool:
        """No call of the session was lost."""
        return not self.lost_calls.get("count")

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> "TrainerSamples":
        return cls(list(answer["samples"]), answer.get("builder"), answer.get("format"), answer.get("lost_calls"))
