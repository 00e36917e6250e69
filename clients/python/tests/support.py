"""What the live suites share: the cluster under test, task builders, and a flaky TCP proxy.

The live suites talk to a running rollgate cluster: ``ROLLGATE_URL`` (and ``ROLLGATE_API_KEY`` when
it requires one). Start one with ``npm start`` (or ``npx rollgate up``) from the repository.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import threading
import unittest
import uuid
from typing import Any, Dict, List, Optional
from urllib.parse import urlsplit

URL = os.environ.get("ROLLGATE_URL")
API_KEY = os.environ.get("ROLLGATE_API_KEY") or None
NO_CLUSTER = "ROLLGATE_URL is not set: these tests need a running cluster (npm start, then ROLLGATE_URL=<its URL>)"

live = unittest.skipUnless(URL, NO_CLUSTER)

# The agent every live task runs: one chat call to its session, the answer written to answer.txt.
AGENT = r'''
import json, os, urllib.request
body = {"model": "policy", "messages": [{"role": "user", "content": os.environ["ROLLGATE_INSTRUCTION"]}]}
req = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
with urllib.request.urlopen(req, timeout=60) as res:
    answer = json.load(res)["choices"][0]["message"]["content"] or ""
with open("answer.txt", "w") as f:
    f.write(answer)
print(answer)
'''

# Reward 1.0 when the answer holds the word, else 0.0 (the evaluator's last stdout line).
SCORE = "import sys; print(1.0 if sys.argv[1] in open('answer.txt').read() else 0.0)"


def uid(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def answer_task(say: str = "hello there", want: str = "hello", **extra: Any) -> Dict[str, Any]:
    """A task whose model answers ``say`` (engine-sim's script) and whose reward is whether ``want`` is in it."""
    task: Dict[str, Any] = {
        "instruction": "Greet me.\n#sim: %s" % json.dumps([{"text": say}]),
        "agent": {"harness": "command", "command": ["python3", "agent.py"]},
        "runtime": {"files": {"agent.py": AGENT}},
        "evaluator": {"kind": "command", "command": ["python3", "-c", SCORE, want], "reward": "last_line_float"},
        "limits": {"timeout_s": 120},
        "metadata": {"suite": "rollgate-python"},
    }
    task.update(extra)
    return task


def sleeper_task(seconds: int = 60, **extra: Any) -> Dict[str, Any]:
    """A task that only sleeps (to be cancelled)."""
    task: Dict[str, Any] = {
        "instruction": "wait",
        "agent": {"harness": "command", "command": ["sleep", str(seconds)]},
        "evaluator": {"kind": "none"},
        "limits": {"timeout_s": seconds + 60},
    }
    task.update(extra)
    return task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlakyProxy:
    """A real TCP proxy in front of the gateway. It resets the first ``drop`` connections right after
    reading their request head (the request reached the network, no answer ever comes: what a
    client sees when a load balancer or the gateway dies), and forwards every later one; with
    ``cut_stream_after_events`` the first event stream it forwards is cut after that many events."""

    def __init__(self, target_url: str, drop: int = 0, cut_stream_after_events: Optional[int] = None, lose_answers: int = 0, lose_answers_to: str = "") -> None:
        parts = urlsplit(target_url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.drop = drop
        # The first `lose_answers` connections (after any dropped ones) reach the gateway, which acts
        # on them; their answer never reaches the client (reset instead): did it happen or not?
        self.lose_answers = lose_answers
        # Only requests whose request line starts with this ("POST /admin/inference/pause") lose theirs.
        self.lose_answers_to = lose_answers_to
        self.lost = 0
        # The first event stream is cut (the connection closed mid-chunk) right after this many events.
        self.cut_after = cut_stream_after_events
        self.connections = 0
        self.dropped = 0
        self.first_lines: List[str] = []
        self.heads: List[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self._server.server_address[1]

    def __enter__(self) -> "FlakyProxy":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, client: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            drop = self.dropped < self.drop
            if drop:
                self.dropped += 1
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(65536)
            if not chunk:
                return
            head += chunk
        with self._lock:
            self.first_lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
            self.heads.append(head.decode("latin-1"))
            streams = [h for h in self.heads if b"text/event-stream" in h.encode("latin-1")]
            cut = self.cut_after if self.cut_after is not None and len(streams) == 1 and b"text/event-stream" in head else None
        if drop:
            reset(client)
            return
        upstream = socket.create_connection(self.target)
        upstream.sendall(head)
        with self._lock:
            lose = self.lost < self.lose_answers and head.decode("latin-1").startswith(self.lose_answers_to)
            if lose:
                self.lost += 1
        if lose:
            self._forward_then_reset(client, upstream, head)
            return

        def pump(src: socket.socket, dst: socket.socket, cut_after: Optional[int] = None) -> None:
            seen = b""
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    if cut_after is not None:
                        seen += data
                        body = seen.find(b"\r\n\r\n")
                        ends = [k for k in range(body + 4, len(seen)) if seen.startswith(b"\n\n", k)] if body >= 0 else []
                        if len(ends) >= cut_after:
                            dst.sendall(data[: len(data) - (len(seen) - (ends[cut_after - 1] + 2))])
                            # Shut down (not just closed: the other direction's thread is reading it), mid-chunk.
                            dst.shutdown(socket.SHUT_RDWR)
                            src.close()
                            return
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        back = threading.Thread(target=pump, args=(upstream, client, cut), daemon=True)
        back.start()
        pump(client, upstream)
        back.join(timeout=120)
        upstream.close()
        client.close()


    def _forward_then_reset(self, client: socket.socket, upstream: socket.socket, head: bytes) -> None:
        """Sends the whole request on, waits for the gateway's answer to begin, then resets the client."""
        length = 0
        for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        sent = len(head.split(b"\r\n\r\n", 1)[1])
        while sent < length:
            chunk = client.recv(65536)
            if not chunk:
                break
            upstream.sendall(chunk)
            sent += len(chunk)
        upstream.recv(65536)  # the answer has begun: the gateway acted
        upstream.close()
        reset(client)


def reset(sock: socket.socket) -> None:
    """Closes a connection with a TCP reset (what a crashed peer looks like)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


def signed(body: bytes, secret: str, event: str = "task.completed", delivery_id: str = "d-1", timestamp: Optional[int] = None) -> Dict[str, str]:
    """The headers a worker sends with a delivery signed at ``timestamp`` (Unix seconds; default now)."""
    import time

    import rollgate

    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "x-rollgate-event": event,
        "x-rollgate-delivery": delivery_id,
        "x-rollgate-timestamp": str(ts),
        "x-rollgate-signature-v2": rollgate.sign_delivery(delivery_id, ts, event, body, secret),
        "x-rollgate-signature": rollgate.sign(body, secret),
    }


def post_raw(url: str, body: bytes, headers: Dict[str, str]) -> int:
    """POSTs bytes as they are (a forged or replayed callback); returns the status."""
    import http.client

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=10)
    try:
        conn.request("POST", parts.path or "/", body=body, headers={"content-type": "application/json", **headers})
        res = conn.getresponse()
        res.read()
        return res.status
    finally:
        conn.close()


def wait_for(predicate: Any, timeout: float = 30.0, every: float = 0.1) -> Optional[Any]:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return None
