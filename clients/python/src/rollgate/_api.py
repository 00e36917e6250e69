"""Every call of the trainer and admin API as a ``Call`` (request + how to read the answer), so the
blocking and the asyncio client send exactly the same requests. No I/O here."""

from __future__ import annotations

import re
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ._http import RETRYABLE_STATUSES, Call, seg
from .errors import RollgateError
from .trainer_formats import TrainerSamples

JSON = Dict[str, Any]

TERMINAL = frozenset(("completed", "failed", "timed_out", "cancelled"))
TRAINER_FORMATS = ("rollgate", "verl", "slime", "prime-rl")
BUILDERS = ("prefix_merging", "per_request", "prefix_tree")
# Loading weights can take minutes on real engines: the gateway waits for every engine.
LOAD_TIMEOUT_S = 20 * 60.0
# A wait's polls ride out a gateway that does not answer (a restart, a deploy) for this long in a row.
OUTAGE_GRACE_S = 120.0


def _task_mapping(task: Any, what: str = "task") -> Mapping[str, Any]:
    if not isinstance(task, Mapping):
        raise TypeError("%s must be a mapping (a dict of the task's JSON), got %s" % (what, type(task).__name__))
    return task


def _has_id(task: Mapping[str, Any]) -> bool:
    return isinstance(task.get("id"), str) and bool(task["id"])


def new_group_id() -> str:
    return "g-" + uuid.uuid4().hex[:16]


def member_index(group_id: str, task_id: str) -> int:
    """k of a group member's id ``<group_id>-<k>`` (members sort by it, not as strings)."""
    m = re.fullmatch(re.escape(group_id) + r"-(\d+)", task_id)
    return int(m.group(1)) if m else 1 << 62


def submit(task: Mapping[str, Any]) -> Call[JSON]:
    task = _task_mapping(task)
    return Call("POST", "/v1/tasks", body=dict(task), has_body=True, idempotent=_has_id(task))


def submit_batch(tasks: Sequence[Mapping[str, Any]], group_callback: Optional[Mapping[str, str]] = None) -> Call[List[JSON]]:
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or len(tasks) == 0:
        raise ValueError("tasks must be a non-empty list of task mappings")
    body: JSON = {"tasks": [dict(_task_mapping(t, "tasks[%d]" % i)) for i, t in enumerate(tasks)]}
    if group_callback:
        body["group_callback"] = dict(group_callback)
    return Call("POST", "/v1/tasks/batch", body=body, has_body=True, idempotent=all(_has_id(t) for t in tasks), parse=lambda v: v["tasks"])


def submit_group(task: Mapping[str, Any], n: int, group_id: Optional[str] = None, group_callback: Optional[Mapping[str, str]] = None) -> Call[JSON]:
    task = _task_mapping(task)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("n must be a positive int (rollouts in the group), got %r" % (n,))
    gid = group_id or new_group_id()
    member = {k: v for k, v in task.items() if k not in ("id", "group_id")}
    body: JSON = {"group_id": gid, "n": n, "task": member}
    callback = group_callback if group_callback is not None else task.get("callback")
    if callback:
        body["group_callback"] = dict(callback)
    # Not sent twice: a group submitted again gets a new group delivery.
    return Call("POST", "/v1/tasks/batch", body=body, has_body=True, idempotent=False, parse=lambda v: {"group_id": gid, "tasks": v["tasks"]})


def branch(
    task_id: str,
    at_call: int,
    n: int,
    sampling: Optional[Mapping[str, Any]] = None,
    callback: Optional[Mapping[str, str]] = None,
    group_id: Optional[str] = None,
    train_replayed: bool = False,
) -> Call[JSON]:
    for name, v in (("at_call", at_call), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError("%s must be a positive int, got %r" % (name, v))
    body: JSON = {"at_call": at_call, "n": n, "train_replayed": bool(train_replayed)}
    if sampling is not None:
        body["sampling"] = dict(sampling)
    if callback is not None:
        body["callback"] = dict(callback)
    if group_id is not None:
        body["group_id"] = group_id
    # Not sent twice without a group id: each send makes a new group.
    return Call("POST", "/v1/tasks/" + seg(task_id) + "/branches", body=body, has_body=True, idempotent=False)


def get(task_id: str) -> Call[JSON]:
    return Call("GET", "/v1/tasks/" + seg(task_id), idempotent=True)


def list_page(status: Optional[str], group_id: Optional[str], limit: int, cursor: Optional[str]) -> Call[JSON]:
    return Call("GET", "/v1/tasks", query={"status": status, "group_id": group_id, "limit": limit, "cursor": cursor}, idempotent=True)


def events(task_id: str) -> Call[Any]:
    return Call("GET", "/v1/tasks/%s/events" % seg(task_id), idempotent=True)


def cancel(task_id: str) -> Call[JSON]:
    return Call("DELETE", "/v1/tasks/" + seg(task_id), idempotent=True)


def logs(task_id: str) -> Call[str]:
    return Call("GET", "/v1/tasks/%s/logs" % seg(task_id), idempotent=True, text=True, parse=lambda v: v or "")


def trajectory(session_id: str, builder: str, format: str) -> Call[Any]:
    if builder not in BUILDERS:
        raise ValueError("builder must be one of %s, got %r" % (", ".join(BUILDERS), builder))
    if format not in TRAINER_FORMATS:
        raise ValueError("format must be one of %s, got %r" % (", ".join(TRAINER_FORMATS), format))
    # A trainer format's samples keep the answer's lost_calls: a rollout with any is not whole.
    parse = (lambda v: v) if format == "rollgate" else TrainerSamples.from_answer
    return Call("GET", "/v1/sessions/%s/trajectory" % seg(session_id), query={"builder": builder, "format": format}, idempotent=True, parse=parse)


def create_session(body: Mapping[str, Any]) -> Call[JSON]:
    # Never sent again, even with an id: the token comes only in this answer, and a second create of
    # the id is 409 "exists", so a retry after a lost answer would report a conflict for a session
    # the caller never saw (it gets "unreachable" and can open another).
    return Call("POST", "/v1/sessions", body=dict(body), has_body=True, idempotent=False)


def session(session_id: str) -> Call[JSON]:
    return Call("GET", "/v1/sessions/" + seg(session_id), idempotent=True)


def close_session(session_id: str) -> Call[JSON]:
    return Call("POST", "/v1/sessions/%s/close" % seg(session_id), idempotent=True)


def completions(session_id: str) -> Call[List[JSON]]:
    return Call("GET", "/v1/sessions/%s/completions" % seg(session_id), idempotent=True, parse=lambda v: v["completions"])


def pause(mode: str, timeout_s: float) -> Call[JSON]:
    if mode not in ("drain", "abort"):
        raise ValueError("mode must be 'drain' or 'abort', got %r" % (mode,))
    # The gateway answers once in-flight calls drained or timeout_s passed.
    return Call("POST", "/admin/inference/pause", body={"mode": mode, "timeout_s": timeout_s}, has_body=True, timeout=float(timeout_s) + 30.0)


def resume() -> Call[JSON]:
    return Call("POST", "/admin/inference/resume", body={}, has_body=True, idempotent=True)


def inference_state() -> Call[JSON]:
    return Call("GET", "/admin/inference", idempotent=True)


def set_weights(version: Any, load: Optional[Mapping[str, Any]]) -> Call[JSON]:
    if isinstance(version, bool) or not isinstance(version, (str, int)) or version == "":
        raise ValueError("version must be a non-empty string or an int, got %r" % (version,))
    body: JSON = {"version": version}
    if load is not None:
        body["load"] = dict(load)
    # Setting a label twice is harmless; loading weights twice is not sent again behind the caller's back.
    return Call("POST", "/admin/inference/weights", body=body, has_body=True, idempotent=load is None, timeout=LOAD_TIMEOUT_S if load is not None else None)


def weights() -> Call[Optional[str]]:
    return Call("GET", "/admin/weights", idempotent=True, parse=lambda v: v["version"])


def engines() -> Call[JSON]:
    return Call("GET", "/admin/engines", idempotent=True)


def group_results(group_id: str, records: List[JSON]) -> Optional[List[JSON]]:
    """The results of a group's tasks in member order, once every one has ended; else None."""
    if not records or any(r.get("status") not in TERMINAL or r.get("result") is None for r in records):
        return None
    ordered = sorted(records, key=lambda r: member_index(group_id, r["id"]))
    return [r["result"] for r in ordered]


class Outage:
    """A wait's polls through a gateway outage: a poll with no answer (or 502/503/504) after its own
    retries is not the end of a wait that may last hours (a gateway restart or deploy); polling goes
    on until the outage lasted ``grace`` seconds in a row, then its last error is raised. Any other
    error (404, 401, …) is raised at once."""

    def __init__(self, grace: float = OUTAGE_GRACE_S) -> None:
        self.grace = grace
        self.since: Optional[float] = None
        self.last: Optional[RollgateError] = None

    def answered(self) -> None:
        self.since, self.last = None, None

    def failed(self, err: RollgateError, now: float) -> None:
        if not (err.unreachable or err.status in RETRYABLE_STATUSES):
            raise err
        if self.since is None:
            self.since = now
        self.last = err
        if now - self.since >= self.grace:
            raise err

    def note(self) -> str:
        return " (the last poll got no answer: %s)" % self.last.message if self.last is not None else ""
