#!/usr/bin/env python3
"""A GRPO training loop against rollgate, end to end, with no GPU (the local cluster's engine-sim
answers instead of a model):

    for each step:
        sample a GRPO group per prompt of a small task set   (submit_group, signed callbacks)
        rewards → advantages                                 (rollgate.grpo.group_advantages)
        trajectories → the step's arrays                     (rollgate.grpo.step_batch)
        [optimizer step: a real trainer updates the policy here and saves a checkpoint]
        pause → every engine loads the checkpoint → set the new version → resume
    and check that the next step's tokens carry the new version.

    pip install ./clients/python                  # once (offline: --no-index --no-build-isolation)
    npm start                                     # the local cluster, in another shell
    python3 examples/python/train_loop.py --steps 3 --group-size 4

Options: --url / $ROLLGATE_URL, --api-key / $ROLLGATE_API_KEY, --steps, --group-size, --prompts,
--checkpoints (a folder every engine can read; default a temporary one), --json (one summary
object on stdout). Exit code 0 when every group came back and every step's tokens carried that
step's weight version, 1 otherwise, 2 when rollgate is not installed or not reachable.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List

try:
    import rollgate
    from rollgate import grpo
except ImportError:
    sys.stderr.write("the rollgate package is not installed: pip install ./clients/python\n")
    sys.exit(2)

HERE = os.path.dirname(os.path.abspath(__file__))

# The task set: each prompt names the words its answer is rewarded for (a fraction of them found).
# The words are ones engine-sim's unscripted answers use, so rewards vary within a group.
PROMPTS = [
    {"instruction": "Describe a training step. Use the words token and model.", "words": ["token", "model"]},
    {"instruction": "Say how a test runs. Use the words test, run and result.", "words": ["test", "run", "result"]},
    {"instruction": "Explain a file. Use the words file, line and read.", "words": ["file", "line", "read"]},
    {"instruction": "Tell me about state. Use the words state and value.", "words": ["state", "value"]},
]

SCORE = "import sys; text = open('answer.txt').read().split(); words = sys.argv[1:]; print(sum(w in text for w in words) / len(words))"


def make_task(prompt: Dict[str, Any], agent_source: str, callback: Dict[str, str]) -> Dict[str, Any]:
    return {
        "instruction": prompt["instruction"],
        "agent": {"harness": "command", "command": ["python3", "agent.py"]},
        "runtime": {"files": {"agent.py": agent_source}},
        "evaluator": {"kind": "command", "command": ["python3", "-c", SCORE, *prompt["words"]], "reward": "last_line_float"},
        "limits": {"timeout_s": 300},
        "callback": callback,
        "metadata": {"example": "train_loop", "words": prompt["words"]},
    }


def fmt(values: List[Any], signed: bool = False) -> str:
    return "[" + ", ".join("-" if v is None else ("%+.2f" if signed else "%.2f") % v for v in values) + "]"


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description="A GRPO training loop against rollgate (weights loaded through rollgate between steps).")
    p.add_argument("--url", default=os.environ.get("ROLLGATE_URL", "http://127.0.0.1:8080"))
    p.add_argument("--api-key", default=os.environ.get("ROLLGATE_API_KEY"))
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per prompt (default 4)")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="prompts per step (default %d)" % len(PROMPTS))
    p.add_argument("--checkpoints", default=None, help="where checkpoints go (a folder every engine can read)")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for one step's groups")
    p.add_argument("--json", action="store_true", help="print one JSON summary on stdout (progress on stderr)")
    args = p.parse_args(argv)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))

    client = rollgate.Client(args.url, args.api_key)
    try:
        client.engines()
    except rollgate.RollgateError as err:
        sys.stderr.write("rollgate at %s: %s\n" % (args.url, err))
        return 2
    with open(os.path.join(HERE, "agent.py"), encoding="utf-8") as f:
        agent_source = f.read()
    checkpoints = args.checkpoints
    if not checkpoints:
        checkpoints = tempfile.mkdtemp(prefix="rollgate-train-loop-")
        # Stand-in checkpoints only the engines read while loading: gone with the run.
        atexit.register(shutil.rmtree, checkpoints, True)
    prompts = PROMPTS[: max(1, min(args.prompts, len(PROMPTS)))]
    run = secrets.token_hex(3)
    version = "run-%s-step-0" % run
    client.set_weights(version)  # the version of the weights the engines serve now
    summary: Dict[str, Any] = {"url": args.url, "steps": [], "versions": [version], "ok": True}
    say("rollgate train loop · %s · %d prompts × %d rollouts · %d steps" % (args.url, len(prompts), args.group_size, args.steps))

    with rollgate.CallbackReceiver(secrets.token_hex(16)) as inbox:
        for step in range(args.steps):
            started = time.monotonic()
            say("step %d · weights %s" % (step, version))
            groups = [client.submit_group(make_task(prompt, agent_source, inbox.callback), n=args.group_size) for prompt in prompts]
            batch = grpo.StepBatch([])
            step_info: Dict[str, Any] = {"step": step, "version": version, "groups": []}
            for prompt, group in zip(prompts, groups):
                results = inbox.wait_group(group["group_id"], timeout=args.timeout)
                adv = grpo.group_advantages(results)
                batch.extend(grpo.step_batch(results, adv))
                # The inbox keeps every result it received until told: one receiver for a long run would hold every trajectory.
                inbox.forget(group["group_id"])
                rewards = [r.get("reward") if r else None for r in results]
                say("  %-16s rewards %s → advantages %s%s" % ("/".join(prompt["words"]), fmt(rewards), fmt(adv.advantages, signed=True), "  (%s)" % "; ".join(adv.excluded.values()) if adv.excluded else ""))
                step_info["groups"].append({"group_id": group["group_id"], "rewards": rewards, "advantages": adv.advantages, "excluded": adv.excluded})

            # The weight versions that sampled this step's tokens: all of them must be this step's.
            versions = sorted({v for s in batch.samples for v, m in zip(s["weight_versions"], s["loss_mask"]) if m})
            on_policy = versions == [version]
            summary["ok"] = summary["ok"] and on_policy and not batch.skipped and len(batch.samples) > 0
            tokens = sum(len(ids) for ids in batch.input_ids)
            sampled = [lp for s in batch.samples for lp, m in zip(s["old_logprobs"], s["loss_mask"]) if m]
            mean_logprob = sum(sampled) / len(sampled) if sampled else None
            say("  step arrays: %d samples, %d tokens, %d trainable (mean old logprob %s), sampled by %s%s" % (len(batch.samples), tokens, batch.trainable_tokens, "-" if mean_logprob is None else "%.3f" % mean_logprob, versions, "" if on_policy else "  ← NOT only %s" % version))
            step_info.update({"samples": len(batch.samples), "tokens": tokens, "trainable_tokens": batch.trainable_tokens, "mean_old_logprob": mean_logprob, "sampled_by": versions, "skipped": batch.skipped})

            # ── The optimizer step goes here. A real trainer computes, per sample, the new policy's
            # logprobs of batch.input_ids, the ratio exp(new - batch.old_logprobs) on loss_mask tokens,
            # the clipped surrogate with batch.advantages, steps the optimizer, and saves the weights
            # as a checkpoint (safetensors + config) where every engine can read it. This example
            # writes a stand-in checkpoint: engine-sim reads no file, it changes its logprobs on load.
            next_version = "run-%s-step-%d" % (run, step + 1)
            checkpoint = os.path.join(checkpoints, next_version)
            os.makedirs(checkpoint, exist_ok=True)
            with open(os.path.join(checkpoint, "trainer_state.json"), "w") as f:
                json.dump({"version": next_version, "samples": len(batch.samples), "trainable_tokens": batch.trainable_tokens}, f)

            # The pause inside the try: a pause whose answer was lost may still have paused every
            # engine call, and only resume (harmless when nothing is paused) lets the agents go on.
            try:
                client.pause(mode="drain", timeout_s=60)
                loaded = client.set_weights(next_version, load={"path": checkpoint})
            finally:
                client.resume()
            ranks = ["%s#%d:%s" % (e["kind"], e["index"], ",".join(str(r["dp_rank"]) for r in e["ranks"] if r["loaded"])) for e in loaded["engines"]]
            say("  pause → load %s on every engine (ranks %s) → version %s → resume   (%.1f s)" % (checkpoint, " ".join(ranks), loaded["version"], time.monotonic() - started))
            step_info["loaded"] = {"version": loaded["version"], "engines": [{"kind": e["kind"], "ok": e["ok"], "ranks_loaded": [r["dp_rank"] for r in e["ranks"] if r["loaded"]]} for e in loaded["engines"]]}
            summary["steps"].append(step_info)
            version = next_version
            summary["versions"].append(version)

    verdict = "every step's tokens carried its weight version" if summary["ok"] else "SOMETHING WAS WRONG (see above)"
    say("done: %d steps, weight versions %s; %s" % (args.steps, " → ".join(summary["versions"]), verdict))
    if args.json:
        print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
