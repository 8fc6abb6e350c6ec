"""How a stage splits its items over ranks and seeds each item: the same in every process.

A rank's output must not depend on which process, machine or executor computed it, nor on
how many ranks there are beside it, so items are dealt round-robin from a sorted list and
each episode's seed is derived from what it is (never from `hash()`, which differs per process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def stable_seed(*parts: object) -> int:
    """A 62-bit seed from any parts, identical in every process (unlike hash())."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 62) - 1)


def shard_items(items: Sequence, rank: int, world_size: int) -> list:
    """Round-robin split of a sorted item list: deterministic and balanced."""
    return list(items[rank::world_size])
