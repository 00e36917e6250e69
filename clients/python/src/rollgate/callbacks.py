"""``rollgate.CallbackReceiver``: the trainer's end of rollgate's signed callbacks."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar, Union, cast

from .errors import RollgateError

JSON = Dict[str, Any]
V = TypeVar("V")
MAX_BODY = 512 * 1024 * 1024
# Lengths as HTTP writes them (int() would also take "+5", "1_0", "0x1f" and non-ASCII digits).
DECIMAL = re.compile(r"[0-9]{1,15}")
HEX = re.compile(rb"[0-9a-fA-F]{1,15}")


# How far (seconds, either way) a delivery's X-Rollgate-Timestamp may be from now, by default.
DEFAULT_TOLERANCE = 300.0
TIMESTAMP = re.compile(r"[0-9]{1,15}")
# Rollgate's events are task.<status> and group.completed: never a "{", so in the signed content
# the event cannot be shifted into the body (a JSON object) nor the reverse.
EVENT = re.compile(r"[a-z]+(\.[a-z_]+)*")


def sign_delivery(delivery_id: str, timestamp: Union[int, str], event: str, body: bytes, secret: str) -> str:
    """The ``X-Rollgate-Signature-V2`` of a delivery:
    ``v2,<base64 HMAC-SHA256(secret, "<delivery id>.<timestamp>.<event>.<body>")>``."""
    head = ("%s.%s.%s." % (delivery_id, timestamp, event)).encode("utf-8")
    return "v2," + base64.b64encode(hmac.new(secret.encode("utf-8"), head + body, hashlib.sha256).digest()).decode("ascii")


def verify_delivery(
    body: bytes,
    delivery_id: Optional[str],
    event: Optional[str],
    timestamp: Optional[str],
    signature: Optional[str],
    secret: str,
    tolerance: float = DEFAULT_TOLERANCE,
    now: Optional[float] = None,
) -> Optional[str]:
    """Why a delivery is refused, or None when it is authentic and fresh: ``signature`` (the
    ``X-Rollgate-Signature-V2`` header, one or more space-separated ``v2,`` entries) must sign
    these headers and exactly these body bytes (constant-time), and ``timestamp`` be within
    ``tolerance`` seconds of ``now`` (default: the clock) either way. The legacy body-only
    ``X-Rollgate-Signature`` is not accepted instead (no downgrade)."""
    entries = [e for e in (signature or "").split() if e.startswith("v2,")]
    delivery_id, event, timestamp = (delivery_id or "").strip(), (event or "").strip(), (timestamp or "").strip()
    if not entries or not delivery_id:
        return "missing signature"
    if not TIMESTAMP.fullmatch(timestamp):
        return "bad timestamp"
    if not EVENT.fullmatch(event):
        return "bad signature"
    expected = sign_delivery(delivery_id, timestamp, event, body, secret).encode("ascii")
    ok = False
    for entry in entries:  # every entry compared, each in constant time
        ok = hmac.compare_digest(expected, entry.encode("utf-8", "replace")) or ok
    if not ok:
        return "bad signature"
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance:
        return "stale timestamp"
    return None


def sign(body: bytes, secret: str) -> str:
    """The legacy body-only ``X-Rollgate-Signature``: ``sha256=<hex HMAC-SHA256(body, secret)>``.
    Workers still send it beside ``X-Rollgate-Signature-V2`` for receivers of the previous release;
    it covers neither the delivery id, the event nor a time."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify(body: bytes, signature: Optional[str], secret: str) -> bool:
    """Whether the legacy ``signature`` signs exactly these body bytes; constant-time.
    Deprecated: a body that passes it can be replayed under a fresh delivery id, another event, or
    forever; use ``verify_delivery``."""
    if not signature or not signature.startswith("sha256="):
        return False
    return hmac.compare_digest(sign(body, secret).encode("ascii"), signature.strip().encode("utf-8", "replace"))


@dataclass(frozen=True)
class Delivery:
    """One verified callback: ``event`` is ``task.<status>`` or ``group.completed``."""

    event: str
    delivery_id: str
    body: JSON
    raw: bytes


class CallbackReceiver:
    """An HTTP server for rollgate's callbacks, as a context manager (``with`` or ``async with``).

    Put ``receiver.callback`` (``{"url", "secret"}``) in tasks, or ``receiver.url`` with your secret.
    Every delivery's ``X-Rollgate-Signature-V2`` is checked over its delivery id, timestamp, event
    and raw body (constant-time), and its ``X-Rollgate-Timestamp`` must be within ``tolerance``
    seconds of now (default 300, either way): a bad or missing signature (the legacy body-only
    ``X-Rollgate-Signature`` alone is not enough) or a stale timestamp gets 401 and nothing of it
    is read or kept. A delivery seen before (same
    ``X-Rollgate-Delivery``, as retries carry) is acknowledged again and not counted twice.
    ``wait(task_id)`` returns a task's result, ``wait_group(group_id)`` a group's results in member
    order; ``wait_async`` / ``wait_group_async`` are their coroutines. ``on_delivery`` is called once
    for each new delivery (an exception there answers 500, so rollgate delivers it again; a retry
    that arrives while it still runs, because rollgate stopped waiting after 30 s, waits for it).

    ``host="0.0.0.0"`` listens for workers on other hosts; give ``public_url`` when they reach this
    machine by another address. ``read_timeout`` (seconds) ends a connection that sends nothing for
    that long (a stalled proxy, a slow-loris), so it does not hold a thread forever; rollgate's own
    deliveries give up after 30 s and are sent again.
    """

    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        public_url: Optional[str] = None,
        on_delivery: Optional[Callable[[Delivery], None]] = None,
        read_timeout: float = 60.0,
        tolerance: float = DEFAULT_TOLERANCE,
    ) -> None:
        if not isinstance(secret, str) or not secret:
            raise ValueError("secret must be a non-empty string (the callback.secret of your tasks)")
        self.secret = secret
        self._host = host
        self._port = port
        self._public_url = public_url
        self._on_delivery = on_delivery
        self._read_timeout = read_timeout
        self._tolerance = tolerance
        self._lock = threading.Condition()
        self._seen: Set[str] = set()
        self._handling: Set[str] = set()  # delivery ids whose on_delivery is running
        self._tasks: Dict[str, JSON] = {}
        self._groups: Dict[str, JSON] = {}
        self._async_waiters: List[Tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]] = []
        self.deliveries: List[Delivery] = []
        self.rejected = 0
        self.duplicates = 0
        self._forgotten: Set[Tuple[str, str]] = set()  # ("task" | "group", id) dropped by forget()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # ── lifecycle ──────────────────────────────────────────────────────────────────────────

    def start(self) -> "CallbackReceiver":
        if self._server is not None:
            return self
        self._server = _server_class(self._host)((self._host, self._port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="rollgate-callbacks", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None

    def __enter__(self) -> "CallbackReceiver":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "CallbackReceiver":
        return self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    @property
    def url(self) -> str:
        """The callback URL to put in tasks."""
        if self._public_url:
            return self._public_url
        if self._server is None:
            raise RuntimeError("the receiver is not started: use it as a context manager or call start()")
        port = self._server.server_address[1]
        host = "127.0.0.1" if self._host in ("0.0.0.0", "") else "::1" if self._host == "::" else self._host
        return "http://%s:%d/rollouts" % ("[%s]" % host if ":" in host else host, port)

    @property
    def callback(self) -> Dict[str, str]:
        """``{"url", "secret"}``: a task's (or group's) ``callback``."""
        return {"url": self.url, "secret": self.secret}

    # ── results ────────────────────────────────────────────────────────────────────────────

    def forget(self, task_or_group_id: str) -> None:
        """Drops what the inbox holds for a task, or for a group: its body, its members' results and
        the deliveries that carried them. The inbox keeps every result it received until then, so a
        training loop that uses one receiver for many steps calls it once a group's results are in
        its batch (else it holds every trajectory of the run). A delivery for a forgotten task or
        group that comes later (a member's callback retried after the group's came) is acknowledged
        and not kept, so a wait for what was forgotten times out.
        """
        with self._lock:
            dropped: Set[Tuple[str, str]] = {("task", task_or_group_id)}
            group = self._groups.pop(task_or_group_id, None)
            if group is not None:
                dropped.add(("group", task_or_group_id))
                dropped.update(("task", r["id"]) for r in group.get("tasks") or [] if isinstance(r, dict) and isinstance(r.get("id"), str))
            for kind, key in dropped:
                if kind == "task":
                    self._tasks.pop(key, None)
            self._forgotten.update(dropped)
            self.deliveries[:] = [d for d in self.deliveries if _key(d.event, d.body) not in dropped]

    def result(self, task_id: str) -> Optional[JSON]:
        """A task's result if its callback came, else None."""
        with self._lock:
            return self._tasks.get(task_id)

    def wait(self, task_id: str, timeout: Optional[float] = None) -> JSON:
        """Blocks until task ``task_id``'s callback arrives; returns its result."""
        return self._wait(lambda: self._tasks.get(task_id), "task %s" % task_id, timeout)

    def wait_group(self, group_id: str, timeout: Optional[float] = None) -> List[Optional[JSON]]:
        """Blocks until the group callback arrives; returns the members' results in member order."""
        return self._wait(lambda: self._group_results(group_id), "group %s" % group_id, timeout)

    async def wait_async(self, task_id: str, timeout: Optional[float] = None) -> JSON:
        return await self._wait_async(lambda: self._tasks.get(task_id), "task %s" % task_id, timeout)

    async def wait_group_async(self, group_id: str, timeout: Optional[float] = None) -> List[Optional[JSON]]:
        return await self._wait_async(lambda: self._group_results(group_id), "group %s" % group_id, timeout)

    def _group_results(self, group_id: str) -> Optional[List[Optional[JSON]]]:
        group = self._groups.get(group_id)
        return None if group is None else list(group.get("tasks") or [])

    def _wait(self, get: Callable[[], Optional[V]], what: str, timeout: Optional[float]) -> V:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                value = get()
                if value is not None:
                    return value
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RollgateError("no callback for %s within %s s" % (what, timeout), 0, "timeout")
                self._lock.wait(left)

    async def _wait_async(self, get: Callable[[], Optional[V]], what: str, timeout: Optional[float]) -> V:
        loop = asyncio.get_running_loop()
        future: "asyncio.Future[Any]" = loop.create_future()
        with self._lock:
            value = get()
            if value is not None:
                return value
            entry = (get, loop, future)
            self._async_waiters.append(entry)
        try:
            return cast(V, await asyncio.wait_for(future, timeout))
        except asyncio.TimeoutError:
            raise RollgateError("no callback for %s within %s s" % (what, timeout), 0, "timeout") from None
        finally:
            with self._lock:
                if entry in self._async_waiters:
                    self._async_waiters.remove(entry)

    # ── the HTTP side ──────────────────────────────────────────────────────────────────────

    def _accept(self, event: str, delivery_id: str, raw: bytes, timestamp: Optional[str], signature: Optional[str]) -> Tuple[int, bytes]:
        """What to answer a delivery; records it when it is new and genuine."""
        refused = verify_delivery(raw, delivery_id, event, timestamp, signature, self.secret, self._tolerance)
        if refused is not None:
            with self._lock:
                self.rejected += 1
            return 401, json.dumps({"error": refused}).encode()
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            return 400, b'{"error":"body is not JSON"}'
        if not isinstance(body, dict):
            return 400, b'{"error":"body is not a JSON object"}'
        if _key(event, body) == ("", "") and (event.startswith("group.") or event.startswith("task.")):
            # A task's body under a group's event (or the reverse) must not stand in for that
            # group's results, even when signed so.
            return 400, b'{"error":"the body is not what X-Rollgate-Event says"}'
        with self._lock:
            # A retry that comes while the same delivery is still being handled (rollgate gave up
            # waiting for a slow handler) waits for that one: handled once, or again if it failed.
            while delivery_id and delivery_id in self._handling:
                self._lock.wait()
            if delivery_id and delivery_id in self._seen:
                self.duplicates += 1
                return 200, b'{"ok":true,"duplicate":true}'
            if delivery_id:
                self._handling.add(delivery_id)
        delivery = Delivery(event, delivery_id, body, raw)
        handled = False
        try:
            if self._on_delivery is not None:
                self._on_delivery(delivery)
            handled = True
        except Exception:
            pass
        finally:
            # Seen in the same step as it stops being handled, so a waiting retry finds it.
            with self._lock:
                if delivery_id:
                    self._handling.discard(delivery_id)
                    if handled:
                        self._seen.add(delivery_id)
                    self._lock.notify_all()
        if not handled:
            return 500, b'{"error":"the handler failed; deliver again"}'
        with self._lock:
            key = _key(event, body)
            if key in self._forgotten:
                # A member's delivery that came after its group was forgotten: acknowledged, not kept.
                return 200, b'{"ok":true}'
            self.deliveries.append(delivery)
            if key[0] == "group":
                self._groups[key[1]] = body
            elif key[0] == "task":
                self._tasks[key[1]] = body
            self._lock.notify_all()
            for get, loop, future in list(self._async_waiters):
                value = get()
                if value is not None:
                    self._async_waiters.remove((get, loop, future))
                    loop.call_soon_threadsafe(_settle, future, value)
        return 200, b'{"ok":true}'

    def _handler(self) -> type:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Per socket operation (http.server sets it on the connection): a read that waits this
            # long ends the connection instead of holding its thread.
            timeout = receiver._read_timeout

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                raw = self._body()
                if raw is None:
                    return
                status, answer = receiver._accept(
                    self.headers.get("x-rollgate-event", ""),
                    self.headers.get("x-rollgate-delivery", ""),
                    raw,
                    self.headers.get("x-rollgate-timestamp"),
                    self.headers.get("x-rollgate-signature-v2"),
                )
                self._reply(status, answer)

            def _body(self) -> Optional[bytes]:
                """The request body, whole: by Content-Length, or in chunks (a proxy on the way may
                re-frame it so). None when it was refused (the answer is sent and the connection
                ends: what is left of the body must not be read as a request) or cut short."""
                coding = (self.headers.get("transfer-encoding") or "").strip().lower()
                if coding:
                    if coding != "chunked":
                        return self._refuse(501, b'{"error":"unsupported transfer-encoding"}')
                    return self._chunked()
                text = (self.headers.get("content-length") or "0").strip()
                if not DECIMAL.fullmatch(text):
                    return self._refuse(400, b'{"error":"bad content-length"}')
                if int(text) > MAX_BODY:
                    return self._refuse(413, b'{"error":"body over the receiver\'s limit"}')
                return self._exactly(int(text))

            def _exactly(self, n: int) -> Optional[bytes]:
                """n bytes of the body; None when the sender went away first (no one to answer, and
                a cut body is not a forgery to count: rollgate sends the delivery again)."""
                data = self.rfile.read(n)
                if len(data) < n:
                    self.close_connection = True
                    return None
                return data

            def _chunked(self) -> Optional[bytes]:
                parts: List[bytes] = []
                size = 0
                while True:
                    digits = self.rfile.readline(1024).split(b";", 1)[0].strip()
                    if not HEX.fullmatch(digits):
                        return self._refuse(400, b'{"error":"bad chunk"}')
                    n = int(digits, 16)
                    size += n
                    if size > MAX_BODY:
                        return self._refuse(413, b'{"error":"body over the receiver\'s limit"}')
                    if n == 0:
                        break
                    part = self._exactly(n)
                    if part is None:
                        return None
                    parts.append(part)
                    if self.rfile.read(2) != b"\r\n":
                        return self._refuse(400, b'{"error":"bad chunk"}')
                # Trailers, then the empty line that ends the body.
                while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)

            def _refuse(self, status: int, body: bytes) -> None:
                self.close_connection = True
                self._reply(status, body, {"Connection": "close"})
                return None

            def do_GET(self) -> None:  # noqa: N802
                self._reply(405, b'{"error":"POST callbacks here"}', {"Allow": "POST"})

            def _reply(self, status: int, body: bytes, extra: Optional[Dict[str, str]] = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _server_class(host: str) -> type:
    """A threading HTTP server that takes an IPv6 address as its host (http.server's is IPv4 only);
    "::" takes IPv4 too where the system allows, as "0.0.0.0" is the IPv4 way of saying every
    interface. Host names stay IPv4, as before ("localhost" is 127.0.0.1)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family

        def server_bind(self) -> None:
            if family == socket.AF_INET6 and host == "::" and hasattr(socket, "IPV6_V6ONLY"):
                try:
                    self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                except OSError:
                    pass
            super().server_bind()

    return Server


def _key(event: str, body: JSON) -> Tuple[str, str]:
    """What a delivery is about: ("group", group id), ("task", task id), or ("", "") for neither."""
    if event.startswith("group."):
        return ("group", body["group_id"]) if isinstance(body.get("group_id"), str) and isinstance(body.get("tasks"), list) else ("", "")
    return ("task", body["id"]) if isinstance(body.get("id"), str) and isinstance(body.get("status"), str) else ("", "")


def _settle(future: "asyncio.Future[Any]", value: Any) -> None:
    if not future.done():
        future.set_result(value)
