"""Kafka's default partitioner, so the local log and a Kafka topic put each key in one partition.

Kafka hashes the serialized key bytes with murmur2 (seed ``0x9747b28c``) and takes
``(hash & 0x7fffffff) % partitions``. Python's ``hash()`` is salted per process and must never
be used for this.
"""

from __future__ import annotations

import contextlib

from cdc.speedups import pure_python

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the 32-bit hash as a *signed* int, like the Java client."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


if not pure_python():
    # the compiled twins (cdc/log/_fast.pyx), when the install could build them
    with contextlib.suppress(ImportError):
        from cdc.log._fast import (  # type: ignore[import-not-found,no-redef,unused-ignore] # noqa: F401
            murmur2,
            partition_for,
        )
