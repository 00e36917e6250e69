"""``rollgate.Client``: the blocking client of rollgate's trainer and admin API."""

from __future__ import annotations

import codecs
import os
import queue
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from . import _api
from ._http import Endpoint, RetryPolicy, transport_error
from ._sync import TRANSPORT_ERRORS, Stream, SyncTransport
from .errors import RollgateError
from .sse import SSEParser, task_event

JSON = Dict[str, Any]
DEFAULT_URL = "http://127.0.0.1:8080"
# The gateway sends a heartbeat every 15 s on an idle event stream; silence this long means it dropped.
STREAM_READ_TIMEOUT_S = 60.0


def resolve_settings(base_url: Optional[str], api_key: Optional[str]) -> Tuple[str, Optional[str]]:
    """Arguments first, then ROLLGATE_URL / ROLLGATE_API_KEY, then the local cluster's address."""
    url = base_url or os.environ.get("ROLLGATE_URL") or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get("ROLLGATE_API_KEY")
    return url, key or None


class Client:
    """Blocking client of a rollgate gateway.

    ``base_url`` defaults to ``$ROLLGATE_URL`` (else ``http://127.0.0.1:8080``), ``api_key`` to
    ``$ROLLGATE_API_KEY`` (sent as ``Authorization: Bearer``). ``timeout`` is per request, in
    seconds. Transport failures (and 502/503/504) of idempotent calls — reads, cancel, a submit
    whose task ids are given — are retried ``retries`` times with exponential backoff from
    ``backoff`` seconds; a call that could create something twice is never sent again. Every
    failure is a ``RollgateError``. Tasks and results are the API's JSON as dicts.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        url, key = resolve_settings(base_url, api_key)
        self.base_url = url.rstrip("/")
        self._transport = SyncTransport(Endpoint.parse(url), key, timeout, RetryPolicy(retries=retries, backoff=backoff), headers)

    def __repr__(self) -> str:
        return "Client(%r)" % self.base_url

    # ── tasks ──────────────────────────────────────────────────────────────────────────────

    def submit(self, task: Mapping[str, Any]) -> JSON:
        """``POST /v1/tasks``: queues one task → ``{"id", "status"}``. Idempotent on ``task["id"]`` (then retried)."""
        return self._transport.call(_api.submit(task))

    def submit_batch(self, tasks: Sequence[Mapping[str, Any]], group_callback: Optional[Mapping[str, str]] = None) -> List[JSON]:
        """``POST /v1/tasks/batch``: several tasks at once → one ``{"id", "status"}`` per task, in order."""
        return self._transport.call(_api.submit_batch(tasks, group_callback))

    def submit_group(self, task: Mapping[str, Any], n: int, group_id: Optional[str] = None, group_callback: Optional[Mapping[str, str]] = None) -> JSON:
        """A GRPO group: ``n`` rollouts of ``task`` with ids ``<group_id>-<k>``, sharing one routing affinity.

        ``group_id`` defaults to a fresh ``g-…``; ``group_callback`` (``{"url", "secret"}``, sent once
        every member ended) defaults to the task's own ``callback``. Returns ``{"group_id", "tasks"}``.
        """
        return self._transport.call(_api.submit_group(task, n, group_id, group_callback))

    def branch(
        self,
        task_id: str,
        at_call: int,
        n: int,
        sampling: Optional[Mapping[str, Any]] = None,
        callback: Optional[Mapping[str, str]] = None,
        group_id: Optional[str] = None,
        train_replayed: bool = False,
    ) -> JSON:
        """``POST /v1/tasks/:id/branches``: ``n`` runs that replay the finished task's first ``at_call`` LLM
        calls from its records (their tokens masked unless ``train_replayed``), then sample.

        ``callback`` (``{"url", "secret"}``) is the group's: every branch's result, the rewards and the
        shared prefix, once. Returns ``{"group_id", "task_ids"}``; ``wait_group(group_id)`` waits for them.
        """
        return self._transport.call(_api.branch(task_id, at_call, n, sampling, callback, group_id, train_replayed))

    def get(self, task_id: str) -> JSON:
        """``GET /v1/tasks/:id``: status, timings, callback state, and ``result`` once it ended."""
        return self._transport.call(_api.get(task_id))

    def list_tasks(self, status: Optional[str] = None, group_id: Optional[str] = None, page_size: int = 100, limit: Optional[int] = None) -> Iterator[JSON]:
        """Every task matching the filters, newest first, fetched one page (``page_size``) at a time; at most ``limit``."""
        cursor: Optional[str] = None
        seen = 0
        while True:
            page = self.list_page(status=status, group_id=group_id, page_size=page_size, cursor=cursor)
            for record in page["tasks"]:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield record
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def list_page(self, status: Optional[str] = None, group_id: Optional[str] = None, page_size: int = 100, cursor: Optional[str] = None) -> JSON:
        """One page of ``GET /v1/tasks``: ``{"tasks", "next_cursor"}``."""
        return self._transport.call(_api.list_page(status, group_id, page_size, cursor))

    def cancel(self, task_id: str) -> JSON:
        """``DELETE /v1/tasks/:id``: ``cancelled`` when it had not started, ``cancelling`` while its sandbox is killed."""
        return self._transport.call(_api.cancel(task_id))

    def logs(self, task_id: str) -> str:
        """The agent's output (bounded, newest kept)."""
        return self._transport.call(_api.logs(task_id))

    def wait(self, task_id: str, timeout: Optional[float] = None, poll_interval: float = 1.0) -> JSON:
        """Polls the task until it ends and returns its result; ``RollgateError`` type ``timeout`` after ``timeout`` s.

        A gateway that stops answering (a restart, a deploy: no answer or 502/503/504 after a poll's
        own retries) is polled through for up to 120 s in a row before its error is raised.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = _api.Outage()
        status = None
        while True:
            try:
                record = self.get(task_id)
                outage.answered()
                result: Optional[JSON] = record.get("result")
                if result is not None:
                    return result
                status = record.get("status")
            except RollgateError as err:
                outage.failed(err, time.monotonic())
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RollgateError("task %s is still %s after %s s%s" % (task_id, status, timeout, outage.note()), 0, "timeout")
            time.sleep(poll_interval if left is None else max(0.0, min(poll_interval, left)))

    def wait_group(self, group_id: str, timeout: Optional[float] = None, poll_interval: float = 1.0) -> List[JSON]:
        """Polls a group until every member ended; returns their results in member order (``-0``, ``-1``, …).

        Polls through a gateway outage as ``wait`` does.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = _api.Outage()
        records: List[JSON] = []
        while True:
            try:
                records = list(self.list_tasks(group_id=group_id, page_size=1000))
                outage.answered()
                results = _api.group_results(group_id, records)
                if results is not None:
                    return results
            except RollgateError as err:
                outage.failed(err, time.monotonic())
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                done = sum(1 for r in records if r.get("result") is not None)
                raise RollgateError("group %s: %d of %d tasks ended after %s s%s" % (group_id, done, len(records), timeout, outage.note()), 0, "timeout")
            time.sleep(poll_interval if left is None else max(0.0, min(poll_interval, left)))

    # ── events ─────────────────────────────────────────────────────────────────────────────

    def events(self, task_or_group_id: str, last_event_id: Optional[str] = None, max_reconnects: int = 5) -> Iterator[JSON]:
        """Lifecycle events (``{"id", "type", "at", "data", "task_id"}``) as they happen, until the end.

        Given a task id: its events, ending after ``terminal``; a dropped stream is resumed with
        ``Last-Event-ID`` (from ``last_event_id`` on the first connection), so no event is lost or
        repeated. Given a group id: every member's events, interleaved as they arrive, until all ended.
        """
        ids = self._task_ids(task_or_group_id)
        if len(ids) == 1 and ids[0] == task_or_group_id:
            yield from self._task_events(ids[0], last_event_id, max_reconnects, set())
            return
        yield from self._merged_events(ids, max_reconnects)

    def _task_ids(self, task_or_group_id: str) -> List[str]:
        try:
            self.get(task_or_group_id)
            return [task_or_group_id]
        except RollgateError as err:
            if err.status != 404:
                raise
        records = list(self.list_tasks(group_id=task_or_group_id, page_size=1000))
        if not records:
            raise RollgateError("no task or group %s" % task_or_group_id, 404, "not_found")
        return [r["id"] for r in sorted(records, key=lambda r: _api.member_index(task_or_group_id, r["id"]))]

    def _task_events(self, task_id: str, last_event_id: Optional[str], max_reconnects: int, open_streams: Set[Stream], stop: Optional[threading.Event] = None) -> Iterator[JSON]:
        call = _api.events(task_id)
        last = last_event_id
        reconnects = 0
        while stop is None or not stop.is_set():
            error: Optional[RollgateError] = None
            try:
                stream = self._transport.open_stream(call, {"Last-Event-ID": last} if last else {}, STREAM_READ_TIMEOUT_S)
            except RollgateError as err:
                if 400 <= err.status < 500:
                    raise
                error = err
            except TRANSPORT_ERRORS as err:
                error = transport_error(call, self._transport.endpoint, err)
            else:
                open_streams.add(stream)
                parser = SSEParser()
                decoder = codecs.getincrementaldecoder("utf-8")()
                try:
                    while True:
                        line = stream.readline()
                        if not line:
                            break
                        for message in parser.feed(decoder.decode(line)):
                            event = task_event(message, task_id)
                            if event is None:
                                continue
                            last, reconnects = event["id"], 0
                            yield event
                            if event["type"] == "terminal":
                                return
                except TRANSPORT_ERRORS as err:
                    error = transport_error(call, self._transport.endpoint, err)
                finally:
                    open_streams.discard(stream)
                    stream.close()
            if stop is not None and stop.is_set():
                return
            if reconnects >= max_reconnects:
                why = " (%s)" % error.message if error else ""
                raise RollgateError("the event stream of task %s kept closing before the task ended%s" % (task_id, why), 0, "stream_closed", None, call.label)
            reconnects += 1
            time.sleep(self._transport.retry.delay(reconnects - 1))

    def _merged_events(self, ids: List[str], max_reconnects: int) -> Iterator[JSON]:
        inbox: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
        stop = threading.Event()
        open_streams: Set[Stream] = set()

        def follow(task_id: str) -> None:
            try:
                for event in self._task_events(task_id, None, max_reconnects, open_streams, stop):
                    if stop.is_set():
                        return
                    inbox.put(("event", event))
            except BaseException as err:  # handed to the consumer
                inbox.put(("error", err))
            finally:
                inbox.put(("done", task_id))

        for task_id in ids:
            threading.Thread(target=follow, args=(task_id,), name="rollgate-events-%s" % task_id, daemon=True).start()
        try:
            running = len(ids)
            while running:
                kind, value = inbox.get()
                if kind == "event":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    running -= 1
        finally:
            stop.set()
            for stream in list(open_streams):
                stream.close()

    # ── sessions and trajectories ──────────────────────────────────────────────────────────

    def trajectory(self, session_id: str, builder: str = "prefix_merging", format: str = "rollgate") -> Any:
        """A session's trajectory: ``rollgate`` → ``{"builder", "traces", "stats"}``; ``verl`` / ``slime`` / ``prime-rl`` → that trainer's samples (a ``TrainerSamples`` list, one per trace, whose ``lost_calls`` / ``whole`` say whether the rollout is whole)."""
        return self._transport.call(_api.trajectory(session_id, builder, format))

    def create_session(self, **fields: Any) -> JSON:
        """``POST /v1/sessions`` (``id``, ``model``, ``sampling``, ``limits``, ``affinity_key``, ``metadata``) → ``{"id", "token", "base_url", "urls"}``."""
        return self._transport.call(_api.create_session(fields))

    def session(self, session_id: str) -> JSON:
        return self._transport.call(_api.session(session_id))

    def close_session(self, session_id: str) -> JSON:
        return self._transport.call(_api.close_session(session_id))

    def completions(self, session_id: str) -> List[JSON]:
        """The session's completion records (engine token ids and logprobs of every LLM call)."""
        return self._transport.call(_api.completions(session_id))

    # ── admin: the RL loop ─────────────────────────────────────────────────────────────────

    def pause(self, mode: str = "drain", timeout_s: float = 60.0) -> JSON:
        """Holds new engine calls on every replica. ``drain``: in-flight calls finish (up to ``timeout_s``); ``abort``: the engines cut them and the gateway continues them after ``resume``."""
        return self._transport.call(_api.pause(mode, timeout_s))

    def resume(self) -> JSON:
        """Releases held calls and resumes the engines. ``RollgateError`` 409 ``weights_loading`` while a
        weight load runs, ``weights_mixed`` after a load only some ranks took (load again first)."""
        return self._transport.call(_api.resume())

    def inference(self) -> JSON:
        """``{"paused": state or None, "inflight": n}``."""
        return self._transport.call(_api.inference_state())

    def set_weights(self, version: Any, load: Optional[Mapping[str, Any]] = None) -> JSON:
        """Sets the weight version stamped on every engine call from now on.

        With ``load`` (``{"path": "<checkpoint folder>"}`` or ``{"lora": {"name", "path"}}``; inference
        must be paused) every engine first loads those weights through its own route; the answer says
        per engine and rank what loaded. If one does not, ``RollgateError`` type
        ``weights_load_failed`` (HTTP 502) carries the same report in ``details`` and the version stays.
        """
        return self._transport.call(_api.set_weights(version, load))

    def weights(self) -> Optional[str]:
        """The current weight version (None before one was set)."""
        return self._transport.call(_api.weights())

    def engines(self) -> JSON:
        """``GET /admin/engines``: every engine rank's health, load and sessions."""
        return self._transport.call(_api.engines())
