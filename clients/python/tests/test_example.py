"""``examples/python/train_loop.py``, the loop trainers copy, under a failure of its weight cycle
(live: ``ROLLGATE_URL``). CI also runs it to the end on a healthy cluster."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import unittest

import rollgate
from support import API_KEY, URL, FlakyProxy, live

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python", "train_loop.py")


def load_example():
    spec = importlib.util.spec_from_file_location("train_loop_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@live
class TrainLoopExampleTest(unittest.TestCase):
    def test_a_pause_whose_answer_is_lost_does_not_leave_inference_paused(self):
        """The gateway paused every engine call but its answer never came: the loop must still
        resume, or every agent on the cluster waits forever behind a trainer that crashed."""
        direct = rollgate.Client(URL, API_KEY)
        example = load_example()
        try:
            with FlakyProxy(URL, lose_answers=1, lose_answers_to="POST /admin/inference/pause") as proxy:
                with self.assertRaises(rollgate.RollgateError) as failed, contextlib.redirect_stdout(io.StringIO()):
                    example.main(["--url", proxy.url] + (["--api-key", API_KEY] if API_KEY else []) + ["--steps", "1", "--group-size", "2", "--prompts", "1", "--timeout", "120"])
            self.assertEqual(proxy.lost, 1)
            self.assertTrue(failed.exception.unreachable)
            self.assertFalse(direct.inference()["paused"])
        finally:
            direct.resume()


if __name__ == "__main__":
    unittest.main()
