"""Which shard a namespace belongs to: a stable hash, the same in every replica and every release.

sha256 of the namespace name, its first 8 bytes as an unsigned integer, modulo the shard count. A
namespace's notebooks therefore always fall in one shard, and the split does not depend on Python's
per-process string hash or on which notebooks exist.
"""

from __future__ import annotations

import hashlib
import math


def shard_of(namespace: str, shards: int) -> int:
    if shards <= 1:
        return 0
    digest = hashlib.sha256(namespace.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def fair_share(shards: int, replicas: int) -> tuple[int, int]:
    """(floor, ceil) of shards per live replica: no replica holds more than the ceiling, and one holding
    more than the floor hands a shard over while another holds less than the floor."""
    replicas = max(1, replicas)
    return shards // replicas, math.ceil(shards / replicas)
