"""``rollgate.CallbackReceiver`` with real deliveries from a live cluster: results arrive, a forged
signature is refused with nothing of its body kept, a redelivered callback is not counted twice,
and a handler that fails makes rollgate deliver again."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
import unittest

import rollgate
from rollgate import grpo
from support import API_KEY, URL, answer_task, live, post_raw, signed, uid, wait_for


class ReceiverWithoutClusterTest(unittest.TestCase):
    def test_forged_unsigned_and_garbled_deliveries_are_refused(self):
        with rollgate.CallbackReceiver("s3cret") as inbox:
            body = json.dumps({"id": "t-forged", "status": "completed", "reward": 1}).encode()
            headers = {"x-rollgate-event": "task.completed", "x-rollgate-delivery": "d-1"}
            self.assertEqual(post_raw(inbox.url, body, signed(body, "not-the-secret")), 401)
            self.assertEqual(post_raw(inbox.url, body, headers), 401)
            self.assertEqual(post_raw(inbox.url, body, {**signed(body + b" ", "s3cret")}), 401)
            self.assertEqual(inbox.rejected, 3)
            self.assertEqual(inbox.deliveries, [])
            self.assertIsNone(inbox.result("t-forged"))
            # The same delivery signed right is taken: the refusals kept nothing, not even its id.
            self.assertEqual(post_raw(inbox.url, body, signed(body, "s3cret")), 200)
            self.assertEqual(inbox.wait("t-forged", timeout=1)["reward"], 1)
            self.assertEqual(post_raw(inbox.url, b"not json", signed(b"not json", "s3cret", delivery_id="d-2")), 400)
            # A task's genuine body signed as its group's callback does not stand in for the group
            # (whose wait would return no members).
            member = json.dumps({"id": "g-x-0", "group_id": "g-x", "status": "completed", "reward": 1}).encode()
            self.assertEqual(post_raw(inbox.url, member, signed(member, "s3cret", "group.completed", "d-3")), 400)
            with self.assertRaises(rollgate.RollgateError):
                inbox.wait_group("g-x", timeout=0.1)
        with self.assertRaises(ValueError):
            rollgate.CallbackReceiver("")

    def test_a_captured_delivery_replayed_relabelled_or_old_is_refused(self):
        """The signature covers the delivery id, the event and a timestamp: a captured delivery
        re-sent under a fresh delivery id (which deduplication would not catch), under another
        event, or long after, is refused; so is one with only the legacy body-only signature."""
        handled = []
        with rollgate.CallbackReceiver("s3cret", on_delivery=lambda d: handled.append((d.event, d.delivery_id))) as inbox:
            body = json.dumps({"id": "t-r", "status": "completed", "reward": 1}).encode()
            good = signed(body, "s3cret", "task.completed", "d-1")
            self.assertEqual(post_raw(inbox.url, body, good), 200)
            self.assertEqual(post_raw(inbox.url, body, {**good, "x-rollgate-delivery": "d-2"}), 401)
            self.assertEqual(post_raw(inbox.url, body, {**good, "x-rollgate-event": "task.failed"}), 401)
            old = int(time.time()) - 301
            self.assertEqual(post_raw(inbox.url, body, signed(body, "s3cret", "task.completed", "d-3", old)), 401)
            self.assertEqual(post_raw(inbox.url, body, signed(body, "s3cret", "task.completed", "d-4", old + 602)), 401)
            legacy = {"x-rollgate-event": "task.completed", "x-rollgate-delivery": "d-5", "x-rollgate-signature": rollgate.sign(body, "s3cret")}
            self.assertEqual(post_raw(inbox.url, body, legacy), 401)
            self.assertEqual(post_raw(inbox.url, body, {**good, "x-rollgate-timestamp": good["x-rollgate-timestamp"] + ".0"}), 401)
            self.assertEqual(inbox.rejected, 6)
            self.assertEqual(handled, [("task.completed", "d-1")])
            # A retry of the genuine one (a new timestamp, the same id): acknowledged, not handled again.
            self.assertEqual(post_raw(inbox.url, body, signed(body, "s3cret", "task.completed", "d-1")), 200)
            self.assertEqual((handled, inbox.duplicates), ([("task.completed", "d-1")], 1))
        with rollgate.CallbackReceiver("s3cret", tolerance=3600) as patient:
            half_an_hour_ago = int(time.time()) - 1800
            self.assertEqual(post_raw(patient.url, body, signed(body, "s3cret", "task.completed", "d-6", half_an_hour_ago)), 200)
            self.assertEqual(post_raw(patient.url, body, signed(body, "s3cret", "task.completed", "d-7", half_an_hour_ago - 3600)), 401)

    def test_a_retry_arriving_while_the_first_delivery_is_handled_is_not_handled_twice(self):
        # A trainer whose handler takes longer than the worker waits (30 s): the worker gives up on
        # the first POST and sends the same delivery again while the handler is still on it.
        handled = []
        second_entered = threading.Event()

        def handler(delivery: rollgate.Delivery) -> None:
            handled.append(delivery.delivery_id)
            if len(handled) == 1:
                # Held until a second call starts (the bug), or long enough for the retry to have
                # arrived and be waiting (the fix).
                second_entered.wait(3)
            else:
                second_entered.set()

        with rollgate.CallbackReceiver("s3cret", on_delivery=handler) as inbox:
            body = json.dumps({"id": "t-slow", "status": "completed", "reward": 1}).encode()
            headers = signed(body, "s3cret", "task.completed", "d-slow")
            statuses = []
            first = threading.Thread(target=lambda: statuses.append(post_raw(inbox.url, body, headers)))
            first.start()
            self.assertTrue(wait_for(lambda: len(handled) > 0, 10))
            statuses.append(post_raw(inbox.url, body, headers))
            first.join()
            self.assertEqual(statuses, [200, 200])
            self.assertEqual(handled, ["d-slow"])
            self.assertEqual(len(inbox.deliveries), 1)
            self.assertEqual(inbox.duplicates, 1)

    def test_a_retry_after_the_handler_failed_is_handled(self):
        handled = []

        def handler(delivery: rollgate.Delivery) -> None:
            handled.append(delivery.delivery_id)
            if len(handled) == 1:
                raise RuntimeError("trainer busy")

        with rollgate.CallbackReceiver("s3cret", on_delivery=handler) as inbox:
            body = json.dumps({"id": "t-f", "status": "completed", "reward": 1}).encode()
            headers = signed(body, "s3cret", "task.completed", "d-f")
            self.assertEqual([post_raw(inbox.url, body, headers) for _ in range(3)], [500, 200, 200])
            self.assertEqual(handled, ["d-f", "d-f"])
            self.assertEqual(len(inbox.deliveries), 1)

    def test_a_delivery_sent_in_chunks_is_taken_whole(self):
        """A proxy between rollgate and the trainer may forward a callback with chunked transfer
        coding (no Content-Length): its signature is over the whole body, and so is the check."""
        with rollgate.CallbackReceiver("s3cret") as inbox:
            host, port = inbox.url.split("/")[2].rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                for k in range(2):
                    body = json.dumps({"id": "t-chunked-%d" % k, "status": "completed", "reward": 1}).encode()
                    headers = {"content-type": "application/json", **signed(body, "s3cret", "task.completed", "d-c%d" % k)}
                    # Two requests on one connection: the first one's chunks must not be read as the second.
                    conn.request("POST", "/rollouts", body=iter([body[:7], body[7:20], body[20:]]), headers=headers, encode_chunked=True)
                    res = conn.getresponse()
                    self.assertEqual((res.status, res.read()), (200, b'{"ok":true}'))
            finally:
                conn.close()
            self.assertEqual([inbox.wait("t-chunked-%d" % k, timeout=1)["reward"] for k in range(2)], [1, 1])
            self.assertEqual(inbox.rejected, 0)

    def test_a_body_refused_unread_ends_its_connection(self):
        """What follows a body the receiver did not read (over the size limit, a bad length) is
        never taken as another request on the same connection."""
        with rollgate.CallbackReceiver("s3cret") as inbox:
            host, port = inbox.url.split("/")[2].rsplit(":", 1)
            for length in (str(rollgate.callbacks.MAX_BODY + 1), "-5", "ten", "+5", "\u00b2"):
                with socket.create_connection((host, int(port)), timeout=10) as sock:
                    sock.sendall(("POST /rollouts HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n" % length).encode("latin-1") + b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
                    answer = b""
                    while True:
                        data = sock.recv(65536)
                        if not data:
                            break
                        answer += data
                self.assertEqual(answer.count(b"HTTP/1.1 "), 1, answer)
                self.assertIn(b"Connection: close", answer)

    def test_a_sender_that_stalls_mid_body_is_let_go(self):
        """A connection that stops sending part-way (a stalled proxy, a slow-loris) is closed after
        ``read_timeout`` instead of holding its thread, and nothing of it is taken."""
        with rollgate.CallbackReceiver("s3cret", read_timeout=0.5) as inbox:
            host, port = inbox.url.split("/")[2].rsplit(":", 1)
            body = json.dumps({"id": "t-stalled", "status": "completed", "reward": 1}).encode()
            head = "POST /rollouts HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (len(body), "".join("%s: %s\r\n" % h for h in signed(body, "s3cret", delivery_id="d-stalled").items()))
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(head.encode() + body[:10])
                self.assertEqual(sock.recv(65536), b"")  # closed by the receiver (the 30 s socket timeout would raise instead)
            self.assertIsNone(inbox.result("t-stalled"))
            self.assertEqual(inbox.deliveries, [])

    def test_a_group_forgotten_is_no_longer_held(self):
        """One receiver for a whole run keeps every result it got; forget() lets a step's go, and a
        member's callback that comes after its group was forgotten is acknowledged, not kept."""
        handled = []
        with rollgate.CallbackReceiver("s3cret", on_delivery=lambda d: handled.append(d.delivery_id)) as inbox:
            members = [{"id": "g-f-%d" % k, "group_id": "g-f", "status": "completed", "reward": k} for k in range(3)]

            def deliver(event: str, body: dict, delivery_id: str) -> int:
                raw = json.dumps(body).encode()
                return post_raw(inbox.url, raw, signed(raw, "s3cret", event, delivery_id))

            self.assertEqual([deliver("task.completed", m, "d-%d" % k) for k, m in enumerate(members[:2])], [200, 200])
            self.assertEqual(deliver("group.completed", {"group_id": "g-f", "tasks": members}, "d-g"), 200)
            other = {"id": "t-other", "status": "completed", "reward": 1}
            self.assertEqual(deliver("task.completed", other, "d-o"), 200)
            self.assertEqual([r["reward"] for r in inbox.wait_group("g-f", timeout=1)], [0, 1, 2])
            self.assertEqual(len(inbox.deliveries), 4)

            inbox.forget("g-f")
            self.assertEqual([d.delivery_id for d in inbox.deliveries], ["d-o"])
            self.assertEqual([inbox.result(m["id"]) for m in members], [None, None, None])
            self.assertEqual(inbox.result("t-other"), other)
            with self.assertRaises(rollgate.RollgateError):
                inbox.wait_group("g-f", timeout=0.1)
            # The third member's own callback, retried after the group's: acknowledged, handled, not kept.
            self.assertEqual(deliver("task.completed", members[2], "d-2"), 200)
            self.assertIsNone(inbox.result("g-f-2"))
            self.assertEqual([d.delivery_id for d in inbox.deliveries], ["d-o"])
            self.assertEqual(handled, ["d-0", "d-1", "d-g", "d-o", "d-2"])
            inbox.forget("t-other")
            self.assertEqual((inbox.deliveries, inbox.result("t-other")), ([], None))

    def test_ipv6_hosts_listen_and_take_deliveries(self):
        """An IPv6-only trainer network: host "::1", and "::" (every interface, IPv4 too)."""
        try:
            socket.socket(socket.AF_INET6).close()
        except OSError as err:
            self.skipTest("this machine has no IPv6 sockets: %s" % err)
        for host, reach in (("::1", ["::1"]), ("::", ["::1", "127.0.0.1"])):
            with rollgate.CallbackReceiver("s3cret", host=host) as inbox:
                port = int(inbox.url.rsplit(":", 1)[1].split("/")[0])
                self.assertTrue(inbox.url.startswith("http://[::1]:"), inbox.url)
                for k, address in enumerate(reach):
                    body = json.dumps({"id": "t-v6-%d" % k, "status": "completed", "reward": 1}).encode()
                    url = "http://%s:%d/rollouts" % ("[%s]" % address if ":" in address else address, port)
                    headers = signed(body, "s3cret", "task.completed", "d-v6-%d" % k)
                    self.assertEqual(post_raw(url, body, headers), 200)
                    self.assertEqual(inbox.wait("t-v6-%d" % k, timeout=1)["reward"], 1)

    def test_a_body_cut_short_is_neither_answered_nor_counted_as_forged(self):
        """The sender went away mid-body (a worker killed while delivering): nothing is taken, no
        answer is due, and it is not a bad signature (rollgate sends the delivery again)."""
        with rollgate.CallbackReceiver("s3cret") as inbox:
            host, port = inbox.url.split("/")[2].rsplit(":", 1)
            body = json.dumps({"id": "t-cut", "status": "completed", "reward": 1}).encode()
            headers = "".join("%s: %s\r\n" % h for h in signed(body, "s3cret", delivery_id="d-cut").items())
            head = "POST /rollouts HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (len(body), headers)
            chunked = "POST /rollouts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n%s\r\n%x\r\n" % (headers, len(body))
            for request in (head.encode() + body[:10], chunked.encode() + body[:10]):
                with socket.create_connection((host, int(port)), timeout=30) as sock:
                    sock.sendall(request)
                    sock.shutdown(socket.SHUT_WR)
                    self.assertEqual(sock.recv(65536), b"")
            self.assertEqual((inbox.rejected, inbox.deliveries, inbox.result("t-cut")), (0, [], None))
            # The whole delivery, sent again, is taken.
            self.assertEqual(post_raw(inbox.url, body, signed(body, "s3cret", delivery_id="d-cut")), 200)
            self.assertEqual(inbox.result("t-cut")["reward"], 1)

    def test_waits_time_out_with_a_rollgate_error(self):
        with rollgate.CallbackReceiver("s") as inbox:
            with self.assertRaises(rollgate.RollgateError) as late:
                inbox.wait("t-never", timeout=0.2)
            self.assertEqual(late.exception.type, "timeout")
            with self.assertRaises(rollgate.RollgateError):
                asyncio.run(inbox.wait_group_async("g-never", timeout=0.2))


@live
class ReceiverTest(unittest.TestCase):
    client: rollgate.Client

    @classmethod
    def setUpClass(cls):
        cls.client = rollgate.Client(URL, API_KEY)

    def test_a_group_comes_back_signed_and_a_redelivery_is_not_counted_twice(self):
        secret = uid("secret")
        with rollgate.CallbackReceiver(secret) as inbox:
            group = self.client.submit_group(answer_task(callback=inbox.callback), n=3)
            results = inbox.wait_group(group["group_id"], timeout=120)
            self.assertEqual([r["id"] for r in results], [t["id"] for t in group["tasks"]])
            self.assertEqual([r["reward"] for r in results], [1, 1, 1])
            for t in group["tasks"]:
                self.assertEqual(inbox.wait(t["id"], timeout=30)["status"], "completed")
            self.assertTrue(wait_for(lambda: len(inbox.deliveries) == 4, 10))
            self.assertEqual(sorted(d.event for d in inbox.deliveries), ["group.completed"] + ["task.completed"] * 3)
            self.assertEqual(grpo.group_advantages(results).advantages, [0.0, 0.0, 0.0])

            # Redeliver one exactly as rollgate sent it (its acknowledgement was lost, say): 200, not counted again.
            first = inbox.deliveries[0]
            status = post_raw(inbox.url, first.raw, signed(first.raw, secret, first.event, first.delivery_id))
            self.assertEqual(status, 200)
            self.assertEqual(inbox.duplicates, 1)
            self.assertEqual(len(inbox.deliveries), 4)
            self.assertEqual(inbox.rejected, 0)
            # The same body under a fresh delivery id, with only the body-only signature the worker
            # still sends for older receivers: refused, not taken as a new delivery.
            replay = {"x-rollgate-event": first.event, "x-rollgate-delivery": uid("d"), "x-rollgate-signature": rollgate.sign(first.raw, secret)}
            self.assertEqual(post_raw(inbox.url, first.raw, replay), 401)
            self.assertEqual((len(inbox.deliveries), inbox.rejected), (4, 1))

    def test_a_failing_handler_gets_the_delivery_again(self):
        calls = []
        lock = threading.Lock()

        def handler(delivery: rollgate.Delivery) -> None:
            with lock:
                calls.append(delivery.delivery_id)
                if len(calls) == 1:
                    raise RuntimeError("trainer busy")

        with rollgate.CallbackReceiver(uid("secret"), on_delivery=handler) as inbox:
            tid = self.client.submit(answer_task(callback=inbox.callback))["id"]
            result = inbox.wait(tid, timeout=120)
            self.assertEqual(result["id"], tid)
            self.assertEqual(len(calls), 2)
            self.assertEqual(calls[0], calls[1])
            delivered = wait_for(lambda: self.client.get(tid)["callback"]["state"] == "delivered", 10)
            self.assertTrue(delivered, "the task's callback is not marked delivered")

    def test_concurrent_deliveries_whose_handler_fails_at_first_are_each_handled_once(self):
        """A group of 6 delivering at once (6 task callbacks and the group's) to a handler that fails
        the first time it sees each delivery: rollgate sends each again, and every delivery is
        handled to the end exactly once, none lost."""
        lock = threading.Lock()
        attempts: dict = {}
        done: list = []

        def handler(delivery: rollgate.Delivery) -> None:
            with lock:
                attempts[delivery.delivery_id] = attempts.get(delivery.delivery_id, 0) + 1
                if attempts[delivery.delivery_id] == 1:
                    raise RuntimeError("not yet")
                done.append(delivery.delivery_id)

        with rollgate.CallbackReceiver(uid("secret"), on_delivery=handler) as inbox:
            group = self.client.submit_group(answer_task(callback=inbox.callback), n=6)
            results = inbox.wait_group(group["group_id"], timeout=120)
            self.assertEqual([r["id"] for r in results], [t["id"] for t in group["tasks"]])
            for t in group["tasks"]:
                inbox.wait(t["id"], timeout=60)
            self.assertEqual(len(done), 7)
            self.assertEqual(len(set(done)), 7)
            self.assertEqual(sorted(attempts.values()), [2] * 7)
            self.assertEqual(sorted(d.delivery_id for d in inbox.deliveries), sorted(done))
            self.assertTrue(wait_for(lambda: all(self.client.get(t["id"])["callback"]["state"] == "delivered" for t in group["tasks"]), 20))

    def test_async_waits(self):
        async def run():
            async with rollgate.CallbackReceiver(uid("secret")) as inbox:
                group = self.client.submit_group(answer_task(callback=inbox.callback), n=2)
                tid = group["tasks"][0]["id"]
                result, members = await asyncio.gather(inbox.wait_async(tid, timeout=120), inbox.wait_group_async(group["group_id"], timeout=120))
                return tid, result, members

        tid, result, members = asyncio.run(run())
        self.assertEqual(result["id"], tid)
        self.assertEqual(len(members), 2)


if __name__ == "__main__":
    unittest.main()
