"""What a Python trainer gets is what the gateway (TypeScript) means, field by field, on real
sessions of every engine the cluster under test serves (each model family it has: run the suite
against a cluster whose ``ROLLGATE_ENGINES`` lists several to cover them all).

Per engine: an agent conversation over the session's OpenAI route (a tool call, a retry of the
same call, an answer cut by ``max_tokens`` and continued, a side request without tools). Then, for
every builder, the trajectory in ``rollgate`` format and in each trainer format the gateway
converts (``verl``, ``slime``, ``prime-rl``) against ``rollgate.grpo.step_batch`` of the same
traces: the same samples in the same order, the same token ids, masks, logprobs (bit for bit),
lengths, truncation, statuses and routed experts.
"""

from __future__ import annotations

import base64
import json
import struct
import unittest
import urllib.error
import urllib.request
from typing import Any, Dict, List

import rollgate
from rollgate import grpo
from support import API_KEY, URL, answer_task, live, uid

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
LONG = " ".join("word%d" % i for i in range(40))
STEPS = [{"think": "use the shell", "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]}, {"text": "The listing says %s. Ünïcödé ✓ 日本語 🎉." % LONG}, {"text": "Finished."}]
BUILDERS = ("per_request", "prefix_merging", "prefix_tree")
SLIME_STATUS = {"length": "truncated", "abort": "aborted", "error": "failed"}


def chat(session: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    req = urllib.request.Request(
        session["urls"]["openai"] + "/chat/completions",
        data=json.dumps(body).encode("utf-8"),
        headers={"content-type": "application/json", "authorization": "Bearer " + session["token"]},
    )
    with urllib.request.urlopen(req, timeout=60) as res:
        return json.load(res)


def conversation(session: Dict[str, Any], model: str) -> int:
    """The TS trainer-formats suite's session, from Python: 5 calls, one of each kind a trainer meets."""
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "List the files.\n#sim: " + json.dumps(STEPS)}]
    first = chat(session, {"model": model, "messages": messages, "tools": TOOLS})["choices"][0]["message"]
    messages += [first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "a.txt b.txt"}]
    chat(session, {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 12})  # a retry: a sibling
    cut = chat(session, {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 12})["choices"][0]
    assert cut["finish_reason"] == "length", cut
    messages += [cut["message"], {"role": "user", "content": "go on"}]
    chat(session, {"model": model, "messages": messages, "tools": TOOLS})
    chat(session, {"model": model, "messages": [{"role": "user", "content": "Title for: list the files"}]})
    return 5


def raw_rows(routed: Dict[str, Any]) -> List[int]:
    data = base64.b64decode(routed["data"])
    return list(struct.unpack("<%di" % (len(data) // 4), data))


@live
class TrainerFormatParityTest(unittest.TestCase):
    client: rollgate.Client
    sessions: Dict[str, str]

    @classmethod
    def setUpClass(cls):
        cls.client = rollgate.Client(URL, API_KEY)
        cls.sessions = {}
        # The gateway places a session on any engine (they serve one policy): open sessions until
        # each engine has one, keyed by the model it serves.
        engines = {e["index"] for e in cls.client.engines()["engines"]}
        covered = set()
        extra = []  # kept open until every engine has one: placement follows open sessions
        for _ in range(8 * len(engines)):
            if covered == engines:
                break
            session = cls.client.create_session()
            assignment = cls.client.session(session["id"])["assignment"]
            if assignment["engine"] in covered:
                extra.append(session["id"])
                continue
            conversation(session, "policy")
            covered.add(assignment["engine"])
            cls.sessions["%s (engine %d)" % (assignment["served_model"], assignment["engine"])] = session["id"]
        for sid in extra:
            cls.client.close_session(sid)

    def test_there_are_sessions_to_compare(self):
        self.assertGreater(len(self.sessions), 0)

    def test_step_batch_and_every_trainer_format_carry_the_same_tokens(self):
        c = self.client
        for model, sid in self.sessions.items():
            for builder in BUILDERS:
                with self.subTest(model=model, builder=builder):
                    traj = c.trajectory(sid, builder=builder)
                    traces = traj["traces"]
                    self.assertGreaterEqual(len(traces), 2)
                    self.assertEqual(traj["stats"]["records"], 5)
                    # Two members with different rewards, each holding this trajectory: advantages ±a.
                    results = [{"id": "m-%d" % k, "group_id": "m", "status": "completed", "reward": float(k), "trajectory": traj} for k in range(2)]
                    adv = grpo.group_advantages(results)
                    batch = grpo.step_batch(results, adv)
                    samples = [s for s in batch.samples if s["member"] == 0]
                    verl = c.trajectory(sid, builder=builder, format="verl")
                    slime = c.trajectory(sid, builder=builder, format="slime")
                    prime = c.trajectory(sid, builder=builder, format="prime-rl")
                    self.assertEqual([len(samples), len(verl), len(slime), len(prime)], [len(traces)] * 4)
                    for k, (t, s, v, sl, p) in enumerate(zip(traces, samples, verl, slime, prime)):
                        n_prompt, n_resp = len(t["prompt_ids"]), len(t["response_ids"])
                        self.assertEqual((s["trace"], s["prompt_length"]), (k, n_prompt))
                        # Token ids: the whole sequence, and its split into prompt and response.
                        self.assertEqual(s["input_ids"], v["prompts"] + v["responses"])
                        self.assertEqual(s["input_ids"], sl["tokens"])
                        self.assertEqual(s["input_ids"], p["prompt_ids"] + p["completion_ids"])
                        self.assertEqual((len(v["prompts"]), len(p["prompt_ids"]), sl["response_length"]), (n_prompt, n_prompt, n_resp))
                        # Masks: step_batch spans prompt + response, the formats the response (prime-rl's prompt mask all 0).
                        self.assertEqual(s["loss_mask"], [0] * n_prompt + v["response_mask"])
                        self.assertEqual(v["response_mask"], sl["loss_mask"])
                        self.assertEqual(v["response_mask"], p["completion_mask"])
                        self.assertEqual(p["prompt_mask"], [0] * n_prompt)
                        self.assertTrue(all(m in (0, 1) and isinstance(m, int) and not isinstance(m, bool) for m in s["loss_mask"]))
                        # Logprobs: the engine's floats bit for bit (repr compares every digit), 0 where not sampled.
                        for lp in (v["rollout_log_probs"], sl["rollout_log_probs"], p["completion_logprobs"]):
                            self.assertEqual([repr(x) for x in s["old_logprobs"][n_prompt:]], [repr(float(x)) for x in lp])
                        self.assertTrue(all(lp == 0.0 for lp, m in zip(s["old_logprobs"], s["loss_mask"]) if not m))
                        self.assertTrue(all(lp <= 0.0 for lp in s["old_logprobs"]))
                        # Advantages on exactly the trainable tokens; weight versions on exactly the sampled ones.
                        a = adv.advantages[0]
                        self.assertEqual(s["advantages"], [a if m else 0.0 for m in s["loss_mask"]])
                        self.assertEqual([w is not None for w in s["weight_versions"]], [bool(m) for m in s["loss_mask"]])
                        # Truncation and status, as each trainer reads them from the trace's finish reason.
                        self.assertEqual(p["is_truncated"], t["finish_reason"] == "length")
                        self.assertIs(p["overlong_prompt"], False)
                        self.assertEqual(sl["status"], SLIME_STATUS.get(t["finish_reason"], "completed"))
                        # Routed experts: the same rows under each format's name, one per position but the last.
                        routed = t.get("routed_experts")
                        self.assertEqual(v.get("routed_experts"), routed)
                        self.assertEqual(p.get("routed_experts"), routed)
                        self.assertEqual(sl.get("rollout_routed_experts"), routed)
                        if routed:
                            rows = s["routed_experts"]
                            self.assertEqual(len(rows), n_prompt + n_resp - 1)
                            flat = [x for row in rows for x in (row if not row or isinstance(row[0], int) else [y for r in row for y in r])]
                            self.assertEqual(flat, raw_rows(routed))
                        else:
                            self.assertNotIn("routed_experts", s)
                    self.assertEqual(batch.trainable_tokens, 2 * sum(sum(t["loss_mask"]) for t in traces))

    def test_the_sampled_tokens_are_the_records_once_each(self):
        """Every record's output is trainable in exactly one sample, at the right place, with its logprobs."""
        c = self.client
        for model, sid in self.sessions.items():
            records = {r["id"]: r for r in c.completions(sid)}
            for builder in BUILDERS:
                with self.subTest(model=model, builder=builder):
                    traj = c.trajectory(sid, builder=builder)
                    seen: Dict[str, int] = {}
                    for t, per in zip(traj["traces"], traj["stats"]["per_trace"]):
                        full = t["prompt_ids"] + t["response_ids"]
                        for span in per["spans"]:
                            r = records[span["record_id"]]
                            at = len(t["prompt_ids"]) + span["output_start"]
                            self.assertEqual(full[:at], r["prompt_ids"])
                            self.assertEqual(t["response_ids"][span["output_start"] : span["end"]], r["output_ids"])
                            self.assertEqual(t["response_logprobs"][span["output_start"] : span["end"]], r["output_logprobs"])
                            self.assertEqual(t["loss_mask"][span["output_start"] : span["end"]], [1] * len(r["output_ids"]))
                            seen[r["id"]] = seen.get(r["id"], 0) + 1
                    self.assertEqual(sorted(seen), sorted(records))
                    self.assertEqual(set(seen.values()), {1})


    def test_a_callbacks_trajectory_is_the_sessions_by_the_tasks_builder(self):
        """What a task's signed callback carries is what the gateway builds for its session, so a
        trainer's step from callbacks and one from the session's trainer format agree."""
        c = self.client
        with rollgate.CallbackReceiver(uid("secret")) as inbox:
            for builder in BUILDERS:
                with self.subTest(builder=builder):
                    accepted = c.submit(answer_task(callback=inbox.callback, trajectory={"builder": builder}))
                    result = inbox.wait(accepted["id"], timeout=120)
                    self.assertEqual(result["status"], "completed")
                    self.assertEqual(result["trajectory"], c.trajectory(result["session_id"], builder=builder))
                    [sample] = grpo.step_batch([result], grpo.GroupAdvantages([1.0], "mean", 1.0, 0.0)).samples
                    [verl] = c.trajectory(result["session_id"], builder=builder, format="verl")
                    self.assertEqual(sample["input_ids"], verl["prompts"] + verl["responses"])
                    self.assertEqual(sample["loss_mask"], [0] * len(verl["prompts"]) + verl["response_mask"])
                    self.assertEqual(sample["old_logprobs"][len(verl["prompts"]) :], verl["rollout_log_probs"])

    def test_the_members_grpo_leaves_out_are_the_group_summarys_unscored(self):
        """The group callback's summary (TypeScript) and group_advantages (Python) agree on which
        members carry no reward, and why."""
        grader = "import os,sys; t=os.environ.get('ROLLGATE_TASK_ID',''); sys.exit(3) if t.endswith('-1') else print(0.5 if t.endswith('-2') else 1.0)"
        evaluator = {"kind": "command", "command": ["python3", "-c", grader], "reward": "last_line_float"}
        with rollgate.CallbackReceiver(uid("secret")) as inbox:
            group = self.client.submit_group(answer_task(evaluator=evaluator, callback=inbox.callback), n=4)
            results = inbox.wait_group(group["group_id"], timeout=120)
            [summary] = [d.body["summary"] for d in inbox.deliveries if d.event == "group.completed"]
        adv = grpo.group_advantages(results)
        self.assertEqual(summary["scored"], len(adv.included))
        self.assertEqual([u["id"] for u in summary["unscored"]], [results[i]["id"] for i in sorted(adv.excluded)])
        for u in summary["unscored"]:
            member = [r["id"] for r in results].index(u["id"])
            self.assertIn("%s: %s" % (u["error"]["kind"], u["error"]["message"]), adv.excluded[member])
        self.assertEqual([r["reward"] for r in results], [1, None, 0.5, 1])

    def test_a_trainer_format_says_the_sessions_lost_calls(self):
        """An engine error mid-session is a lost call: the samples a trainer reads must say the rollout is not whole."""
        c = self.client
        session = c.create_session()
        assignment = c.session(session["id"])["assignment"]
        chat(session, {"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
        if not sim_fault(assignment, "error"):
            self.skipTest("engine %s is not engine-sim (no /sim/faults): cannot make a call fail" % assignment["engine_url"])
        try:
            with self.assertRaises(urllib.error.HTTPError):
                chat(session, {"model": "policy", "messages": [{"role": "user", "content": "hi again"}]})
        finally:
            sim_fault(assignment, "none")
        lost = c.session(session["id"])["lost_calls"]
        self.assertEqual(lost["count"], 1)
        for fmt in ("verl", "slime", "prime-rl"):
            samples = c.trajectory(session["id"], format=fmt)
            self.assertEqual(len(samples), 1)
            self.assertEqual(samples.lost_calls, lost)
            self.assertFalse(samples.whole)
        self.assertEqual(c.trajectory(session["id"])["stats"]["lost_calls"], lost)


def sim_fault(assignment: Dict[str, Any], mode: str) -> bool:
    """Sets engine-sim's fault on the session's rank; False when the engine has no fault route."""
    req = urllib.request.Request(
        assignment["engine_url"] + "/sim/faults",
        data=json.dumps({"rank": assignment["dp_rank"], "mode": mode}).encode("utf-8"),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status == 200
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return False
        raise

if __name__ == "__main__":
    unittest.main()
