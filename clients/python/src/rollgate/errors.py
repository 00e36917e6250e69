"""The one exception the package raises."""

from __future__ import annotations

import json
from typing import Any, Optional


class RollgateError(Exception):
    """A call to rollgate failed.

    Attributes:
        status: the HTTP status of the gateway's answer; 0 when no answer came (the gateway could
            not be reached, the connection dropped, a wait timed out).
        type: the server's ``error.type`` (``invalid_request``, ``not_found``, ``unauthorized``,
            ``conflict``, ``not_paused``, ``weights_load_failed``, …), or the client's own:
            ``unreachable`` (no answer), ``timeout`` (a wait ran out), ``invalid_response`` (the
            answer was not what the API promises), ``stream_closed`` (an event stream kept dropping).
        message: the server's ``error.message`` (or the client's sentence).
        details: the server's ``error.details`` (e.g. one entry per invalid field), or None.
        request: ``"METHOD /path"`` of the request that failed, when there was one.
    """

    def __init__(self, message: str, status: int = 0, type: str = "error", details: Any = None, request: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.details = details
        self.request = request

    @property
    def unreachable(self) -> bool:
        """True when the gateway gave no answer at all."""
        return self.status == 0 and self.type == "unreachable"

    def __str__(self) -> str:
        where = " (%s)" % self.request if self.request else ""
        status = "HTTP %d " % self.status if self.status else ""
        return "%s%s: %s%s" % (status, self.type, self.message, where)

    def __repr__(self) -> str:
        return "RollgateError(status=%d, type=%r, message=%r)" % (self.status, self.type, self.message)

    @classmethod
    def from_response(cls, status: int, body: bytes, request: str) -> "RollgateError":
        """The error for a non-2xx answer: the server's ``{"error": {type, message, details}}`` when it sent one."""
        text = body.decode("utf-8", "replace")
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = None
        err = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return cls(err["message"], status, str(err.get("type") or "error"), err.get("details"), request)
        kind = {401: "unauthorized", 404: "not_found"}.get(status, "internal_error" if status >= 500 else "http_error")
        snippet = text.strip()[:300]
        return cls("%s answered HTTP %d%s" % (request, status, ": " + snippet if snippet else ""), status, kind, None, request)
