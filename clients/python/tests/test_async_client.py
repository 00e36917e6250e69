"""``rollgate.AsyncClient`` against a live cluster: the same calls as coroutines, concurrent, with the
same errors and retry rules (through the same resetting proxy)."""

from __future__ import annotations

import asyncio
import re
import time
import unittest

import rollgate
from support import API_KEY, URL, FlakyProxy, answer_task, free_port, live, sleeper_task, uid


@live
class AsyncClientTest(unittest.TestCase):
    def run_async(self, coro):
        return asyncio.run(asyncio.wait_for(coro, 300))

    def test_tasks_groups_events_and_trajectories(self):
        async def scenario():
            c = rollgate.AsyncClient(URL, API_KEY)
            one = await c.submit(answer_task())
            gid = uid("g-apy")
            group = await c.submit_group(answer_task(say="bye"), n=3, group_id=gid)
            ids = [uid("t-apy") for _ in range(2)]
            batch = await c.submit_batch([answer_task(id=i) for i in ids])
            # Concurrent waits on one event loop.
            result, members, *batch_results = await asyncio.gather(
                c.wait(one["id"], timeout=90, poll_interval=0.2),
                c.wait_group(gid, timeout=120, poll_interval=0.3),
                *[c.wait(i, timeout=90, poll_interval=0.2) for i in ids],
            )
            events = [e async for e in c.events(one["id"])]
            resumed = [e async for e in c.events(one["id"], last_event_id=events[0]["id"])]
            merged = [e async for e in c.events(gid)]
            listed = [r async for r in c.list_tasks(group_id=gid, page_size=2)]
            page = await c.list_page(group_id=gid, page_size=2)
            traj = await c.trajectory(result["session_id"])
            samples = await c.trajectory(result["session_id"], format="slime")
            record = await c.get(one["id"])
            logs = await c.logs(one["id"])
            return one, group, batch, result, members, batch_results, events, resumed, merged, listed, page, traj, samples, record, logs

        one, group, batch, result, members, batch_results, events, resumed, merged, listed, page, traj, samples, record, logs = self.run_async(scenario())
        self.assertEqual((result["status"], result["reward"]), ("completed", 1))
        self.assertEqual([m["reward"] for m in members], [0, 0, 0])
        self.assertEqual([m["id"] for m in members], [t["id"] for t in group["tasks"]])
        self.assertEqual([r["id"] for r in batch_results], [b["id"] for b in batch])
        self.assertEqual((events[0]["type"], events[-1]["type"]), ("queued", "terminal"))
        self.assertEqual([e["id"] for e in resumed], [e["id"] for e in events[1:]])
        self.assertEqual(sum(1 for e in merged if e["type"] == "terminal"), 3)
        self.assertEqual(len(listed), 3)
        self.assertEqual(len(page["tasks"]), 2)
        self.assertIsNotNone(page["next_cursor"])
        self.assertEqual(samples[0]["tokens"], traj["traces"][0]["prompt_ids"] + traj["traces"][0]["response_ids"])
        self.assertEqual(record["result"]["id"], one["id"])
        self.assertIn("hello there", logs)

    def test_cancel_sessions_and_the_weight_cycle(self):
        async def scenario():
            c = rollgate.AsyncClient(URL, API_KEY)
            tid = (await c.submit(sleeper_task(60)))["id"]
            async for e in c.events(tid):
                if e["type"] == "started":
                    break
            cancelled = await c.cancel(tid)
            final = await c.wait(tid, timeout=60, poll_interval=0.2)
            s = await c.create_session()
            closed = await c.close_session(s["id"])
            seen = await c.session(s["id"])
            records = await c.completions(s["id"])
            await c.pause(mode="abort", timeout_s=5)
            version = uid("apy-v")
            try:
                loaded = await c.set_weights(version, load={"lora": {"name": "policy", "path": "/adapters/" + version}})
                state = await c.inference()
            finally:
                await c.resume()
            current = await c.weights()
            engines = await c.engines()
            return cancelled, final, closed, seen, records, loaded, state, version, current, engines

        cancelled, final, closed, seen, records, loaded, state, version, current, engines = self.run_async(scenario())
        self.assertIn(cancelled["status"], ("cancelling", "cancelled"))
        self.assertEqual(final["status"], "cancelled")
        self.assertEqual((closed["state"], seen["state"], records), ("closed", "closed", []))
        self.assertEqual(state["paused"]["mode"], "abort")
        self.assertTrue(all(e["ok"] for e in loaded["engines"]))
        self.assertEqual(current, version)
        self.assertTrue(engines["engines"])

    def test_errors_and_cancellation(self):
        async def scenario():
            c = rollgate.AsyncClient(URL, API_KEY)
            errors = []
            for call in (c.submit({"instruction": "no agent"}), c.get(uid("t-none")), c.set_weights("v", load={"path": "/x"})):
                try:
                    await call
                except rollgate.RollgateError as err:
                    errors.append(err)
            down = rollgate.AsyncClient("http://127.0.0.1:%d" % free_port(), API_KEY, retries=1, backoff=0.01)
            try:
                await down.engines()
            except rollgate.RollgateError as err:
                errors.append(err)
            # Cancelling a wait ends it at once (no thread keeps polling).
            tid = (await c.submit(sleeper_task(30)))["id"]
            started = time.monotonic()
            try:
                await asyncio.wait_for(c.wait(tid), 0.5)
            except asyncio.TimeoutError:
                pass
            elapsed = time.monotonic() - started
            await c.cancel(tid)
            return errors, elapsed

        errors, elapsed = self.run_async(scenario())
        self.assertEqual([(e.status, e.type) for e in errors], [(400, "invalid_request"), (404, "not_found"), (409, "not_paused"), (0, "unreachable")])
        self.assertTrue(errors[0].details)
        self.assertLess(elapsed, 2.0)

    def test_a_body_over_the_limit_gets_the_servers_413_not_unreachable(self):
        async def scenario():
            with FlakyProxy(URL) as proxy:
                try:
                    await rollgate.AsyncClient(proxy.url, API_KEY, backoff=0.01).submit(answer_task(id=uid("t-py-big"), runtime={"files": {"big.txt": "x" * (16 << 20)}}))
                except rollgate.RollgateError as err:
                    return err, proxy.connections
            return None, proxy.connections

        err, connections = self.run_async(scenario())
        self.assertIsNotNone(err)
        self.assertEqual((err.status, err.type, err.request), (413, "payload_too_large", "POST /v1/tasks"))
        self.assertIn("size limit", err.message)
        self.assertEqual(connections, 1)

    def test_a_wait_rides_out_a_gateway_that_stops_answering_for_a_while(self):
        async def scenario():
            direct = rollgate.AsyncClient(URL, API_KEY)
            tid = (await direct.submit(answer_task()))["id"]
            gid = uid("g-py-outage")
            await direct.submit_group(answer_task(), n=2, group_id=gid)
            with FlakyProxy(URL, drop=6) as proxy:
                flaky = rollgate.AsyncClient(proxy.url, API_KEY, retries=1, backoff=0.01)
                result = await flaky.wait(tid, timeout=90, poll_interval=0.05)
                proxy.dropped = 0
                results = await flaky.wait_group(gid, timeout=90, poll_interval=0.05)
                return tid, result, results

        tid, result, results = self.run_async(scenario())
        self.assertEqual((result["id"], result["status"]), (tid, "completed"))
        self.assertEqual([r["status"] for r in results], ["completed", "completed"])

    def test_retries_follow_the_same_rules(self):
        async def scenario():
            tid = (await rollgate.AsyncClient(URL, API_KEY).submit(answer_task()))["id"]
            with FlakyProxy(URL, drop=2) as read_proxy:
                record = await rollgate.AsyncClient(read_proxy.url, API_KEY, backoff=0.01).get(tid)
            with FlakyProxy(URL, drop=1) as post_proxy:
                try:
                    await rollgate.AsyncClient(post_proxy.url, API_KEY, backoff=0.01).submit(answer_task())
                    failure = None
                except rollgate.RollgateError as err:
                    failure = err
            expected = [e["id"] async for e in rollgate.AsyncClient(URL, API_KEY).events(tid)]
            with FlakyProxy(URL, cut_stream_after_events=2) as stream_proxy:
                resumed = [e["id"] async for e in rollgate.AsyncClient(stream_proxy.url, API_KEY, backoff=0.01).events(tid)]
            return tid, record, read_proxy, failure, post_proxy, expected, resumed, stream_proxy

        tid, record, read_proxy, failure, post_proxy, expected, resumed, stream_proxy = self.run_async(scenario())
        self.assertEqual(resumed, expected)
        streams = [h for h in stream_proxy.heads if "text/event-stream" in h]
        self.assertEqual(len(streams), 2)
        # Resumed after the last event that arrived whole (the cut may split the second one).
        resumed_after = re.search(r"Last-Event-ID: (\S+)\r\n", streams[1])
        self.assertIsNotNone(resumed_after)
        self.assertIn(resumed_after.group(1), expected[:2])
        self.assertEqual(record["id"], tid)
        self.assertEqual(read_proxy.connections, 3)
        self.assertIsNotNone(failure)
        self.assertTrue(failure.unreachable)
        self.assertEqual(post_proxy.connections, 1)


if __name__ == "__main__":
    unittest.main()
