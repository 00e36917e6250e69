"""``rollgate.Client`` against a live cluster (``ROLLGATE_URL``): every method, its errors, and which
calls are sent again after a dropped connection (through a real TCP proxy that resets them)."""

from __future__ import annotations

import re
import threading
import unittest

import rollgate
from rollgate import grpo
from support import API_KEY, URL, FlakyProxy, answer_task, free_port, live, sleeper_task, uid


@live
class ClientTest(unittest.TestCase):
    client: rollgate.Client

    @classmethod
    def setUpClass(cls):
        cls.client = rollgate.Client(URL, API_KEY)

    def test_submit_get_wait_logs_and_the_trajectory_in_every_format(self):
        c = self.client
        accepted = c.submit(answer_task())
        self.assertEqual(accepted["status"], "queued")
        result = c.wait(accepted["id"], timeout=90, poll_interval=0.2)
        self.assertEqual((result["id"], result["status"], result["reward"]), (accepted["id"], "completed", 1))
        record = c.get(accepted["id"])
        self.assertEqual(record["status"], "completed")
        self.assertEqual(record["result"]["session_id"], result["session_id"])
        self.assertIn("hello there", c.logs(accepted["id"]))

        traj = c.trajectory(result["session_id"])
        self.assertEqual(traj["builder"], "prefix_merging")
        [t] = traj["traces"]
        self.assertEqual(len(t["response_ids"]), len(t["loss_mask"]))
        [verl] = c.trajectory(result["session_id"], format="verl")
        self.assertEqual((verl["prompts"], verl["responses"], verl["response_mask"]), (t["prompt_ids"], t["response_ids"], t["loss_mask"]))
        [slime] = c.trajectory(result["session_id"], format="slime")
        self.assertEqual(slime["tokens"], t["prompt_ids"] + t["response_ids"])
        [prime] = c.trajectory(result["session_id"], builder="per_request", format="prime-rl")
        self.assertEqual(prime["completion_logprobs"], t["response_logprobs"])

    def test_submit_with_an_id_is_idempotent_and_a_batch_keeps_its_order(self):
        c = self.client
        tid = uid("t-py")
        first = c.submit(answer_task(id=tid))
        again = c.submit(answer_task(id=tid))
        self.assertEqual(first["id"], tid)
        self.assertEqual(again["id"], tid)
        ids = [uid("t-py-b") for _ in range(3)]
        accepted = c.submit_batch([answer_task(id=i, say="hi" if k else "hello") for k, i in enumerate(ids)])
        self.assertEqual([a["id"] for a in accepted], ids)
        rewards = [c.wait(i, timeout=90, poll_interval=0.2)["reward"] for i in ids]
        self.assertEqual(rewards, [1, 0, 0])

    def test_a_group_waited_for_listed_in_pages_and_turned_into_a_step(self):
        c = self.client
        gid = uid("g-py")
        group = c.submit_group(answer_task(), n=3, group_id=gid)
        self.assertEqual([t["id"] for t in group["tasks"]], ["%s-%d" % (gid, k) for k in range(3)])
        results = c.wait_group(gid, timeout=120, poll_interval=0.3)
        self.assertEqual([r["id"] for r in results], ["%s-%d" % (gid, k) for k in range(3)])
        listed = list(c.list_tasks(group_id=gid, page_size=2))
        self.assertEqual(sorted(r["id"] for r in listed), sorted(r["id"] for r in results))
        self.assertEqual(len(c.list_page(group_id=gid, page_size=2)["tasks"]), 2)
        self.assertEqual(len(list(c.list_tasks(group_id=gid, page_size=2, limit=1))), 1)
        adv = grpo.group_advantages(results)
        self.assertEqual(adv.advantages, [0.0, 0.0, 0.0])
        batch = grpo.step_batch(results, adv)
        self.assertEqual(len(batch.samples), 3)
        self.assertGreater(batch.trainable_tokens, 0)

    def test_a_finished_task_branched_replays_its_calls_and_masks_them(self):
        c = self.client
        source = c.wait(c.submit(answer_task())["id"], timeout=90, poll_interval=0.2)
        branched = c.branch(source["id"], at_call=1, n=2)
        self.assertEqual(len(branched["task_ids"]), 2)
        # At the one-call task's last call on purpose: the gateway says the branches sample nothing.
        self.assertIs(branched["whole_rollout"], True)
        results = c.wait_group(branched["group_id"], timeout=120, poll_interval=0.3)
        self.assertEqual([r["reward"] for r in results], [1, 1])
        for r in results:
            [trace] = r["trajectory"]["traces"]
            # The one call was answered from the source's record: not a sample of this run.
            self.assertEqual(sum(trace["loss_mask"]), 0)
            self.assertEqual(trace["response_ids"], source["trajectory"]["traces"][0]["response_ids"])
        with self.assertRaises(rollgate.RollgateError) as err:
            c.branch(source["id"], at_call=5, n=1)
        self.assertEqual(err.exception.status, 409)

    def test_events_of_a_task_resume_after_an_event_id_and_a_groups_interleave(self):
        c = self.client
        tid = c.submit(answer_task())["id"]
        events = list(c.events(tid))
        self.assertEqual(events[0]["type"], "queued")
        self.assertEqual(events[-1]["type"], "terminal")
        self.assertIn("llm_call", [e["type"] for e in events])
        self.assertTrue(all(e["task_id"] == tid for e in events))
        resumed = list(c.events(tid, last_event_id=events[1]["id"]))
        self.assertEqual([e["id"] for e in resumed], [e["id"] for e in events[2:]])

        gid = c.submit_group(answer_task(), n=2)["group_id"]
        merged = list(c.events(gid))
        terminals = sorted(e["task_id"] for e in merged if e["type"] == "terminal")
        self.assertEqual(terminals, [gid + "-0", gid + "-1"])
        with self.assertRaises(rollgate.RollgateError) as missing:
            list(c.events(uid("nothing")))
        self.assertEqual((missing.exception.status, missing.exception.type), (404, "not_found"))

    def test_cancel_a_running_task(self):
        c = self.client
        tid = c.submit(sleeper_task(60))["id"]
        started = threading.Event()

        def watch():
            for e in c.events(tid):
                if e["type"] == "started":
                    started.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        self.assertTrue(started.wait(60), "the task never started")
        answer = c.cancel(tid)
        self.assertEqual(answer["id"], tid)
        self.assertIn(answer["status"], ("cancelling", "cancelled"))
        result = c.wait(tid, timeout=60, poll_interval=0.2)
        self.assertEqual(result["status"], "cancelled")
        watcher.join(30)
        self.assertEqual(c.cancel(tid)["status"], "cancelled")
        with self.assertRaises(rollgate.RollgateError) as unknown:
            c.cancel(tid + "-no-such-task")
        self.assertEqual(unknown.exception.status, 404)

    def test_sessions_the_agent_runs_itself(self):
        c = self.client
        s = c.create_session(metadata={"suite": "python"})
        self.assertTrue(s["token"])
        self.assertTrue(s["urls"]["openai"].endswith("/s/%s/v1" % s["id"]))
        self.assertEqual(c.session(s["id"])["id"], s["id"])
        self.assertEqual(c.completions(s["id"]), [])
        self.assertIsNotNone(c.close_session(s["id"])["closed_at"])

    def test_pause_weights_and_resume(self):
        c = self.client
        paused = c.pause(mode="drain", timeout_s=5)
        self.assertEqual((paused["paused"], paused["mode"]), (True, "drain"))
        self.assertIsNotNone(c.inference()["paused"])
        try:
            version = uid("py-v")
            loaded = c.set_weights(version, load={"path": "/checkpoints/" + version})
            self.assertEqual(loaded["version"], version)
            self.assertTrue(loaded["engines"] and all(e["ok"] and all(r["loaded"] for r in e["ranks"]) for e in loaded["engines"]))
            self.assertEqual(c.weights(), version)
        finally:
            resumed = c.resume()
        self.assertEqual(resumed["paused"], False)
        self.assertIsNone(c.inference()["paused"])
        result = c.wait(c.submit(answer_task())["id"], timeout=90, poll_interval=0.2)
        self.assertEqual(set(result["trajectory"]["traces"][0]["weight_versions"]), {version})
        # A label only: no pause needed.
        label = uid("py-label")
        self.assertEqual(c.set_weights(label)["version"], label)
        self.assertEqual(c.weights(), label)
        self.assertTrue(c.engines()["engines"][0]["ranks"])

    def test_errors_carry_the_servers_type_message_details_and_status(self):
        c = self.client
        with self.assertRaises(rollgate.RollgateError) as bad:
            c.submit({"instruction": "no agent"})
        err = bad.exception
        self.assertEqual((err.status, err.type, err.request), (400, "invalid_request", "POST /v1/tasks"))
        self.assertIn("agent", err.message)
        self.assertTrue(err.details)
        with self.assertRaises(rollgate.RollgateError) as missing:
            c.get(uid("t-none"))
        self.assertEqual((missing.exception.status, missing.exception.type), (404, "not_found"))
        with self.assertRaises(rollgate.RollgateError) as unpaused:
            c.set_weights("v-x", load={"path": "/ckpt"})
        self.assertEqual((unpaused.exception.status, unpaused.exception.type), (409, "not_paused"))
        down = rollgate.Client("http://127.0.0.1:%d" % free_port(), API_KEY, retries=1, backoff=0.01)
        with self.assertRaises(rollgate.RollgateError) as unreachable:
            down.get("t-1")
        self.assertTrue(unreachable.exception.unreachable)
        self.assertIn("cannot reach the rollgate gateway", unreachable.exception.message)

    def test_a_body_over_the_limit_gets_the_servers_413_not_unreachable(self):
        """The gateway answers 413 before reading a big body and closes: the client still reads that answer."""
        tid = uid("t-py-big")
        with FlakyProxy(URL) as proxy:
            with self.assertRaises(rollgate.RollgateError) as big:
                rollgate.Client(proxy.url, API_KEY, backoff=0.01).submit(answer_task(id=tid, runtime={"files": {"big.txt": "x" * (16 << 20)}}))
        err = big.exception
        self.assertEqual((err.status, err.type, err.request), (413, "payload_too_large", "POST /v1/tasks"))
        self.assertIn("size limit", err.message)
        # Answered, so not sent again though its id makes it safe to.
        self.assertEqual(proxy.connections, 1)

    @unittest.skipUnless(API_KEY, "the cluster has no ROLLGATE_API_KEY, so no request is refused for a wrong key")
    def test_a_wrong_api_key_is_refused(self):
        with self.assertRaises(rollgate.RollgateError) as refused:
            rollgate.Client(URL, "wrong-key").get("t-1")
        self.assertEqual((refused.exception.status, refused.exception.type), (401, "unauthorized"))


@live
class RetryTest(unittest.TestCase):
    """A real proxy resets connections after reading the request: idempotent calls are sent again, others are not."""

    def client(self, proxy: FlakyProxy) -> rollgate.Client:
        return rollgate.Client(proxy.url, API_KEY, retries=3, backoff=0.01)

    def test_an_idempotent_read_is_retried_until_it_gets_through(self):
        tid = rollgate.Client(URL, API_KEY).submit(answer_task())["id"]
        with FlakyProxy(URL, drop=2) as proxy:
            record = self.client(proxy).get(tid)
        self.assertEqual(record["id"], tid)
        self.assertEqual((proxy.connections, proxy.dropped), (3, 2))
        self.assertEqual(proxy.first_lines, ["GET /v1/tasks/%s HTTP/1.1" % tid] * 3)

    def test_a_submit_with_an_id_is_retried_and_creates_one_task(self):
        tid = uid("t-py-retry")
        with FlakyProxy(URL, drop=1) as proxy:
            accepted = self.client(proxy).submit(answer_task(id=tid))
        self.assertEqual(accepted["id"], tid)
        self.assertEqual(proxy.connections, 2)
        self.assertEqual(rollgate.Client(URL, API_KEY).get(tid)["id"], tid)

    def test_a_submit_without_an_id_is_not_sent_again(self):
        marker = uid("once")
        with FlakyProxy(URL, drop=1) as proxy:
            with self.assertRaises(rollgate.RollgateError) as failed:
                self.client(proxy).submit(answer_task(metadata={"marker": marker}))
        self.assertTrue(failed.exception.unreachable)
        self.assertEqual((proxy.connections, proxy.dropped), (1, 1))

    def test_a_submit_whose_answer_was_lost_runs_once(self):
        """The gateway took the submit but its answer never came: with an id it is sent again and
        answered as the same task; without one it is not sent again (one task, not two)."""
        direct = rollgate.Client(URL, API_KEY)
        tid = uid("t-py-lost-answer")
        with FlakyProxy(URL, lose_answers=1) as proxy:
            accepted = self.client(proxy).submit(answer_task(id=tid))
        self.assertEqual((accepted["id"], proxy.connections, proxy.lost), (tid, 2, 1))
        marker = uid("once")
        with FlakyProxy(URL, lose_answers=1) as proxy:
            with self.assertRaises(rollgate.RollgateError) as failed:
                self.client(proxy).submit(answer_task(metadata={"marker": marker}))
        self.assertTrue(failed.exception.unreachable)
        self.assertEqual(proxy.connections, 1)
        made = [t for t in direct.list_tasks(limit=200) if (t.get("task") or {}).get("metadata", {}).get("marker") == marker]
        self.assertEqual(len(made), 1)

    def test_a_session_created_with_an_id_whose_answer_was_lost_is_not_sent_again(self):
        """Its token comes only in that answer, and a second create is 409 'exists': sent again, the
        caller would get a conflict for a session it never saw. It gets 'unreachable' instead."""
        sid = uid("s-py-lost-answer")
        with FlakyProxy(URL, lose_answers=1) as proxy:
            with self.assertRaises(rollgate.RollgateError) as failed:
                self.client(proxy).create_session(id=sid)
        self.assertTrue(failed.exception.unreachable, failed.exception)
        self.assertEqual(proxy.connections, 1)
        direct = rollgate.Client(URL, API_KEY)
        self.assertEqual(direct.session(sid)["id"], sid)
        direct.close_session(sid)

    def test_an_event_stream_cut_mid_way_resumes_with_last_event_id(self):
        direct = rollgate.Client(URL, API_KEY)
        tid = direct.submit(answer_task())["id"]
        direct.wait(tid, timeout=90, poll_interval=0.2)
        expected = [e["id"] for e in direct.events(tid)]
        with FlakyProxy(URL, cut_stream_after_events=2) as proxy:
            got = [e["id"] for e in self.client(proxy).events(tid)]
        self.assertEqual(got, expected)
        streams = [h for h in proxy.heads if "text/event-stream" in h]
        self.assertEqual(len(streams), 2)
        self.assertNotIn("Last-Event-ID", streams[0])
        # Resumed after the last event that arrived whole (the cut may split the second one).
        resumed_after = re.search(r"Last-Event-ID: (\S+)\r\n", streams[1])
        self.assertIsNotNone(resumed_after)
        self.assertIn(resumed_after.group(1), expected[:2])

    def test_a_wait_rides_out_a_gateway_that_stops_answering_for_a_while(self):
        """A gateway restart during a long wait: more polls fail than one call's retries cover, and
        the wait carries on to the result instead of ending with 'unreachable'."""
        direct = rollgate.Client(URL, API_KEY)
        tid = direct.submit(answer_task())["id"]
        gid = uid("g-py-outage")
        direct.submit_group(answer_task(), n=2, group_id=gid)
        with FlakyProxy(URL, drop=6) as proxy:
            result = rollgate.Client(proxy.url, API_KEY, retries=1, backoff=0.01).wait(tid, timeout=90, poll_interval=0.05)
        self.assertEqual((result["id"], result["status"]), (tid, "completed"))
        self.assertGreaterEqual(proxy.dropped, 6)
        with FlakyProxy(URL, drop=6) as proxy:
            results = rollgate.Client(proxy.url, API_KEY, retries=1, backoff=0.01).wait_group(gid, timeout=90, poll_interval=0.05)
        self.assertEqual([r["status"] for r in results], ["completed", "completed"])
        # Not an outage: a task that does not exist ends the wait at once.
        with self.assertRaises(rollgate.RollgateError) as missing:
            direct.wait(uid("t-none"), timeout=30)
        self.assertEqual(missing.exception.status, 404)

    def test_retries_give_up_after_the_limit(self):
        with FlakyProxy(URL, drop=10) as proxy:
            with self.assertRaises(rollgate.RollgateError) as failed:
                rollgate.Client(proxy.url, API_KEY, retries=2, backoff=0.01).get("t-1")
        self.assertEqual(proxy.connections, 3)
        self.assertEqual(failed.exception.type, "unreachable")


if __name__ == "__main__":
    unittest.main()
