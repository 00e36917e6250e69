"""``rollgate.AsyncClient``: the same API as ``Client``, as coroutines, for asyncio rollout loops."""

from __future__ import annotations

import asyncio
import codecs
import time
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from . import _api
from ._aio import TRANSPORT_ERRORS, AsyncStream, AsyncTransport
from ._http import Endpoint, RetryPolicy, transport_error
from .client import STREAM_READ_TIMEOUT_S, resolve_settings
from .errors import RollgateError
from .sse import SSEParser, task_event

JSON = Dict[str, Any]


class AsyncClient:
    """Asyncio client of a rollgate gateway: every method of ``Client`` as a coroutine (``events`` and
    ``list_tasks`` as async iterators), with the same defaults, retries and errors. Its transport is
    a small HTTP/1.1 client on asyncio streams (see ``rollgate._aio``), so cancelling a call closes
    its connection at once and a thousand concurrent waits hold no threads.
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
        self._transport = AsyncTransport(Endpoint.parse(url), key, timeout, RetryPolicy(retries=retries, backoff=backoff), headers)

    def __repr__(self) -> str:
        return "AsyncClient(%r)" % self.base_url

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    # ── tasks ──────────────────────────────────────────────────────────────────────────────

    async def submit(self, task: Mapping[str, Any]) -> JSON:
        return await self._transport.call(_api.submit(task))

    async def submit_batch(self, tasks: Sequence[Mapping[str, Any]], group_callback: Optional[Mapping[str, str]] = None) -> List[JSON]:
        return await self._transport.call(_api.submit_batch(tasks, group_callback))

    async def submit_group(self, task: Mapping[str, Any], n: int, group_id: Optional[str] = None, group_callback: Optional[Mapping[str, str]] = None) -> JSON:
        return await self._transport.call(_api.submit_group(task, n, group_id, group_callback))

    async def branch(
        self,
        task_id: str,
        at_call: int,
        n: int,
        sampling: Optional[Mapping[str, Any]] = None,
        callback: Optional[Mapping[str, str]] = None,
        group_id: Optional[str] = None,
        train_replayed: bool = False,
    ) -> JSON:
        return await self._transport.call(_api.branch(task_id, at_call, n, sampling, callback, group_id, train_replayed))

    async def get(self, task_id: str) -> JSON:
        return await self._transport.call(_api.get(task_id))

    async def list_page(self, status: Optional[str] = None, group_id: Optional[str] = None, page_size: int = 100, cursor: Optional[str] = None) -> JSON:
        return await self._transport.call(_api.list_page(status, group_id, page_size, cursor))

    async def list_tasks(self, status: Optional[str] = None, group_id: Optional[str] = None, page_size: int = 100, limit: Optional[int] = None) -> AsyncIterator[JSON]:
        cursor: Optional[str] = None
        seen = 0
        while True:
            page = await self.list_page(status=status, group_id=group_id, page_size=page_size, cursor=cursor)
            for record in page["tasks"]:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield record
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def cancel(self, task_id: str) -> JSON:
        return await self._transport.call(_api.cancel(task_id))

    async def logs(self, task_id: str) -> str:
        return await self._transport.call(_api.logs(task_id))

    async def wait(self, task_id: str, timeout: Optional[float] = None, poll_interval: float = 1.0) -> JSON:
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = _api.Outage()
        status = None
        while True:
            try:
                record = await self.get(task_id)
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
            await asyncio.sleep(poll_interval if left is None else max(0.0, min(poll_interval, left)))

    async def wait_group(self, group_id: str, timeout: Optional[float] = None, poll_interval: float = 1.0) -> List[JSON]:
        deadline = None if timeout is None else time.monotonic() + timeout
        outage = _api.Outage()
        records: List[JSON] = []
        while True:
            try:
                records = [r async for r in self.list_tasks(group_id=group_id, page_size=1000)]
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
            await asyncio.sleep(poll_interval if left is None else max(0.0, min(poll_interval, left)))

    # ── events ─────────────────────────────────────────────────────────────────────────────

    async def events(self, task_or_group_id: str, last_event_id: Optional[str] = None, max_reconnects: int = 5) -> AsyncIterator[JSON]:
        """As ``Client.events``: a task's events (resumed with ``Last-Event-ID``), or a group's, interleaved."""
        ids = await self._task_ids(task_or_group_id)
        if len(ids) == 1 and ids[0] == task_or_group_id:
            async for event in self._task_events(ids[0], last_event_id, max_reconnects, set()):
                yield event
            return
        async for event in self._merged_events(ids, max_reconnects):
            yield event

    async def _task_ids(self, task_or_group_id: str) -> List[str]:
        try:
            await self.get(task_or_group_id)
            return [task_or_group_id]
        except RollgateError as err:
            if err.status != 404:
                raise
        records = [r async for r in self.list_tasks(group_id=task_or_group_id, page_size=1000)]
        if not records:
            raise RollgateError("no task or group %s" % task_or_group_id, 404, "not_found")
        return [r["id"] for r in sorted(records, key=lambda r: _api.member_index(task_or_group_id, r["id"]))]

    async def _task_events(self, task_id: str, last_event_id: Optional[str], max_reconnects: int, open_streams: Set[AsyncStream]) -> AsyncIterator[JSON]:
        call = _api.events(task_id)
        last = last_event_id
        reconnects = 0
        while True:
            error: Optional[RollgateError] = None
            try:
                stream = await self._transport.open_stream(call, {"Last-Event-ID": last} if last else {}, STREAM_READ_TIMEOUT_S)
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
                        chunk = await stream.chunk()
                        if not chunk:
                            break
                        for message in parser.feed(decoder.decode(chunk)):
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
            if reconnects >= max_reconnects:
                why = " (%s)" % error.message if error else ""
                raise RollgateError("the event stream of task %s kept closing before the task ended%s" % (task_id, why), 0, "stream_closed", None, call.label)
            reconnects += 1
            await asyncio.sleep(self._transport.retry.delay(reconnects - 1))

    async def _merged_events(self, ids: List[str], max_reconnects: int) -> AsyncIterator[JSON]:
        inbox: "asyncio.Queue[Tuple[str, Any]]" = asyncio.Queue()
        open_streams: Set[AsyncStream] = set()

        async def follow(task_id: str) -> None:
            try:
                async for event in self._task_events(task_id, None, max_reconnects, open_streams):
                    await inbox.put(("event", event))
            except asyncio.CancelledError:
                raise
            except BaseException as err:  # handed to the consumer
                await inbox.put(("error", err))
            finally:
                inbox.put_nowait(("done", task_id))

        tasks = [asyncio.ensure_future(follow(task_id)) for task_id in ids]
        try:
            running = len(ids)
            while running:
                kind, value = await inbox.get()
                if kind == "event":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    running -= 1
        finally:
            for t in tasks:
                t.cancel()
            for stream in list(open_streams):
                stream.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ── sessions and trajectories ──────────────────────────────────────────────────────────

    async def trajectory(self, session_id: str, builder: str = "prefix_merging", format: str = "rollgate") -> Any:
        """As ``Client.trajectory``: the trajectory, or a trainer format's ``TrainerSamples`` (with the session's ``lost_calls``)."""
        return await self._transport.call(_api.trajectory(session_id, builder, format))

    async def create_session(self, **fields: Any) -> JSON:
        return await self._transport.call(_api.create_session(fields))

    async def session(self, session_id: str) -> JSON:
        return await self._transport.call(_api.session(session_id))

    async def close_session(self, session_id: str) -> JSON:
        return await self._transport.call(_api.close_session(session_id))

    async def completions(self, session_id: str) -> List[JSON]:
        return await self._transport.call(_api.completions(session_id))

    # ── admin: the RL loop ─────────────────────────────────────────────────────────────────

    async def pause(self, mode: str = "drain", timeout_s: float = 60.0) -> JSON:
        return await self._transport.call(_api.pause(mode, timeout_s))

    async def resume(self) -> JSON:
        return await self._transport.call(_api.resume())

    async def inference(self) -> JSON:
        return await self._transport.call(_api.inference_state())

    async def set_weights(self, version: Any, load: Optional[Mapping[str, Any]] = None) -> JSON:
        return await self._transport.call(_api.set_weights(version, load))

    async def weights(self) -> Optional[str]:
        return await self._transport.call(_api.weights())

    async def engines(self) -> JSON:
        return await self._transport.call(_api.engines())
