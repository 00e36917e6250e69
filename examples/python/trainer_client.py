#!/usr/bin/env python3
"""A trainer's side of rollgate in one stdlib-only file (Python 3.8+).

Submits one GRPO group (``POST /v1/tasks/batch {group_id, n, task, group_callback}``), receives
the signed callbacks on a small ``http.server`` -- one per rollout and one for the whole group --,
checks every ``X-Rollgate-Signature: sha256=<hex HMAC-SHA256(raw body, secret)>`` before trusting
a byte, and prints a summary: each rollout's status, reward and tokens, and the group's rewards
(what GRPO turns into advantages).

    python3 examples/python/trainer_client.py --url http://127.0.0.1:8080 --n 4
    python3 examples/python/trainer_client.py --task my_task.json --n 8 --json

The workers must be able to reach the callback server: by default it listens on 127.0.0.1 (the
all-in-one cluster on this machine). For a remote cluster use ``--host 0.0.0.0`` and
``--public-url http://<this host>:<port>/rollouts``. Exit code 0 when the group came back,
1 on a timeout, 2 on a bad request.
"""

import argparse
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASK = os.path.join(HERE, "..", "react-agent", "task.json")


def sign(body: bytes, secret: str) -> str:
    """The X-Rollgate-Signature of a body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(body: bytes, header: str, secret: str) -> bool:
    """Constant-time check of a callback's signature over the raw body bytes."""
    return bool(header) and hmac.compare_digest(sign(body, secret), header.strip())


class Inbox:
    """What the callback server received, shared with the main thread."""

    def __init__(self, secret: str):
        self.secret = secret
        self.lock = threading.Condition()
        self.tasks = {}  # task id -> result
        self.groups = {}  # group id -> group body
        self.deliveries = set()
        self.rejected = 0
        self.duplicates = 0


def make_handler(inbox: Inbox):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            if not verify(body, self.headers.get("x-rollgate-signature", ""), inbox.secret):
                with inbox.lock:
                    inbox.rejected += 1
                self.reply(401, b'{"error":"bad signature"}')
                return
            delivery = self.headers.get("x-rollgate-delivery", "")
            event = self.headers.get("x-rollgate-event", "")
            try:
                payload = json.loads(body)
            except ValueError:
                self.reply(400, b'{"error":"not JSON"}')
                return
            with inbox.lock:
                if delivery and delivery in inbox.deliveries:
                    inbox.duplicates += 1  # a retry of something we already have: acknowledge it again
                else:
                    inbox.deliveries.add(delivery)
                    if event.startswith("group."):
                        inbox.groups[payload["group_id"]] = payload
                    else:
                        inbox.tasks[payload["id"]] = payload
                inbox.lock.notify_all()
            self.reply(200, b"ok")

        def reply(self, status: int, body: bytes):
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    return Handler


def api(url: str, path: str, api_key, body=None):
    """One JSON request to the gateway; raises SystemExit with the server's error on 4xx/5xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method="POST" if data is not None else "GET")
    req.add_header("content-type", "application/json")
    if api_key:
        req.add_header("authorization", "Bearer " + api_key)
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return json.loads(res.read() or b"null")
    except urllib.error.HTTPError as err:
        text = err.read().decode("utf-8", "replace")
        try:
            e = json.loads(text)["error"]
            msg = "%s: %s" % (e.get("type"), e.get("message"))
        except (ValueError, KeyError, TypeError):
            msg = text[:300]
        print("rollgate answered HTTP %d: %s" % (err.code, msg), file=sys.stderr)
        sys.exit(2 if 400 <= err.code < 500 else 1)
    except urllib.error.URLError as err:
        print("cannot reach the rollgate gateway at %s (%s)" % (url, err.reason), file=sys.stderr)
        sys.exit(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Submit a GRPO group to rollgate and receive its signed callbacks.")
    p.add_argument("--url", default=os.environ.get("ROLLGATE_URL", "http://127.0.0.1:8080"), help="the gateway (env ROLLGATE_URL)")
    p.add_argument("--api-key", default=os.environ.get("ROLLGATE_API_KEY"), help="API key (env ROLLGATE_API_KEY)")
    p.add_argument("--task", default=DEFAULT_TASK, help="a task JSON file (default: the react-agent example)")
    p.add_argument("--n", type=int, default=4, help="rollouts in the group (default 4)")
    p.add_argument("--group-id", default=None, help="group id (default: a fresh one)")
    p.add_argument("--host", default="127.0.0.1", help="callback server listen address")
    p.add_argument("--port", type=int, default=0, help="callback server port (default: a free one)")
    p.add_argument("--public-url", default=None, help="the callback URL workers should use, if not http://<host>:<port>/rollouts")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for the group (default 300)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = p.parse_args(argv)

    with open(args.task) as f:
        task = json.load(f)
    for key in ("id", "group_id", "callback"):
        task.pop(key, None)
    group_id = args.group_id or "g-py-" + secrets.token_hex(4)
    secret = secrets.token_hex(16)

    inbox = Inbox(secret)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(inbox))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    callback_url = args.public_url or "http://%s:%d/rollouts" % (host, server.server_address[1])
    # Printed (and flushed) first, so a supervisor knows where callbacks arrive.
    print("callbacks: %s" % callback_url, file=sys.stderr if args.json else sys.stdout, flush=True)

    task["callback"] = {"url": callback_url, "secret": secret}
    started = time.time()
    accepted = api(args.url, "/v1/tasks/batch", args.api_key, {
        "group_id": group_id,
        "n": args.n,
        "task": task,
        "group_callback": {"url": callback_url, "secret": secret},
    })
    ids = [t["id"] for t in accepted["tasks"]]
    if not args.json:
        print("submitted group %s: %d rollouts (%s ... %s)" % (group_id, len(ids), ids[0], ids[-1]), flush=True)

    deadline = started + args.timeout
    with inbox.lock:
        while group_id not in inbox.groups or any(i not in inbox.tasks for i in ids):
            left = deadline - time.time()
            if left <= 0:
                break
            inbox.lock.wait(timeout=min(left, 1.0))
        group = inbox.groups.get(group_id)
        results = [inbox.tasks.get(i) for i in ids]
        rejected, duplicates = inbox.rejected, inbox.duplicates
    server.shutdown()

    rewards = [r["reward"] for r in results if r and r["status"] == "completed" and r["reward"] is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = (sum((x - mean) ** 2 for x in rewards) / len(rewards)) ** 0.5 if rewards else None
    summary = {
        "group_id": group_id,
        "n": len(ids),
        "task_callbacks": sum(1 for r in results if r),
        "group_callback": group is not None,
        "group_tasks": len(group["tasks"]) if group else 0,
        "rejected_signatures": rejected,
        "duplicate_deliveries": duplicates,
        "statuses": {s: sum(1 for r in results if r and r["status"] == s) for s in ("completed", "failed", "timed_out", "cancelled")},
        "rewards": rewards,
        "mean_reward": mean,
        "std_reward": std,
        # GRPO: a rollout's advantage is its reward minus the group's mean (here over std).
        "advantages": [round((x - mean) / (std or 1.0), 4) for x in rewards] if rewards else [],
        "trainable_tokens": sum(r["trajectory"]["stats"]["trainable_tokens"] for r in results if r and r.get("trajectory")),
        "elapsed_s": round(time.time() - started, 2),
        "tasks": [
            {"id": r["id"], "status": r["status"], "reward": r["reward"], "llm_calls": r["usage"]["llm_calls"],
             "completion_tokens": r["usage"]["completion_tokens"]} if r else {"id": i, "status": "no callback"}
            for i, r in zip(ids, results)
        ],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print("%-28s %-10s %7s %6s %7s" % ("task", "status", "reward", "calls", "tokens"))
        for t in summary["tasks"]:
            print("%-28s %-10s %7s %6s %7s" % (t["id"], t["status"], t.get("reward", "-"), t.get("llm_calls", "-"), t.get("completion_tokens", "-")))
        print("group %s: %d/%d callbacks verified, group callback %s, mean reward %s, %d forged deliveries refused"
              % (group_id, summary["task_callbacks"], len(ids), "received" if group else "MISSING",
                 "-" if mean is None else "%.3f" % mean, rejected))
    complete = group is not None and all(results)
    if not complete:
        print("timed out after %ss waiting for callbacks" % args.timeout, file=sys.stderr)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
