"""Worker selection for the frontend: round-robin, least-loaded and prefix-aware.

Pure logic: the frontend's proxy asks a policy for a worker given the candidates, their in-flight
counts and the request's prompt. Prefix-aware routing hashes the prompt in fixed-size blocks, each
hash chained to the one before (as Mooncake's `hash_ids` are), remembers which blocks each worker
has recently prefilled, and prefers the worker holding the longest run of leading blocks — where the
KV cache is warm — unless that worker is much busier than the least-loaded one.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# A block of prompt words stands in for a KV block of tokens; the simulator counts a word as a token.
BLOCK_WORDS = 64


@dataclass(frozen=True)
class Worker:
    """One engine endpoint the frontend may send to."""

    url: str
    role: str  # prefill, decode or aggregated
    name: str = ""
    generation: str = ""  # the pod's fleetpilot.dev/generation: KV caches move within one generation only


def paired(prefill: Sequence[Worker], decode: Sequence[Worker]) -> list[Worker]:
    """The prefill workers a request may start on: those whose generation has a decode worker too.
    During a rollout a generation may have prefill workers Ready before any decode worker (or the
    other way round); a request prefilled there would have nowhere to take its KV cache."""
    generations = {w.generation for w in decode}
    return [w for w in prefill if w.generation in generations]


def same_generation(workers: Sequence[Worker], generation: str) -> list[Worker]:
    """The decode workers a request prefilled on `generation` may continue on."""
    return [w for w in workers if w.generation == generation]


def block_hashes(prompt: str, *, block_words: int = BLOCK_WORDS) -> list[int]:
    """Chained hashes of the prompt's complete word blocks: equal leading hashes = shared prefix."""
    words = prompt.split()
    hashes: list[int] = []
    previous = b""
    for start in range(0, len(words) - block_words + 1, block_words):
        digest = hashlib.blake2b(previous + " ".join(words[start:start + block_words]).encode(), digest_size=8)
        previous = digest.digest()
        hashes.append(int.from_bytes(previous, "big"))
    return hashes


class Policy(Protocol):
    def choose(self, workers: Sequence[Worker], *, load: dict[str, int], prompt_blocks: list[int]) -> Worker: ...

    def routed(self, worker: Worker, prompt_blocks: list[int]) -> None: ...


class RoundRobin:
    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, workers: Sequence[Worker], *, load: dict[str, int], prompt_blocks: list[int]) -> Worker:
        ordered = sorted(workers, key=lambda w: w.url)
        return ordered[next(self._counter) % len(ordered)]

    def routed(self, worker: Worker, prompt_blocks: list[int]) -> None:
        pass


class LeastLoaded:
    """Fewest in-flight requests; ties go round-robin so equal workers share the load."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, workers: Sequence[Worker], *, load: dict[str, int], prompt_blocks: list[int]) -> Worker:
        fewest = min(load.get(w.url, 0) for w in workers)
        idle = sorted((w for w in workers if load.get(w.url, 0) == fewest), key=lambda w: w.url)
        return idle[next(self._counter) % len(idle)]

    def routed(self, worker: Worker, prompt_blocks: list[int]) -> None:
        pass


@dataclass
class PrefixCache:
    """What each worker probably holds in its KV cache: the blocks recently routed to it (LRU)."""

    blocks_per_worker: int = 200_000
    _cached: dict[str, OrderedDict[int, None]] = field(default_factory=dict)

    def match(self, url: str, prompt_blocks: list[int]) -> int:
        """How many leading blocks of the prompt the worker holds."""
        cached = self._cached.get(url)
        matched = 0
        if cached:
            for block in prompt_blocks:
                if block not in cached:
                    break
                matched += 1
        return matched

    def add(self, url: str, prompt_blocks: list[int]) -> None:
        cached = self._cached.setdefault(url, OrderedDict())
        for block in prompt_blocks:
            cached[block] = None
            cached.move_to_end(block)
        while len(cached) > self.blocks_per_worker:
            cached.popitem(last=False)

    def forget(self, url: str) -> None:
        self._cached.pop(url, None)


@dataclass
class PrefixAware:
    """Longest cached prefix wins, within `max_imbalance` in-flight requests of the least loaded."""

    max_imbalance: int = 8
    cache: PrefixCache = field(default_factory=PrefixCache)
    _fallback: LeastLoaded = field(default_factory=LeastLoaded)

    def choose(self, workers: Sequence[Worker], *, load: dict[str, int], prompt_blocks: list[int]) -> Worker:
        fewest = min(load.get(w.url, 0) for w in workers)
        eligible = [w for w in workers if load.get(w.url, 0) <= fewest + self.max_imbalance]
        best = max(self.cache.match(w.url, prompt_blocks) for w in eligible)
        if best == 0:
            return self._fallback.choose(eligible, load=load, prompt_blocks=prompt_blocks)
        warm = [w for w in eligible if self.cache.match(w.url, prompt_blocks) == best]
        return self._fallback.choose(warm, load=load, prompt_blocks=prompt_blocks)

    def routed(self, worker: Worker, prompt_blocks: list[int]) -> None:
        self.cache.add(worker.url, prompt_blocks)


def make_policy(name: str) -> Policy:
    policies: dict[str, type[Policy]] = {"round-robin": RoundRobin, "least-loaded": LeastLoaded,
                                         "prefix-aware": PrefixAware}
    if name not in policies:
        raise ValueError(f"unknown router policy {name!r}; choose one of {', '.join(policies)}")
    return policies[name]()
