"""What both clients share: the description of one API call, how an answer becomes a value or a
RollgateError, and when a failed call may be sent again. No I/O here."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, Mapping, Optional, Tuple, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from .errors import RollgateError

__version__ = "0.1.0"
USER_AGENT = "rollgate-python/%s" % __version__

# Answers that say "try again shortly" without anything having happened.
RETRYABLE_STATUSES = frozenset((502, 503, 504))

T = TypeVar("T")


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the API and how to read its answer (``parse`` makes the ``T`` it returns)."""

    method: str
    path: str
    query: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    has_body: bool = False
    # Safe to send twice: GET, DELETE (cancel), a submit whose task ids are given.
    idempotent: bool = False
    # Seconds for this call instead of the client's default (long admin calls).
    timeout: Optional[float] = None
    parse: Callable[[Any], T] = _identity
    # The answer is text (the logs), not JSON.
    text: bool = False

    @property
    def label(self) -> str:
        return "%s %s" % (self.method, self.path)

    def target(self, base_path: str) -> str:
        """The request target: base path + path + query (None and "" values left out)."""
        q = {k: v for k, v in self.query.items() if v is not None and v != ""}
        return base_path + self.path + ("?" + urlencode(q) if q else "")

    def __post_init__(self) -> None:
        if self.has_body:
            # Refused here, before anything is sent, naming the field.
            check_json_numbers(self.body, "body of %s" % self.label)

    def payload(self) -> Optional[bytes]:
        return json.dumps(self.body, separators=(",", ":"), allow_nan=False).encode("utf-8") if self.has_body else None


# The gateway reads JSON numbers as JavaScript doubles: an integer beyond this comes back changed
# (2**63 + 5 as 9223372036854775808), and NaN / Infinity are not JSON at all.
MAX_SAFE_INTEGER = 2**53 - 1


def _as_double(value: int) -> str:
    try:
        return "%d" % int(float(value))
    except OverflowError:
        return "Infinity"


def check_json_numbers(value: Any, where: str, path: str = "") -> None:
    """Raises ValueError naming the first number the gateway would not keep exactly."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise ValueError(
                "%s: %s = %d is an integer beyond +-(2**53 - 1): the gateway reads JSON numbers as doubles and would keep it as %s; send it as a string"
                % (where, path or "(the value)", value, _as_double(value))
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("%s: %s = %r is not a JSON number" % (where, path or "(the value)", value))
    elif isinstance(value, Mapping):
        for k, v in value.items():
            check_json_numbers(v, where, "%s.%s" % (path, k) if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_json_numbers(v, where, "%s[%d]" % (path, i))


def seg(value: str) -> str:
    """One path segment, escaped (task and session ids are the caller's strings)."""
    return quote(str(value), safe="")


@dataclass(frozen=True)
class Endpoint:
    """Where the gateway is: scheme, host, port and a base path."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, base_url: str) -> "Endpoint":
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http(s) URL such as http://127.0.0.1:8080, got %r" % base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = "[%s]" % self.host if ":" in self.host else self.host
        return host if self.port == default else "%s:%d" % (host, self.port)


def headers_for(call: Call[Any], endpoint: Endpoint, api_key: Optional[str], extra: Optional[Mapping[str, str]] = None, accept: str = "application/json") -> Dict[str, str]:
    headers = {"Host": endpoint.host_header, "User-Agent": USER_AGENT, "Accept": accept, "Connection": "close"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    if call.has_body:
        headers["Content-Type"] = "application/json"
    headers.update(extra or {})
    return headers


def decode(call: Call[T], status: int, headers: Mapping[str, str], body: bytes) -> T:
    """The value of a 2xx answer (JSON parsed, then ``call.parse``), else the server's error."""
    if status < 200 or status >= 300:
        raise RollgateError.from_response(status, body, call.label)
    if not body:
        return call.parse(None)
    ctype = headers.get("content-type", "")
    if "json" not in ctype:
        if not call.text:
            # Another server at this address (a web app, a proxy's login page) answering 200: not a result.
            raise RollgateError(
                "%s answered %s, not JSON: is this a rollgate gateway? %r" % (call.label, ctype or "no content-type", body[:200]), status, "invalid_response", None, call.label
            )
        return call.parse(body.decode("utf-8", "replace"))
    try:
        value = json.loads(body.decode("utf-8"))
    except ValueError:
        raise RollgateError("%s answered invalid JSON: %r" % (call.label, body[:200]), status, "invalid_response", None, call.label) from None
    try:
        return call.parse(value)
    except (KeyError, TypeError, ValueError) as err:
        raise RollgateError("%s answered an unexpected shape (%s): %s" % (call.label, err, json.dumps(value)[:300]), status, "invalid_response", None, call.label) from None


@dataclass(frozen=True)
class RetryPolicy:
    """Transport failures (and 502/503/504) of idempotent calls are sent again, with exponential backoff.

    A POST that could create something twice is never sent again: after a dropped connection the
    caller cannot know whether the gateway acted, so it gets the error.
    """

    retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 5.0

    def delay(self, attempt: int, retry_after: Optional[str] = None) -> float:
        """Seconds before attempt ``attempt + 1`` (``attempt`` counts from 0), with a little jitter."""
        if retry_after and retry_after.strip().isdigit():
            return min(float(retry_after), self.max_backoff)
        base: float = min(self.backoff * (2.0 ** attempt), self.max_backoff)
        return base * (0.8 + 0.4 * random.random())

    def should_retry(self, call: Call[Any], attempt: int, failure: "Failure") -> bool:
        return call.idempotent and attempt < self.retries and (failure.transport or failure.status in RETRYABLE_STATUSES)


@dataclass(frozen=True)
class Failure:
    """Why one attempt did not produce an answer: a transport error, or a retryable status."""

    transport: bool
    status: int = 0
    error: Optional[RollgateError] = None


class TransportBase:
    """What the sync and async transports hold: where the gateway is, the key, the timeout, the retry policy and extra headers."""

    def __init__(self, endpoint: Endpoint, api_key: Optional[str], timeout: float, retry: "RetryPolicy", headers: Optional[Mapping[str, str]] = None) -> None:
        self.endpoint = endpoint
        self.api_key = api_key
        self.timeout = timeout
        self.retry = retry
        self.headers = dict(headers or {})


def settle(
    retry: "RetryPolicy",
    call: Call[T],
    endpoint: Endpoint,
    attempt: int,
    answer: Optional[Tuple[int, Mapping[str, str], bytes]],
    err: Optional[BaseException] = None,
) -> Tuple[bool, Any]:
    """One attempt's outcome, the same for the sync and async transports: ``(True, value)`` when the
    call is answered, ``(False, seconds)`` to wait and try again; raises once the call is given up."""
    retry_after = None
    if answer is None:
        failure = Failure(transport=True, error=transport_error(call, endpoint, err or RuntimeError("no answer")))
    else:
        status, headers, body = answer
        if 200 <= status < 300:
            return True, decode(call, status, headers, body)
        failure = Failure(transport=False, status=status, error=RollgateError.from_response(status, body, call.label))
        retry_after = headers.get("retry-after")
    if not retry.should_retry(call, attempt, failure):
        assert failure.error is not None
        raise failure.error
    return False, retry.delay(attempt, retry_after)


def transport_error(call: Call[Any], endpoint: Endpoint, err: BaseException) -> RollgateError:
    base = "%s://%s%s" % (endpoint.scheme, endpoint.host_header, endpoint.base_path)
    kind = "timed out" if isinstance(err, TimeoutError) or "timed out" in str(err) else (str(err) or type(err).__name__)
    return RollgateError("cannot reach the rollgate gateway at %s (%s)" % (base, kind), 0, "unreachable", None, call.label)


def split_status_line(line: bytes) -> Tuple[int, str]:
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError("not an HTTP status line: %r" % line[:80])
    return int(parts[1]), parts[2] if len(parts) > 2 else ""
