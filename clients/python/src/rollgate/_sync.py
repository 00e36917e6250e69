"""The blocking transport: one ``http.client`` connection per request, retries by ``RetryPolicy``."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from typing import Any, Dict, Mapping, Optional, Tuple

from ._http import Call, T, TransportBase, headers_for, settle, transport_error
from .errors import RollgateError

TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


class SyncTransport(TransportBase):

    def connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        e = self.endpoint
        if e.scheme == "https":
            return http.client.HTTPSConnection(e.host, e.port, timeout=timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(e.host, e.port, timeout=timeout)

    def _once(self, call: Call[Any]) -> Tuple[int, Dict[str, str], bytes]:
        conn = self.connection(call.timeout if call.timeout is not None else self.timeout)
        try:
            try:
                conn.request(call.method, call.target(self.endpoint.base_path), body=call.payload(), headers=headers_for(call, self.endpoint, self.api_key, self.headers))
            except OSError:
                # The gateway may answer before the whole body is sent (413 over its size limit, 401)
                # and close: that answer, not the broken pipe, is what the caller must get.
                early = _answer_already_sent(conn)
                if early is None:
                    raise
                return early
            res = conn.getresponse()
            body = res.read()
            return res.status, {k.lower(): v for k, v in res.getheaders()}, body
        finally:
            conn.close()

    def call(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            answer: Optional[Tuple[int, Mapping[str, str], bytes]] = None
            failed: Optional[BaseException] = None
            try:
                answer = self._once(call)
            except TRANSPORT_ERRORS as err:
                failed = err
            done, value = settle(self.retry, call, self.endpoint, attempt, answer, failed)
            if done:
                return value
            time.sleep(value)
            attempt += 1

    def open_stream(self, call: Call[Any], extra: Mapping[str, str], read_timeout: float) -> "Stream":
        """Opens an event stream; a non-200 answer is raised as the server's error."""
        conn = self.connection(read_timeout)
        try:
            headers = headers_for(call, self.endpoint, self.api_key, {**self.headers, **extra}, accept="text/event-stream")
            conn.request(call.method, call.target(self.endpoint.base_path), headers=headers)
            res = conn.getresponse()
            if res.status != 200:
                body = res.read()
                raise RollgateError.from_response(res.status, body, call.label)
        except BaseException:
            conn.close()
            raise
        return Stream(conn, res)


def _answer_already_sent(conn: http.client.HTTPConnection) -> Optional[Tuple[int, Dict[str, str], bytes]]:
    """The answer the server sent before the request was written whole, or None when there is none."""
    if conn.sock is None:  # never connected (refused, no route): nothing was answered
        return None
    try:
        res = conn.getresponse()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
    except TRANSPORT_ERRORS:
        return None


class Stream:
    """An open event stream: lines as they come; ``close`` (from any thread) ends a blocked read."""

    def __init__(self, conn: http.client.HTTPConnection, res: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._res = res

    def readline(self) -> bytes:
        return self._res.readline(1 << 20)

    def close(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conn.close()
