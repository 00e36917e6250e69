"""The asyncio transport: a small HTTP/1.1 client on the loop's socket calls (plain HTTP) or
asyncio streams (HTTPS).

Why not the blocking transport in a thread pool: event streams and long waits would each hold a
pool thread for minutes, a cancelled coroutine could not stop its thread's blocking read, and a
trainer running hundreds of rollouts at once would exhaust the default pool. Here a request is a
coroutine: cancelling it closes its socket at once. One connection per request (``Connection:
close``); bodies by Content-Length, chunked transfer coding, or until the server closes.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ._http import Call, T, TransportBase, headers_for, settle, split_status_line, transport_error
from .errors import RollgateError

HEADER_LIMIT = 1 << 20
# A request body is written in pieces this big, so an answer that comes before its end is seen.
WRITE_CHUNK = 1 << 16
TRANSPORT_ERRORS = (OSError, EOFError, asyncio.LimitOverrunError, ValueError)


class _PlainConnection:
    """A plain-HTTP connection on a non-blocking socket through the loop. Not a StreamReader: once a
    peer resets the connection, a StreamReader drops what it had sent before (the gateway's 413 to
    a body over its size limit, sent before it read the body and closed); a socket still reads it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._eof = False

    @classmethod
    async def open(cls, host: str, port: int) -> "_PlainConnection":
        loop = asyncio.get_running_loop()
        failure: Optional[OSError] = None
        for family, kind, proto, _, address in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
                return cls(sock)
            except OSError as err:
                sock.close()
                failure = err
            except BaseException:
                sock.close()
                raise
        raise failure or OSError("no address for %s" % host)

    async def send(self, data: bytes) -> None:
        await self._loop.sock_sendall(self._sock, data)

    async def _fill(self) -> bool:
        if self._eof:
            return False
        data = await self._loop.sock_recv(self._sock, 1 << 16)
        self._eof = not data
        self._buffer += data
        return bool(data)

    async def readuntil(self, separator: bytes) -> bytes:
        while True:
            at = self._buffer.find(separator)
            if at >= 0:
                return self._take(at + len(separator))
            if len(self._buffer) > HEADER_LIMIT:
                raise asyncio.LimitOverrunError("no %r within %d bytes" % (separator, HEADER_LIMIT), len(self._buffer))
            if not await self._fill():
                raise asyncio.IncompleteReadError(bytes(self._buffer), None)

    async def readexactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if not await self._fill():
                raise asyncio.IncompleteReadError(bytes(self._buffer), n)
        return self._take(n)

    async def read(self, n: int) -> bytes:
        if not self._buffer:
            await self._fill()
        return self._take(min(n, len(self._buffer)))

    def _take(self, n: int) -> bytes:
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def close(self) -> None:
        # Unregistered first: a read cancelled a moment ago unregisters its fd later, and by then the
        # number may belong to a new connection.
        fd = self._sock.fileno()
        if fd >= 0:
            for remove in (self._loop.remove_reader, self._loop.remove_writer):
                try:
                    remove(fd)
                except (NotImplementedError, ValueError, OSError):  # proactor loops keep no fd registrations
                    pass
        self._sock.close()


class _TLSConnection:
    """An HTTPS connection on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.readuntil = reader.readuntil
        self.readexactly = reader.readexactly
        self.read = reader.read
        self._writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> "_TLSConnection":
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl.create_default_context(), limit=HEADER_LIMIT)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


Connection = Union[_PlainConnection, _TLSConnection]


class _Body:
    """Reads one response body in its framing; ``read`` returns b"" at its end."""

    def __init__(self, reader: Connection, headers: Mapping[str, str], method: str, status: int) -> None:
        self._reader = reader
        self._done = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: Optional[int] = int(length) if length is not None and not self._chunked else None
        if self._left == 0:
            self._done = True

    async def read(self) -> bytes:
        if self._done:
            return b""
        if self._chunked:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailers (none expected) end with an empty line.
                while (await self._reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                self._done = True
                return b""
            data = await self._reader.readexactly(size)
            await self._reader.readexactly(2)
            return data
        if self._left is not None:
            data = await self._reader.read(min(self._left, 1 << 16))
            if not data:
                raise asyncio.IncompleteReadError(b"", self._left)
            self._left -= len(data)
            self._done = self._left == 0
            return data
        data = await self._reader.read(1 << 16)
        self._done = not data
        return data

    async def read_all(self) -> bytes:
        parts: List[bytes] = []
        while True:
            data = await self.read()
            if not data:
                return b"".join(parts)
            parts.append(data)


class AsyncTransport(TransportBase):

    async def _exchange(self, call: Call[Any], headers: Dict[str, str]) -> Tuple[Connection, int, Dict[str, str], _Body]:
        e = self.endpoint
        conn: Connection = await (_TLSConnection if e.scheme == "https" else _PlainConnection).open(e.host, e.port)
        try:
            payload = call.payload()
            if payload is not None:
                headers["Content-Length"] = str(len(payload))
            head = "%s %s HTTP/1.1\r\n%s\r\n" % (call.method, call.target(e.base_path), "".join("%s: %s\r\n" % kv for kv in headers.items()))
            # The answer's head is read while the body is written: the gateway may answer before it
            # read the whole body (413 over its size limit, 401) and close, and that answer, not the
            # broken pipe the rest of the body then meets, is what the caller must get.
            answered = asyncio.ensure_future(conn.readuntil(b"\r\n\r\n"))
            unsent: Optional[OSError] = None
            try:
                try:
                    await conn.send(head.encode("latin-1"))
                    body = memoryview(payload or b"")
                    for k in range(0, len(body), WRITE_CHUNK):
                        if answered.done():
                            break
                        await conn.send(body[k : k + WRITE_CHUNK])
                except OSError as err:
                    unsent = err
                try:
                    raw = await answered
                except TRANSPORT_ERRORS:
                    if unsent is not None:
                        raise unsent from None
                    raise
            finally:
                if answered.done() and not answered.cancelled():
                    answered.exception()  # retrieved: no "never retrieved" warning when something else failed first
                answered.cancel()
            lines = raw.split(b"\r\n")
            status, _ = split_status_line(lines[0])
            answer: Dict[str, str] = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.decode("latin-1").partition(":")
                    answer[name.strip().lower()] = value.strip()
            return conn, status, answer, _Body(conn, answer, call.method, status)
        except BaseException:
            conn.close()
            raise

    async def _once(self, call: Call[Any]) -> Tuple[int, Dict[str, str], bytes]:
        writer, status, headers, body = await self._exchange(call, headers_for(call, self.endpoint, self.api_key, self.headers))
        try:
            return status, headers, await body.read_all()
        finally:
            writer.close()

    async def call(self, call: Call[T]) -> T:
        attempt = 0
        limit = call.timeout if call.timeout is not None else self.timeout
        while True:
            answer: Optional[Tuple[int, Mapping[str, str], bytes]] = None
            failed: Optional[BaseException] = None
            try:
                try:
                    answer = await asyncio.wait_for(self._once(call), limit)
                except asyncio.TimeoutError:
                    raise TimeoutError("timed out") from None
            except TRANSPORT_ERRORS as err:
                failed = err
            done, value = settle(self.retry, call, self.endpoint, attempt, answer, failed)
            if done:
                return value
            await asyncio.sleep(value)
            attempt += 1

    async def open_stream(self, call: Call[Any], extra: Mapping[str, str], read_timeout: float) -> "AsyncStream":
        headers = headers_for(call, self.endpoint, self.api_key, {**self.headers, **extra}, accept="text/event-stream")
        try:
            writer, status, answer, body = await asyncio.wait_for(self._exchange(call, headers), read_timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("timed out") from None
        if status != 200:
            try:
                text = await asyncio.wait_for(body.read_all(), read_timeout)
            finally:
                writer.close()
            raise RollgateError.from_response(status, text, call.label)
        return AsyncStream(writer, body, read_timeout)


class AsyncStream:
    """An open event stream: body chunks as they come (b"" at the end); ``close`` drops the socket."""

    def __init__(self, writer: Connection, body: _Body, read_timeout: float) -> None:
        self._writer = writer
        self._body = body
        self._timeout = read_timeout

    async def chunk(self) -> bytes:
        try:
            return await asyncio.wait_for(self._body.read(), self._timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("no event or heartbeat for %.0f s" % self._timeout) from None

    def close(self) -> None:
        self._writer.close()
