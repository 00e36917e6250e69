#!/usr/bin/env python3
"""The agent of the example training loop: one chat call to its rollgate session, the answer
written to answer.txt (the evaluator scores that file). Standard library only.

rollgate's worker gives every agent OPENAI_BASE_URL and OPENAI_API_KEY (its session) and
ROLLGATE_INSTRUCTION (the task). The rollout's id goes into the prompt because engine-sim, which
answers here instead of a GPU, does not sample: its unscripted answer is a deterministic function of
the prompt, so without it every member of a GRPO group would say the same thing. A real model
samples, and needs no such line.
"""

import json
import os
import urllib.request

prompt = "%s\n(rollout %s)" % (os.environ["ROLLGATE_INSTRUCTION"], os.environ.get("ROLLGATE_TASK_ID", ""))
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps({"model": "policy", "messages": [{"role": "user", "content": prompt}]}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
with urllib.request.urlopen(request, timeout=120) as response:
    answer = json.load(response)["choices"][0]["message"]["content"] or ""
with open("answer.txt", "w") as f:
    f.write(answer)
print(answer)
