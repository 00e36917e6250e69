"""rollgate: the Python client of rollgate, the rollout gateway for agentic RL.

    import rollgate

    client = rollgate.Client("http://127.0.0.1:8080")          # or $ROLLGATE_URL, $ROLLGATE_API_KEY
    with rollgate.CallbackReceiver(secret="s3cret") as inbox:
        group = client.submit_group({**task, "callback": inbox.callback}, n=8)
        results = inbox.wait_group(group["group_id"])
    adv = rollgate.grpo.group_advantages(results)
    batch = rollgate.grpo.step_batch(results, adv)             # token ids, loss mask, old logprobs, advantages

Standard library only (Python >= 3.9). ``AsyncClient`` is the same API as coroutines.
"""

from . import grpo
from ._http import __version__
from .async_client import AsyncClient
from .callbacks import CallbackReceiver, Delivery, sign, sign_delivery, verify, verify_delivery
from .client import Client
from .errors import RollgateError
from .routing import decode_routed_experts
from .trainer_formats import TrainerSamples

__all__ = ["AsyncClient", "CallbackReceiver", "Client", "Delivery", "RollgateError", "TrainerSamples", "decode_routed_experts", "grpo", "sign", "sign_delivery", "verify", "verify_delivery", "__version__"]
