"""Worker selection policies and prompt block hashing (pure)."""

from __future__ import annotations

import pytest

from fleetpilot.frontend import routing
from fleetpilot.frontend.discovery import worker_from_pod

WORKERS = [routing.Worker(f"http://127.0.0.{i}:8000", "prefill", f"p{i}") for i in range(1, 4)]


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


def test_block_hashes_share_a_prefix_exactly_as_long_as_the_shared_text() -> None:
    shared = words(128, "s")
    first = routing.block_hashes(shared + " " + words(64, "a"))
    second = routing.block_hashes(shared + " " + words(64, "b"))
    assert len(first) == len(second) == 3
    assert first[:2] == second[:2]
    assert first[2] != second[2]


def test_block_hashes_are_chained_so_equal_blocks_after_a_difference_differ() -> None:
    tail = words(64, "t")
    assert routing.block_hashes(words(64, "x") + " " + tail)[1] != routing.block_hashes(words(64, "y") + " " + tail)[1]


def test_incomplete_trailing_block_is_not_hashed() -> None:
    assert routing.block_hashes(words(63, "w")) == []
    assert len(routing.block_hashes(words(127, "w"))) == 1


def test_round_robin_cycles_through_every_worker() -> None:
    policy = routing.RoundRobin()
    picks = [policy.choose(WORKERS, load={}, prompt_blocks=[]).url for _ in range(6)]
    assert picks[:3] == sorted(w.url for w in WORKERS)
    assert picks[3:] == picks[:3]


def test_least_loaded_picks_the_idlest_and_spreads_ties() -> None:
    policy = routing.LeastLoaded()
    load = {WORKERS[0].url: 3, WORKERS[1].url: 1, WORKERS[2].url: 1}
    picks = {policy.choose(WORKERS, load=load, prompt_blocks=[]).url for _ in range(4)}
    assert picks == {WORKERS[1].url, WORKERS[2].url}


def test_prefix_aware_returns_to_the_worker_that_holds_the_prefix() -> None:
    policy = routing.PrefixAware()
    blocks = routing.block_hashes(words(256, "doc"))
    first = policy.choose(WORKERS, load={}, prompt_blocks=blocks)
    policy.routed(first, blocks)
    again = [policy.choose(WORKERS, load={}, prompt_blocks=blocks[:3] + [42]) for _ in range(5)]
    assert {w.url for w in again} == {first.url}
    assert policy.cache.match(first.url, blocks) == 4


def test_prefix_aware_gives_way_when_the_warm_worker_is_overloaded() -> None:
    policy = routing.PrefixAware(max_imbalance=2)
    blocks = routing.block_hashes(words(128, "doc"))
    policy.routed(WORKERS[0], blocks)
    load = {WORKERS[0].url: 5, WORKERS[1].url: 0, WORKERS[2].url: 1}
    assert policy.choose(WORKERS, load=load, prompt_blocks=blocks).url == WORKERS[1].url


def test_prefix_aware_evicts_the_oldest_blocks_beyond_its_budget() -> None:
    cache = routing.PrefixCache(blocks_per_worker=4)
    old, new = routing.block_hashes(words(256, "old")), routing.block_hashes(words(256, "new"))
    cache.add(WORKERS[0].url, old)
    cache.add(WORKERS[0].url, new)
    assert cache.match(WORKERS[0].url, old) == 0
    assert cache.match(WORKERS[0].url, new) == 4


def test_unknown_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="round-robin, least-loaded, prefix-aware"):
        routing.make_policy("random")


def pod(*, ready: bool = True, ip: str | None = "127.1.0.9", role: str = "decode", deleting: bool = False) -> dict:
    meta: dict = {"name": "w-1", "labels": {"fleetpilot.dev/component": role}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status,
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8123}]}]}}


def test_only_ready_pods_with_an_ip_become_workers() -> None:
    assert worker_from_pod(pod()) == routing.Worker("http://127.1.0.9:8123", "decode", "w-1")
    assert worker_from_pod(pod(ready=False)) is None
    assert worker_from_pod(pod(ip=None)) is None
    assert worker_from_pod(pod(deleting=True)) is None
    assert worker_from_pod(pod(role="frontend")) is None


def test_a_multinode_replica_is_reached_through_its_leader_only() -> None:
    leader, worker = pod(), pod()
    leader["metadata"]["labels"]["fleetpilot.dev/group-role"] = "leader"
    worker["metadata"]["labels"]["fleetpilot.dev/group-role"] = "worker"
    assert worker_from_pod(leader) is not None
    assert worker_from_pod(worker) is None


def mooncake_blocks(limit: int) -> list[list[int]]:
    import json
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    with trace.open() as lines:
        return [json.loads(line)["hash_ids"] for _, line in zip(range(limit), lines, strict=False)]


def hit_rate(policy: routing.Policy, requests: list[list[int]], workers: list[routing.Worker]) -> float:
    """Share of prompt blocks already held by the worker each request is sent to."""
    cache = routing.PrefixCache()
    hits = total = 0
    for blocks in requests:
        worker = policy.choose(workers, load={}, prompt_blocks=blocks)
        policy.routed(worker, blocks)
        hits += cache.match(worker.url, blocks)
        total += len(blocks)
        cache.add(worker.url, blocks)
    return hits / total


def test_prefix_aware_routing_beats_round_robin_on_the_mooncake_trace() -> None:
    """Mooncake's hash_ids are the trace's own 512-token prefix blocks: route them as-is."""
    requests = mooncake_blocks(3000)
    workers = [routing.Worker(f"http://127.0.0.{i}:8000", "prefill") for i in range(1, 5)]
    prefix = hit_rate(routing.PrefixAware(), requests, workers)
    round_robin = hit_rate(routing.RoundRobin(), requests, workers)
    print(f"\nprefix-cache block hit rate on 3,000 Mooncake requests, 4 prefill workers: "
          f"prefix-aware {prefix:.1%}, round-robin {round_robin:.1%}")
    assert prefix > round_robin + 0.10


def test_a_pods_generation_comes_with_it() -> None:
    labelled = pod()
    labelled["metadata"]["labels"]["fleetpilot.dev/generation"] = "abc123"
    assert worker_from_pod(labelled) == routing.Worker("http://127.1.0.9:8123", "decode", "w-1", "abc123")


# -- generation pairing: a KV cache never crosses engine or model versions ---------------------------------


def gen(role: str, generation: str, i: int) -> routing.Worker:
    return routing.Worker(f"http://127.0.{ord(generation[0])}.{i}:8000", role, f"{role}-{generation}-{i}", generation)


def test_prefill_goes_only_to_a_generation_that_has_decode_workers_too() -> None:
    # Mid-rollout: the new generation's prefill is Ready before any of its decode workers.
    prefill = [gen("prefill", "old", 1), gen("prefill", "new", 1), gen("prefill", "new", 2)]
    decode = [gen("decode", "old", 1)]
    assert routing.paired(prefill, decode) == [prefill[0]]
    decode.append(gen("decode", "new", 1))
    assert routing.paired(prefill, decode) == prefill
    assert routing.paired(prefill, []) == []


def test_decode_goes_only_to_the_prefill_workers_generation() -> None:
    decode = [gen("decode", "old", 1), gen("decode", "new", 1), gen("decode", "new", 2)]
    assert routing.same_generation(decode, "new") == decode[1:]
    assert routing.same_generation(decode, "gone") == []


def test_pods_from_before_generations_pair_with_each_other() -> None:
    legacy_p, legacy_d = routing.Worker("http://p", "prefill", "p"), routing.Worker("http://d", "decode", "d")
    assert routing.paired([legacy_p, gen("prefill", "new", 1)], [legacy_d]) == [legacy_p]
    assert routing.same_generation([legacy_d, gen("decode", "new", 1)], "") == [legacy_d]
