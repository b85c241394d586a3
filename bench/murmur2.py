"""Benchmark: onceflow's murmur2 against aiokafka's, on the worker's routing keys.

The worker hashes every document's routing key (wire.route_partition) with Kafka's
murmur2, so that a routed document lands on the partition Kafka's default partitioner
would pick.  onceflow keeps its own version (core/keys.py, compiled, on 64-bit machine
integers) only if it pays: this prints both rates and their ratio, measured in the same run, on
uuid-shaped keys (36 bytes) and on short and long keys, and checks they agree.

    .venv/bin/python bench/murmur2.py [--keys 200000]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from onceflow.keys import murmur2


def rate(function: Callable[[bytes], int], keys: list[bytes], rounds: int = 3) -> float:
    """Best of `rounds`: keys hashed per second."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for key in keys:
            function(key)
        best = min(best, time.perf_counter() - start)
    return len(keys) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args()
    shapes = {
        "uuid (36 bytes)": [str(uuid.uuid4()).encode() for _ in range(args.keys)],
        "short (6 bytes)": [f"k-{i % 1000:03d}".encode() for i in range(args.keys)],
        "long (200 bytes)": [(str(uuid.uuid4()) * 6)[:200].encode()
                             for _ in range(args.keys // 4)],
    }
    print(f"{'keys':<18} {'onceflow /s':>14} {'aiokafka /s':>14} {'ratio':>7}")
    for name, keys in shapes.items():
        assert all(murmur2(k) == aiokafka_murmur2(k) for k in keys[:5000]), name
        ours, theirs = rate(murmur2, keys), rate(aiokafka_murmur2, keys)
        print(f"{name:<18} {ours:>14,.0f} {theirs:>14,.0f} {ours / theirs:>6.2f}x")


if __name__ == "__main__":
    main()
