"""Routed experts (routing replay, R3) as rollgate stores and exports them.

A trace's ``routed_experts`` (verl and prime-rl samples: ``routed_experts``; slime:
``rollout_routed_experts``) is ``{"layers", "topk", "width", "data"}``: ``data`` is base64 of int32
little-endian ids, one row of ``width`` ids per position of prompt + response except the last
(layer-major, ``layers × topk`` when known). A row of -1 is a position the engine did not report.
With numpy: ``np.frombuffer(base64.b64decode(d["data"]), "<i4").reshape(-1, layers, topk)``.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, List, Mapping, Union

Rows = Union[List[List[int]], List[List[List[int]]]]


def decode_routed_experts(routed: Mapping[str, Any]) -> Rows:
    """The rows as nested lists: ``[positions][layers][topk]`` when layers and topk are known, else ``[positions][width]``."""
    raw = base64.b64decode(routed["data"])
    width = int(routed["width"])
    count = len(raw) // 4
    if count % width:
        raise ValueError("routed experts hold %d ids, not a whole number of rows of %d" % (count, width))
    ids = struct.unpack("<%di" % count, raw)
    rows = [list(ids[i : i + width]) for i in range(0, count, width)]
    layers, topk = routed.get("layers"), routed.get("topk")
    if layers and topk and int(layers) * int(topk) == width:
        k = int(topk)
        return [[row[j : j + k] for j in range(0, width, k)] for row in rows]
    return rows
