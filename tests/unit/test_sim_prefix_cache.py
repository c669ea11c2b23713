"""The simulator's automatic prefix caching (fleetpilot/sim/kvcache.py and its use in scheduler.py), with
vLLM V1's semantics: chained hashes of full blocks, the longest cached prefix reused at admission, at
least the last token computed, freed blocks kept cached and evicted least recently freed first, never
while referenced, and vLLM's counters in tokens.

Block size 16 throughout; the fake timing model prices a prefill at 1 ms per 100 new tokens, whatever
the context, so a step's prefill tokens are what it costs (the real performance model is used where
the cached context's attention matters).
"""

from __future__ import annotations

import argparse

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sim_timing import PREFILL_S_PER_TOKEN, FakeTiming
from test_sim_server import MODEL, worker

from fleetpilot import traces
from fleetpilot.replay import prompts
from fleetpilot.sim import cli as sim_cli
from fleetpilot.sim import kvcache, metrics, server
from fleetpilot.sim import scheduler as scheduler_mod

BS = 16


def make(capacity: int = 1_000_000, **config: float | bool) -> scheduler_mod.Scheduler:
    return scheduler_mod.Scheduler(FakeTiming(capacity), scheduler_mod.SchedulerConfig(**config))  # type: ignore[arg-type]


def ids(*runs: tuple[int, int]) -> tuple[int, ...]:
    """Token ids made of runs (first id, length): (0, 32) is 0..31."""
    return tuple(i for first, length in runs for i in range(first, first + length))


def spec(token_ids: tuple[int, ...], max_tokens: int = 1, mode: scheduler_mod.Mode = scheduler_mod.Mode.FULL,
         rid: str | None = None) -> scheduler_mod.RequestSpec:
    return scheduler_mod.RequestSpec(len(token_ids), max_tokens, mode, rid, token_ids)


class Run:
    """Steps a scheduler in simulated time; keeps each step's plan."""

    def __init__(self, scheduler: scheduler_mod.Scheduler) -> None:
        self.scheduler = scheduler
        self.now = 0.0
        self.plans: list[scheduler_mod.StepPlan] = []
        self.records: dict[str, scheduler_mod.RequestRecord] = {}

    def add(self, request: scheduler_mod.RequestSpec) -> str:
        return self.scheduler.add(request, self.now)

    def until_idle(self) -> None:
        for _ in range(10_000):
            if not self.scheduler.has_work():
                return
            plan, result = self.scheduler.step(self.now)
            if plan.empty:
                deadline = self.scheduler.next_deadline()
                assert deadline is not None and deadline > self.now
                self.now = deadline
                continue
            self.plans.append(plan)
            self.now += self.scheduler.step_duration(plan)
            self.records.update((r.request_id, r) for r in result.finished)
        raise AssertionError("not idle")

    def serve(self, request: scheduler_mod.RequestSpec) -> tuple[scheduler_mod.RequestRecord, list[scheduler_mod.StepPlan]]:
        """Run one request alone: its record and the plans of its steps."""
        before = len(self.plans)
        rid = self.add(request)
        self.until_idle()
        return self.records[rid], self.plans[before:]


# -- hashes --------------------------------------------------------------------------------------------


def test_block_hashes_chain_over_the_prompt_and_skip_a_partial_last_block() -> None:
    shared = kvcache.block_hashes(ids((0, 40)), BS)
    assert len(shared) == 2  # 40 tokens: two full blocks, the last 8 tokens have no hash
    assert kvcache.block_hashes(ids((0, 32), (900, 5)), BS) == shared  # the same full blocks, same hashes
    assert len(set(shared)) == 2
    # The same 16 tokens after a different first block are a different block: the hash names the prefix.
    moved = kvcache.block_hashes(ids((500, 16), (16, 16)), BS)
    assert moved[1] != shared[1]
    assert kvcache.block_hashes(ids((0, 15)), BS) == ()
    assert kvcache.block_hashes([2**70] * BS, BS)  # ids too big for 64 bits still hash


# -- the block pool ------------------------------------------------------------------------------------


def test_freed_blocks_stay_cached_and_free_and_are_evicted_least_recently_freed_first() -> None:
    pool = kvcache.BlockPool(4)
    hashes = [bytes([i]) * 16 for i in range(4)]
    a, b = pool.allocate(2), pool.allocate(2)
    assert a is not None and b is not None
    for block, block_hash in zip(a + b, hashes, strict=True):
        pool.cache(block, block_hash)
    held_a, held_b = list(a), list(b)
    pool.release(a)  # a's blocks first (last block first), then b's
    pool.release(b)
    assert (pool.free, pool.cached) == (4, 4)  # unreferenced cached blocks are free
    assert pool.longest_hit(hashes) == held_a + held_b
    first = pool.allocate(1)
    assert first == [held_a[1]] and pool.evictions == 1  # a's tail went first: the oldest, private end
    assert pool.longest_hit(hashes) == [held_a[0]]  # a chain is only as long as its first missing block
    assert pool.allocate(2) == [held_a[0], held_b[1]]
    assert pool.longest_hit(hashes[2:]) == [held_b[0]]


def test_referenced_blocks_are_never_evicted_and_a_hit_takes_an_unreferenced_block_out_of_the_free_pool() -> None:
    pool = kvcache.BlockPool(3)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.cache(blocks[0], b"x" * 16)
    pool.cache(blocks[1], b"y" * 16)
    kept = list(blocks)
    pool.release(blocks)
    hit = pool.longest_hit([b"x" * 16])
    assert pool.evictable(hit) == 1
    pool.touch(hit)  # a second request reuses block x: referenced again, no longer free
    assert pool.free == 2
    assert pool.allocate(3) is None
    assert pool.allocate(2) is not None and pool.evictions == 1  # y and the empty block; x untouchable
    assert pool.longest_hit([b"x" * 16, b"y" * 16]) == [kept[0]]
    pool.touch(hit)
    pool.release(list(hit))
    assert pool.free == 0  # still referenced once
    pool.release(hit)
    assert pool.free == 1


def test_with_caching_off_nothing_is_named_and_nothing_hits() -> None:
    pool = kvcache.BlockPool(2, caching=False)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.cache(blocks[0], b"x" * 16)
    pool.release(blocks)
    assert pool.cached == 0 and pool.longest_hit([b"x" * 16]) == []


# -- the scheduler ---------------------------------------------------------------------------------------


def test_a_shared_prefix_is_reused_and_only_the_uncached_tokens_are_prefilled() -> None:
    run = Run(make())
    first, first_plans = run.serve(spec(ids((0, 100))))
    assert first.cached_tokens == 0 and first_plans[0].prefill_tokens == 100
    second, plans = run.serve(spec(ids((0, 64), (1000, 36))))  # the same first 64 tokens, then its own
    assert second.cached_tokens == 64
    assert (plans[0].prefill_tokens, plans[0].prefill_context) == (36, 64)  # 36 new tokens after 64 cached
    assert second.first_token - second.arrival == pytest.approx(36 * PREFILL_S_PER_TOKEN)
    # The first prompt's own blocks beyond the shared ones were cached too: its 6 full blocks hit.
    third, _ = run.serve(spec(ids((0, 100))))
    assert third.cached_tokens == 96


def test_the_partial_last_block_is_not_cached() -> None:
    run = Run(make())
    run.serve(spec(ids((0, 40))))  # two full blocks and 8 tokens
    again, plans = run.serve(spec(ids((0, 50))))  # the same 40 tokens and 10 more: block 3 was never full
    assert again.cached_tokens == 32 and plans[0].prefill_tokens == 18


def test_the_same_block_after_a_different_prefix_does_not_hit() -> None:
    run = Run(make())
    run.serve(spec(ids((0, 48))))
    other, plans = run.serve(spec(ids((500, 16), (16, 32))))  # blocks 2 and 3 equal, block 1 not
    assert other.cached_tokens == 0 and plans[0].prefill_tokens == 48


def test_a_prompt_cached_in_full_still_computes_its_last_token() -> None:
    run = Run(make())
    run.serve(spec(ids((0, 32))))
    aligned, plans = run.serve(spec(ids((0, 32))))
    # At most 31 tokens may hit, in whole blocks: the last block is recomputed (vLLM does the same).
    assert aligned.cached_tokens == 16 and plans[0].prefill_tokens == 16
    run.serve(spec(ids((0, 48))))
    longer, plans = run.serve(spec(ids((0, 33))))
    assert longer.cached_tokens == 32 and plans[0].prefill_tokens == 1
    assert longer.output_tokens == 1


def test_a_chunks_blocks_are_cached_once_it_is_scheduled() -> None:
    scheduler = make(max_num_batched_tokens=64)
    run = Run(scheduler)
    run.add(spec(ids((0, 100)), rid="a"))
    plan, _ = scheduler.step(0.0)  # a's first chunk, 64 tokens: its four blocks are cached at once
    run.now = scheduler.step_duration(plan)
    assert scheduler.kv.cached == 4
    run.add(spec(ids((0, 100)), rid="b"))
    run.until_idle()
    # The next step schedules a's last 36 tokens first, then admits b, which finds all six full blocks
    # (as in vLLM: blocks are cached when scheduled, and their KV is written before attention reads it).
    assert run.records["b"].cached_tokens == 96


def test_counters_are_in_tokens_at_admission() -> None:
    run = Run(make())
    run.serve(spec(ids((0, 100))))
    run.serve(spec(ids((0, 64), (1000, 10))))
    run.serve(spec(ids((7000, 5))))
    snap = run.scheduler.snapshot()
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits) == (100 + 74 + 5, 64)
    assert snap.prefix_caching


def test_a_preempted_requests_readmission_is_counted_apart() -> None:
    # 6 blocks: a and b (47 tokens, 3 blocks each) fill them; a's decode into a fourth block preempts b,
    # the newest. b comes back once a is done and hits its own two full blocks, still cached.
    run = Run(make(capacity=6 * BS))
    run.add(spec(ids((0, 47)), max_tokens=10, rid="a"))
    run.add(spec(ids((5000, 47)), max_tokens=20, rid="b"))
    run.until_idle()
    snap = run.scheduler.snapshot()
    assert run.records["b"].preemptions >= 1
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits) == (47 + 47, 0)
    assert snap.preempted_prefix_cache_queries > 0 and snap.preempted_prefix_cache_hits > 0


def test_unreferenced_cached_blocks_count_as_free_for_admission_and_are_evicted_oldest_first() -> None:
    run = Run(make(capacity=8 * BS))
    a, b = ids((0, 64)), ids((1000, 64))
    run.serve(spec(a))  # 4 blocks, cached and free once it finishes
    run.serve(spec(b))  # 4 more: the cache is full of unreferenced blocks
    kv = run.scheduler.kv
    assert (run.scheduler.snapshot().kv_blocks_used, kv.cached) == (0, 8)
    # A new 48-token prompt needs 3 blocks: admitted at once, it evicts the least recently freed, a's,
    # tail first (a request's blocks are freed last block first).
    fresh, _ = run.serve(spec(ids((2000, 48))))
    assert fresh.cached_tokens == 0 and kv.evictions == 3
    assert len(kv.longest_hit(kvcache.block_hashes(a, BS))) == 1  # a keeps its first block
    assert len(kv.longest_hit(kvcache.block_hashes(b, BS))) == 4  # b, freed later, is intact


def test_blocks_a_running_request_references_survive_memory_pressure() -> None:
    scheduler = make(capacity=8 * BS)
    run = Run(scheduler)
    old, long = ids((1000, 64)), ids((0, 64))
    run.serve(spec(old))  # 4 cached, unreferenced blocks
    run.add(spec(long, max_tokens=30, rid="long"))  # takes the 4 empty blocks
    plan, _ = scheduler.step(run.now)
    run.now += scheduler.step_duration(plan)
    # Next step: long's decode takes a fifth block, and a 48-token prompt the last three: all of old's.
    run.add(spec(ids((2000, 48)), rid="pressure"))
    plan = scheduler.schedule(run.now)  # the step planned, not yet over: pressure still holds its blocks
    assert "pressure" in plan.admitted and scheduler.kv.free == 0 and scheduler.kv.evictions == 4
    assert scheduler.kv.longest_hit(kvcache.block_hashes(old, BS)) == []
    assert len(scheduler.kv.longest_hit(kvcache.block_hashes(long, BS))) == 4  # referenced: never evicted
    assert scheduler.phase("long") is scheduler_mod.Phase.DECODE


def test_a_prefix_another_request_holds_costs_a_sharer_no_blocks() -> None:
    scheduler = make(capacity=5 * BS)
    run = Run(scheduler)
    run.add(spec(ids((0, 64)), mode=scheduler_mod.Mode.PREFILL_ONLY, rid="held"))
    run.until_idle()  # its 4 blocks stay referenced until a decode worker pulls them
    assert scheduler.kv.free == 1
    # 64 tokens need 4 blocks; 3 are held's (referenced, so taking them frees nothing): 1 new one fits.
    sharer, _ = run.serve(spec(ids((0, 48), (3000, 16)), rid="sharer"))
    assert sharer.cached_tokens == 48 and scheduler.snapshot().held == 1


def test_prefill_is_shorter_with_a_hit_under_the_performance_model() -> None:
    timing = sim_cli.timing_model("llama-3.1-8b", "h200-sxm", tensor_parallel=1, pipeline_parallel=1)
    scheduler = scheduler_mod.Scheduler(timing, scheduler_mod.SchedulerConfig(request_overhead_s=0.0))
    run = Run(scheduler)
    prompt = ids((0, 4096))
    cold, cold_plans = run.serve(spec(prompt, rid="cold"))
    warm, warm_plans = run.serve(spec(prompt[:4000] + ids((90_000, 96)), rid="warm"))
    assert warm.cached_tokens == 4000 - 4000 % BS
    cold_ttft, warm_ttft = cold.first_token - cold.arrival, warm.first_token - warm.arrival
    assert warm_ttft < cold_ttft / 5
    # Priced honestly: the new tokens attend over the cached context, dearer than the same tokens alone.
    new = warm_plans[0].prefill_tokens
    assert warm_plans[0].prefill_context == warm.cached_tokens
    assert warm_ttft > timing.prefill_time(new, 0)
    assert warm_ttft == pytest.approx(timing.prefill_time(new, warm.cached_tokens))
    assert cold_plans[0].prefill_context == 0


def test_with_prefix_caching_off_nothing_hits_and_nothing_is_counted() -> None:
    run = Run(make(enable_prefix_caching=False))
    run.serve(spec(ids((0, 100))))
    again, plans = run.serve(spec(ids((0, 100))))
    assert again.cached_tokens == 0 and plans[0].prefill_tokens == 100
    snap = run.scheduler.snapshot()
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits, snap.prefix_caching) == (0, 0, False)


def test_requests_without_token_ids_take_no_part() -> None:
    run = Run(make())
    for _ in range(2):
        run.serve(scheduler_mod.RequestSpec(100, 1))
    snap = run.scheduler.snapshot()
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits, run.scheduler.kv.cached) == (0, 0, 0)


def test_disaggregated_prefill_caches_and_the_decode_side_receives_the_whole_prompt() -> None:
    prefill = Run(make())
    prompt = ids((0, 160))
    first = prefill.add(spec(prompt, mode=scheduler_mod.Mode.PREFILL_ONLY))
    prefill.until_idle()
    assert prefill.scheduler.release_after(first, 0.0, prefill.now)
    prefill.scheduler.advance(prefill.now)  # pulled: the blocks are free, and still cached
    assert prefill.scheduler.snapshot().kv_blocks_used == 0
    second, plans = prefill.serve(spec(prompt, mode=scheduler_mod.Mode.PREFILL_ONLY))
    assert second.cached_tokens == 144 and plans[0].prefill_tokens == 16

    decode = Run(make())
    for _ in range(2):
        record, _ = decode.serve(spec(prompt, max_tokens=3, mode=scheduler_mod.Mode.REMOTE_PREFILL))
        # The first token waits for the transfer of all 160 tokens' KV, then one decode step.
        assert record.first_token - record.arrival > 160 * 1e-6
        assert record.cached_tokens == 0
    snap = decode.scheduler.snapshot()
    assert (snap.prefix_cache_queries, decode.scheduler.kv.cached) == (0, 0)


def test_the_flag_mirrors_vllms_and_is_on_by_default() -> None:
    parser = argparse.ArgumentParser()
    sim_cli.add_parser(parser.add_subparsers())
    assert parser.parse_args(["sim", "worker", "--model", "m"]).enable_prefix_caching is True
    off = parser.parse_args(["sim", "worker", "--model", "m", "--no-enable-prefix-caching"])
    assert off.enable_prefix_caching is False
    assert scheduler_mod.SchedulerConfig().enable_prefix_caching


# -- token ids and replayed prompts ------------------------------------------------------------------------


def test_prompts_that_share_leading_words_share_leading_token_ids() -> None:
    a = server.text_token_ids("the quick brown fox jumps", 1.0)
    b = server.text_token_ids("the quick brown cat", 1.0)
    assert len(a) == 5 and a[:3] == b[:3] and a[3] != b[3]
    assert server.text_token_ids("the quick brown fox", 1.0) == server.text_token_ids("the  quick\nbrown fox", 1.0)
    for tokens_per_word in (0.5, 1.3, 2.0):
        long = server.text_token_ids("one two three four five six", tokens_per_word)
        short = server.text_token_ids("one two three four", tokens_per_word)
        assert len(long) == server.count_text_tokens("one two three four five six", tokens_per_word)
        shared = int(3 * tokens_per_word)  # tokens made of the first three words only
        assert long[:shared] == short[:shared]
    assert all(0 <= i < server.TOKEN_ID_SPACE for i in a)


def test_replayed_mooncake_prompts_that_share_hash_ids_hit_the_cache() -> None:
    first = traces.Request(0.0, 1200, 1, hash_ids=(11, 12, 13))
    second = traces.Request(0.0, 1100, 1, hash_ids=(11, 12, 99))
    a = server.text_token_ids(prompts.build_prompt(first, salt=0), 1.0)
    b = server.text_token_ids(prompts.build_prompt(second, salt=1), 1.0)
    assert a[:1024] == b[:1024] and a[1024:1100] != b[1024:1100]
    run = Run(make())
    run.serve(spec(tuple(a)))
    record, _ = run.serve(spec(tuple(b)))
    assert record.cached_tokens == 1024  # two Mooncake blocks of 512 tokens: 64 simulator blocks


# -- over HTTP ------------------------------------------------------------------------------------------


def _samples(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_worker_exports_vllms_prefix_cache_counters_and_reuses_a_shared_prompt() -> None:
    prompt = " ".join(f"w{i}" for i in range(100))
    with worker() as w:
        for _ in range(2):
            answer = httpx.post(w.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1},
                                timeout=10)
            assert answer.status_code == 200
        chat = {"messages": [{"role": "user", "content": prompt}]}
        tokenized = httpx.post(w.url + "/tokenize", json={"model": MODEL, "prompt": prompt}, timeout=5).json()
        assert tokenized["tokens"] == httpx.post(w.url + "/tokenize", json=chat, timeout=5).json()["tokens"]
        samples = _samples(w.url)
    assert samples["vllm:prefix_cache_queries_total"] == 200
    assert samples["vllm:prefix_cache_hits_total"] == 96  # the second prompt's 6 full blocks
    assert samples["vllm:cache_config_info"] == 1.0


def test_the_cache_config_info_says_whether_prefix_caching_is_on() -> None:
    for enabled in (True, False):
        scheduler = make(enable_prefix_caching=enabled)
        exported = metrics.SimMetrics(model_name=MODEL, snapshot=scheduler.snapshot).exposition().decode()
        assert f'enable_prefix_caching="{enabled}"' in exported
        assert "vllm:prefix_cache_hits_total" in exported and "vllm:prefix_cache_queries_total" in exported
