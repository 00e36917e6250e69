"""An incremental Server-Sent Events parser (the WHATWG event-stream rules the task event stream
needs: ``id``, ``event``, multi-line ``data``, comments, CRLF / LF / CR line ends, a blank line
dispatches). Feed it text as it arrives; it returns the events those bytes completed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class SSEMessage:
    id: Optional[str]
    event: str
    data: str


class SSEParser:
    def __init__(self) -> None:
        self._buffer = ""
        self._id: Optional[str] = None
        self._event = ""
        self._data: List[str] = []

    def feed(self, chunk: str) -> List[SSEMessage]:
        self._buffer += chunk
        out: List[SSEMessage] = []
        while True:
            cut = -1
            for k, ch in enumerate(self._buffer):
                if ch in "\r\n":
                    cut = k
                    break
            if cut < 0:
                break
            if self._buffer[cut] == "\r" and cut == len(self._buffer) - 1:
                break  # maybe the first half of \r\n: wait for more
            sep = 2 if self._buffer.startswith("\r\n", cut) else 1
            line, self._buffer = self._buffer[:cut], self._buffer[cut + sep:]
            message = self._line(line)
            if message is not None:
                out.append(message)
        return out

    def _line(self, line: str) -> Optional[SSEMessage]:
        if line == "":
            message = SSEMessage(self._id, self._event or "message", "\n".join(self._data)) if self._data else None
            self._event, self._data = "", []
            return message
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


def task_event(message: SSEMessage, task_id: str) -> Optional[Dict[str, Any]]:
    """A task event (``{id, type, at, data}``) from one SSE message, with ``task_id`` added; None when it is not one."""
    try:
        event = json.loads(message.data)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not isinstance(event.get("type"), str):
        return None
    event["task_id"] = task_id
    return event
