"""The parts with no I/O: GRPO helpers (golden values), signatures, the SSE parser, which calls may
be sent again, how error answers are read, and that the package stays Python 3.9 syntax."""

from __future__ import annotations

import ast
import base64
import json
import math
import os
import struct
import unittest

import rollgate
from rollgate import _api, grpo
from rollgate._http import Call, Failure, RetryPolicy, decode
from rollgate.errors import RollgateError
from rollgate.sse import SSEParser, task_event

PACKAGE_DIR = os.path.dirname(rollgate.__file__)


def result(task_id: str, reward, status: str = "completed", traces=None, error=None):
    return {"id": task_id, "status": status, "reward": reward, "error": error, "trajectory": None if traces is None else {"traces": traces}}


def trace(prompt, response, mask, logprobs, versions):
    return {"prompt_ids": prompt, "response_ids": response, "loss_mask": mask, "response_logprobs": logprobs, "weight_versions": versions}


class AdvantagesTest(unittest.TestCase):
    def test_mean_std_matches_grpo_with_the_sample_std(self):
        adv = grpo.advantages([1.0, 0.0, 1.0, 0.0])
        # mean 0.5, sample std sqrt(1/3) = 0.57735…
        std = math.sqrt(1 / 3)
        self.assertAlmostEqual(adv.mean, 0.5)
        self.assertAlmostEqual(adv.std, std)
        for got, want in zip(adv.advantages, [0.5 / (std + 1e-6), -0.5 / (std + 1e-6)] * 2):
            self.assertAlmostEqual(got, want)
        population = grpo.advantages([1.0, 0.0, 1.0, 0.0], ddof=0)
        self.assertAlmostEqual(population.advantages[0], 0.5 / (0.5 + 1e-6))

    def test_mean_only_and_leave_one_out(self):
        self.assertEqual(grpo.advantages([3.0, 1.0, 2.0], method="mean").advantages, [1.0, -1.0, 0.0])
        # r_i - mean of the others: 3 - 1.5, 1 - 2.5, 2 - 2
        self.assertEqual(grpo.advantages([3.0, 1.0, 2.0], method="leave_one_out").advantages, [1.5, -1.5, 0.0])
        with self.assertRaises(ValueError):
            grpo.advantages([1.0], method="ppo")

    def test_equal_rewards_and_single_members_give_zero_and_say_so(self):
        same = grpo.advantages([1.0, 1.0, 1.0])
        self.assertEqual(same.advantages, [0.0, 0.0, 0.0])
        self.assertTrue(same.zero_variance)
        self.assertIn("no signal", same.describe())
        self.assertEqual(grpo.advantages([0.7]).advantages, [0.0])
        self.assertEqual(grpo.advantages([None, None]).advantages, [None, None])

    def test_equal_rewards_that_float_sums_do_not_average_exactly_still_have_no_signal(self):
        # 0.1 + 0.1 + 0.1 = 0.30000000000000004: the mean is not 0.1, and r - mean is not 0.
        for rewards in ([0.1, 0.1, 0.1], [0.3] * 6, [0.2, None, 0.2, 0.2]):
            for method in grpo.METHODS:
                adv = grpo.advantages(rewards, method=method)
                self.assertEqual([a for a in adv.advantages if a is not None], [0.0] * sum(r is not None for r in rewards), (rewards, method))
                self.assertTrue(adv.zero_variance, (rewards, method))
                self.assertEqual(adv.std, 0.0)
                self.assertIn("no signal", adv.describe())

    def test_rewards_of_any_real_number_type_count(self):
        # numpy's int64 / float32 (what np.array(rewards) yields) are numbers.Real but not int or float;
        # Fraction stands in for them here (the client needs no numpy).
        from fractions import Fraction

        adv = grpo.advantages([Fraction(1), Fraction(0), Fraction(1, 2)], method="mean")
        self.assertEqual(adv.excluded, {})
        self.assertEqual(adv.advantages, [0.5, -0.5, 0.0])
        self.assertIn("not a finite number", grpo.advantages([1.0, True]).excluded[1])

    def test_failed_members_are_left_out_of_the_statistics_and_named(self):
        results = [
            result("g-0", 1.0),
            result("g-1", None, status="failed", error={"kind": "infrastructure", "message": "engine unreachable"}),
            result("g-2", 0.0),
            None,
            result("g-4", None),
        ]
        adv = grpo.group_advantages(results, method="mean")
        self.assertEqual(adv.advantages, [0.5, None, -0.5, None, None])
        self.assertEqual(adv.mean, 0.5)
        self.assertEqual(sorted(adv.excluded), [1, 3, 4])
        self.assertEqual(adv.excluded[1], "failed: infrastructure: engine unreachable")
        self.assertIn("callback never came", adv.excluded[3])
        self.assertIn("without a reward", adv.excluded[4])
        self.assertIn("member 1 left out: failed: infrastructure", adv.describe())
        self.assertIn("not a finite number", grpo.advantages([1.0, float("nan")]).excluded[1])

    def test_a_rollout_with_lost_calls_is_left_out(self):
        # A result a trainer assembled from a session (the session API) whose trajectory says a call
        # was lost: its tokens may be missing, so it is neither scored nor trained on.
        whole = result("s-0", 1.0, traces=[trace([1], [2], [1], [-0.5], ["v"])])
        broken = result("s-1", 0.0, traces=[trace([1], [3], [1], [-0.7], ["v"])])
        broken["trajectory"]["stats"] = {"lost_calls": {"count": 2, "first": {"kind": "engine_rejected", "message": "engine answered 500"}}}
        third = result("s-2", 0.5, traces=[trace([1], [4], [1], [-0.1], ["v"])])
        third["trajectory"]["stats"] = {"lost_calls": {"count": 0, "first": None}}
        adv = grpo.group_advantages([whole, broken, third], method="mean")
        self.assertEqual(adv.advantages, [0.25, None, -0.25])
        self.assertIn("lost 2 call(s) to infrastructure (first: engine_rejected: engine answered 500)", adv.excluded[1])
        batch = grpo.step_batch([whole, broken, third], adv)
        self.assertEqual([s["task_id"] for s in batch.samples], ["s-0", "s-2"])
        self.assertIn("not whole", batch.skipped["s-1"])

    def test_a_member_whose_grader_failed_can_be_scored_instead_of_left_out(self):
        broke_grader = result("g-1", None, status="failed", error={"kind": "evaluator_error", "message": "no reward file"})
        lost = result("g-2", None, status="failed", error={"kind": "infrastructure", "message": "engine unreachable"})
        results = [result("g-0", 1.0), broke_grader, lost]
        # By default a failed grader is left out, as any failure is.
        self.assertEqual(grpo.group_advantages(results, method="mean").advantages, [0.0, None, None])
        adv = grpo.group_advantages(results, method="mean", evaluator_error_reward=0.0)
        self.assertEqual(adv.advantages, [0.5, -0.5, None])
        self.assertEqual(sorted(adv.excluded), [2])


class StepBatchTest(unittest.TestCase):
    def test_arrays_of_one_group_golden(self):
        results = [
            result("g-0", 1.0, traces=[trace([10, 11], [20, 21, 22], [1, 0, 1], [-0.5, 0.0, -0.25], ["v1", None, "v2"])]),
            result("g-1", 0.0, traces=[trace([10, 11], [30], [1], [-1.5], ["v1"]), trace([12], [31, 32], [0, 1], [0.0, -0.1], [None, "v1"])]),
            result("g-2", None, status="timed_out", error={"kind": "timeout", "message": "limit 60 s"}),
        ]
        adv = grpo.group_advantages(results, method="mean")
        batch = grpo.step_batch(results, adv)
        self.assertEqual(
            batch.samples[0],
            {
                "task_id": "g-0",
                "member": 0,
                "trace": 0,
                "kind": "main",
                "prompt_length": 2,
                "input_ids": [10, 11, 20, 21, 22],
                "loss_mask": [0, 0, 1, 0, 1],
                "old_logprobs": [0.0, 0.0, -0.5, 0.0, -0.25],
                "advantages": [0.0, 0.0, 0.5, 0.0, 0.5],
                "weight_versions": [None, None, "v1", None, "v2"],
            },
        )
        self.assertEqual(batch.input_ids, [[10, 11, 20, 21, 22], [10, 11, 30], [12, 31, 32]])
        self.assertEqual(batch.advantages[1:], [[0.0, 0.0, -0.5], [0.0, 0.0, -0.5]])
        self.assertEqual(batch.loss_mask[2], [0, 0, 1])
        self.assertEqual(batch.old_logprobs[2], [0.0, 0.0, -0.1])
        self.assertEqual(batch.trainable_tokens, 4)
        self.assertEqual(batch.skipped, {"g-2": "timed_out: timeout: limit 60 s"})
        for sample in batch.samples:
            n = len(sample["input_ids"])
            self.assertTrue(all(len(sample[k]) == n for k in ("loss_mask", "old_logprobs", "advantages", "weight_versions")))

    def test_each_sample_says_its_trace_kind(self):
        sub = dict(trace([5], [6], [1], [-0.2], ["v1"]), kind="sub_agent", parent={"trace": 0, "record_id": "r-1", "tool_call_id": "c-1"})
        side = dict(trace([7], [8], [1], [-0.3], ["v1"]), kind="side_request", parent=None)
        results = [result("k-0", 1.0, traces=[dict(trace([1], [2], [1], [-0.1], ["v1"]), kind="main"), sub, side]), result("k-1", 0.0, traces=[trace([1], [3], [1], [-0.1], ["v1"])])]
        batch = grpo.step_batch(results, grpo.group_advantages(results))
        self.assertEqual(batch.column("kind"), ["main", "sub_agent", "side_request", "main"])
        self.assertEqual([(s["task_id"], s["trace"]) for s in batch.samples], [("k-0", 0), ("k-0", 1), ("k-0", 2), ("k-1", 0)])

    def test_members_without_a_result_in_two_groups_are_both_said_skipped(self):
        def group(gid):
            return [dict(result("%s-0" % gid, 1.0, traces=[trace([1], [2], [1], [-0.1], ["v"])]), group_id=gid), None]
        batch = grpo.StepBatch([])
        for gid in ("g-a", "g-b"):
            results = group(gid)
            batch.extend(grpo.step_batch(results, grpo.group_advantages(results)))
        self.assertEqual(len(batch.samples), 2)
        self.assertEqual(len(batch.skipped), 2, batch.skipped)
        self.assertTrue(all("callback never came" in why for why in batch.skipped.values()))
        self.assertEqual(sorted(batch.skipped), ["g-a member 1", "g-b member 1"])

    def test_a_member_without_a_trajectory_is_skipped_and_groups_must_match(self):
        results = [result("g-0", 1.0), result("g-1", 0.0, traces=[trace([1], [2], [1], [-0.1], ["v"])])]
        batch = grpo.step_batch(results, grpo.group_advantages(results))
        self.assertEqual(len(batch.samples), 1)
        self.assertIn("no trajectory", batch.skipped["g-0"])
        with self.assertRaises(ValueError):
            grpo.step_batch(results, grpo.advantages([1.0]))


class RoutedExpertsTest(unittest.TestCase):
    # Rows of int32 little-endian ids, base64: 3 positions x 2 layers x 2 experts, the second unknown (-1).
    ROWS = [[[1, 5], [0, 7]], [[-1, -1], [-1, -1]], [[3, 2], [6, 4]]]
    PACKED = {"layers": 2, "topk": 2, "width": 4, "data": base64.b64encode(struct.pack("<12i", *[e for r in ROWS for l in r for e in l])).decode()}

    def test_decodes_to_positions_layers_topk(self):
        self.assertEqual(rollgate.decode_routed_experts(self.PACKED), self.ROWS)

    def test_flat_rows_when_the_shape_is_not_known(self):
        flat = dict(self.PACKED, layers=None, topk=None)
        self.assertEqual(rollgate.decode_routed_experts(flat), [[1, 5, 0, 7], [-1, -1, -1, -1], [3, 2, 6, 4]])

    def test_a_ragged_payload_is_refused(self):
        with self.assertRaises(ValueError):
            rollgate.decode_routed_experts(dict(self.PACKED, width=5))

    def test_step_batch_carries_them_per_sample(self):
        t = trace([1, 2], [3, 4], [0, 1], [0.0, -0.5], [None, "v1"])
        t["routed_experts"] = self.PACKED
        batch = grpo.step_batch([result("a", 1.0, traces=[t]), result("b", 0.0, traces=[trace([1], [2], [1], [-1.0], ["v1"])])], grpo.advantages([1.0, 0.0]))
        self.assertEqual(batch.samples[0]["routed_experts"], self.ROWS)
        self.assertEqual(len(batch.samples[0]["routed_experts"]), len(batch.samples[0]["input_ids"]) - 1)
        self.assertNotIn("routed_experts", batch.samples[1])


class SignatureTest(unittest.TestCase):
    def test_sign_and_verify_over_the_raw_bytes(self):
        body = b'{"id":"t-1","reward":1}'
        sig = rollgate.sign(body, "s3cret")
        self.assertTrue(sig.startswith("sha256=") and len(sig) == 7 + 64)
        # Known answer: HMAC-SHA256("s3cret", body).
        self.assertEqual(sig, "sha256=" + __import__("hmac").new(b"s3cret", body, "sha256").hexdigest())
        self.assertTrue(rollgate.verify(body, sig, "s3cret"))
        self.assertFalse(rollgate.verify(body + b" ", sig, "s3cret"))
        self.assertFalse(rollgate.verify(body, sig, "other"))
        self.assertFalse(rollgate.verify(body, None, "s3cret"))
        self.assertFalse(rollgate.verify(body, sig[7:], "s3cret"))
        self.assertFalse(rollgate.verify(body, "sha256=zz", "s3cret"))

    def test_a_delivery_is_signed_over_id_timestamp_event_and_body(self):
        import base64
        import hmac

        body = b'{"id":"t-1","reward":1}'
        sig = rollgate.sign_delivery("d-1", 1700000000, "task.completed", body, "s3cret")
        # Known answer (docs/http-api.md#callbacks), the same as the TypeScript signDelivery.
        mac = hmac.new(b"s3cret", b"d-1.1700000000.task.completed." + body, "sha256").digest()
        self.assertEqual(sig, "v2," + base64.b64encode(mac).decode())

        def check(delivery_id="d-1", event="task.completed", ts="1700000000", signature=sig, secret="s3cret", now=1700000000.0, **kw):
            return rollgate.verify_delivery(body, delivery_id, event, ts, signature, secret, now=now, **kw)

        self.assertIsNone(check())
        self.assertIsNone(check(now=1700000300.0))
        self.assertIsNone(check(signature="v2,AAAA " + sig))  # one of several (a rotation) is enough
        self.assertEqual(check(now=1700000301.0), "stale timestamp")
        self.assertEqual(check(now=1699999699.0), "stale timestamp")
        self.assertIsNone(check(now=1700001000.0, tolerance=1000))
        self.assertEqual(check(delivery_id="d-2"), "bad signature")
        self.assertEqual(check(event="task.failed"), "bad signature")
        self.assertEqual(check(ts="1700000001"), "bad signature")
        self.assertEqual(check(secret="other"), "bad signature")
        self.assertEqual(check(signature=rollgate.sign(body, "s3cret")), "missing signature")
        self.assertEqual(check(ts=None), "bad timestamp")


class SSEParserTest(unittest.TestCase):
    def test_events_split_anywhere_with_any_line_ends(self):
        text = 'id: 1\nevent: queued\ndata: {"id":"1","type":"queued","at":"t","data":{}}\n\n: keep-alive\r\n\r\nid: 2\r\ndata: a\r\ndata: b\r\n\r\nid: 3\rdata: c\r\r: more\n'
        for size in (1, 2, 7, len(text)):
            parser = SSEParser()
            out = []
            for k in range(0, len(text), size):
                out.extend(parser.feed(text[k : k + size]))
            self.assertEqual([(m.id, m.event, m.data) for m in out], [("1", "queued", '{"id":"1","type":"queued","at":"t","data":{}}'), ("2", "message", "a\nb"), ("3", "message", "c")])
        event = task_event(out[0], "t-1")
        self.assertEqual(event, {"id": "1", "type": "queued", "at": "t", "data": {}, "task_id": "t-1"})
        self.assertIsNone(task_event(out[1], "t-1"))


class CallsTest(unittest.TestCase):
    def test_what_may_be_sent_again(self):
        policy = RetryPolicy(retries=2)
        dropped = Failure(transport=True)
        self.assertTrue(policy.should_retry(_api.get("t"), 0, dropped))
        self.assertTrue(policy.should_retry(_api.cancel("t"), 1, dropped))
        self.assertFalse(policy.should_retry(_api.get("t"), 2, dropped))
        self.assertTrue(policy.should_retry(_api.submit({"id": "t-1"}), 0, dropped))
        self.assertFalse(policy.should_retry(_api.submit({"instruction": "x"}), 0, dropped))
        self.assertFalse(policy.should_retry(_api.submit_batch([{"id": "a"}, {}]), 0, dropped))
        self.assertTrue(policy.should_retry(_api.submit_batch([{"id": "a"}, {"id": "b"}]), 0, dropped))
        self.assertFalse(policy.should_retry(_api.submit_group({"id": "x"}, 4), 0, dropped))
        self.assertFalse(policy.should_retry(_api.pause("drain", 5), 0, dropped))
        self.assertFalse(policy.should_retry(_api.create_session({"id": "s-1"}), 0, dropped))
        self.assertFalse(policy.should_retry(_api.set_weights("v2", {"path": "/ckpt"}), 0, dropped))
        self.assertTrue(policy.should_retry(_api.set_weights("v2", None), 0, dropped))
        self.assertTrue(policy.should_retry(_api.get("t"), 0, Failure(transport=False, status=503)))
        self.assertFalse(policy.should_retry(_api.get("t"), 0, Failure(transport=False, status=500)))
        self.assertEqual(policy.delay(0, "2"), 2.0)

    def test_calls_are_built_from_the_arguments(self):
        group = _api.submit_group({"id": "ignored", "instruction": "x", "callback": {"url": "http://h/cb", "secret": "s"}}, 3, group_id="g-1")
        self.assertEqual(group.body, {"group_id": "g-1", "n": 3, "task": {"instruction": "x", "callback": {"url": "http://h/cb", "secret": "s"}}, "group_callback": {"url": "http://h/cb", "secret": "s"}})
        self.assertEqual(_api.get("a/b c").path, "/v1/tasks/a%2Fb%20c")
        self.assertEqual(_api.list_page("completed", None, 10, None).target("/base"), "/base/v1/tasks?status=completed&limit=10")
        self.assertEqual(_api.trajectory("s-1", "per_request", "verl").target(""), "/v1/sessions/s-1/trajectory?builder=per_request&format=verl")
        for bad in (lambda: _api.submit_group({}, 0), lambda: _api.submit("x"), lambda: _api.pause("now", 1), lambda: _api.trajectory("s", "x", "rollgate"), lambda: _api.set_weights("", None)):
            with self.assertRaises((ValueError, TypeError)):
                bad()
        with self.assertRaises(ValueError):
            rollgate.Client("ftp://nowhere")

    def test_trainer_samples_keep_the_sessions_lost_calls(self):
        lost = {"count": 1, "first": {"at": "t", "kind": "engine_rejected", "status": 502, "message": "engine answered 500"}}
        answer = {"builder": "per_request", "format": "verl", "samples": [{"prompts": [1], "responses": [2]}], "lost_calls": lost}
        for fmt in ("verl", "slime", "prime-rl"):
            samples = _api.trajectory("s-1", "per_request", fmt).parse(answer)
            self.assertEqual(samples, [{"prompts": [1], "responses": [2]}])
            self.assertEqual((samples.lost_calls, samples.builder, samples.whole), (lost, "per_request", False))
        whole = _api.trajectory("s-1", "per_request", "verl").parse({**answer, "lost_calls": {"count": 0, "first": None}})
        self.assertTrue(whole.whole)

    def test_a_2xx_that_is_not_json_is_not_taken_for_a_result(self):
        # ROLLGATE_URL pointing at another web server: its 200 page must not come back as the task record.
        for call in (_api.get("t-1"), _api.submit({"id": "t-1"}), _api.trajectory("s-1", "prefix_merging", "verl")):
            with self.assertRaises(RollgateError) as wrong:
                decode(call, 200, {"content-type": "text/html; charset=utf-8"}, b"<html>Sign in</html>")
            self.assertEqual((wrong.exception.type, wrong.exception.status), ("invalid_response", 200))
            self.assertIn("text/html", wrong.exception.message)
        self.assertEqual(decode(_api.logs("t-1"), 200, {"content-type": "text/plain; charset=utf-8"}, b"agent says hi\n"), "agent says hi\n")

    def test_numbers_the_gateway_would_change_are_refused_before_sending(self):
        # 2**63 + 5 would come back from the gateway (JavaScript doubles) as 9223372036854775808: a
        # dataset row id in metadata silently pointing at another row.
        with self.assertRaises(ValueError) as big:
            _api.submit({"instruction": "x", "metadata": {"rows": [7, 2**63 + 5]}})
        self.assertIn("metadata.rows[1] = 9223372036854775813", str(big.exception))
        self.assertIn("send it as a string", str(big.exception))
        for bad in (lambda: _api.submit_group({"metadata": {"score": float("nan")}}, 2), lambda: _api.create_session({"sampling": {"seed": -(2**60)}})):
            with self.assertRaises(ValueError):
                bad()
        ok = _api.submit({"instruction": "x", "metadata": {"row": 2**53 - 1, "neg": -(2**53 - 1), "f": 1e308, "flag": True}})
        self.assertEqual(json.loads(ok.payload())["metadata"]["row"], 2**53 - 1)

    def test_a_waits_outage_has_a_limit_and_only_outages_are_ridden_out(self):
        down = RollgateError("cannot reach", 0, "unreachable")
        outage = _api.Outage(grace=10)
        outage.failed(down, 100.0)
        outage.failed(RollgateError("busy", 503, "unavailable"), 105.0)
        self.assertIn("busy", outage.note())
        with self.assertRaises(RollgateError):
            outage.failed(down, 110.0)
        outage.answered()
        outage.failed(down, 200.0)  # a new outage starts its own count
        self.assertEqual(outage.note().count("cannot reach"), 1)
        with self.assertRaises(RollgateError):
            outage.failed(RollgateError("no such task", 404, "not_found"), 201.0)

    def test_error_answers_carry_the_servers_type_message_and_details(self):
        call = Call("POST", "/v1/tasks")
        body = b'{"error":{"type":"invalid_request","message":"agent: Required","details":[{"path":"agent"}]}}'
        with self.assertRaises(RollgateError) as caught:
            decode(call, 400, {"content-type": "application/json"}, body)
        err = caught.exception
        self.assertEqual((err.status, err.type, err.message, err.details, err.request), (400, "invalid_request", "agent: Required", [{"path": "agent"}], "POST /v1/tasks"))
        self.assertEqual(str(err), "HTTP 400 invalid_request: agent: Required (POST /v1/tasks)")
        plain = RollgateError.from_response(502, b"<html>bad gateway</html>", "GET /v1/tasks/x")
        self.assertEqual((plain.status, plain.type), (502, "internal_error"))
        self.assertIn("bad gateway", plain.message)
        with self.assertRaises(RollgateError) as shape:
            decode(Call("GET", "/admin/weights", parse=lambda v: v["version"]), 200, {"content-type": "application/json"}, b"{}")
        self.assertEqual(shape.exception.type, "invalid_response")


class PackageTest(unittest.TestCase):
    def test_every_module_is_python_3_9_syntax(self):
        # The package, its build backend, these tests and the examples a trainer copies.
        here = os.path.dirname(os.path.abspath(__file__))
        folders = [PACKAGE_DIR, here, os.path.join(here, "..", "_build"), os.path.join(here, "..", "..", "..", "examples", "python")]
        checked = 0
        for folder in folders:
            for name in sorted(os.listdir(folder)):
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), encoding="utf-8") as f:
                        ast.parse(f.read(), filename=os.path.join(folder, name), feature_version=(3, 9))
                    checked += 1
        self.assertGreater(checked, 15)

    def test_typed_and_exported(self):
        self.assertTrue(os.path.exists(os.path.join(PACKAGE_DIR, "py.typed")))
        for name in rollgate.__all__:
            self.assertTrue(hasattr(rollgate, name), name)
            obj = getattr(rollgate, name)
            if callable(obj):
                self.assertTrue(obj.__doc__, "%s has no docstring" % name)


if __name__ == "__main__":
    unittest.main()
