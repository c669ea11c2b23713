"""The simulator's scheduler core (fleetpilot/sim/scheduler.py), step by step in simulated time,
against a fake timing model.

The fake's numbers are round so that every expected time is obvious: a prefill costs 1 ms per 100
tokens, a decode step 10 ms whatever the batch, a KV transfer 1 ms per 1,000 tokens. Nothing here
sleeps (the real-time loop is test_sim_engine.py's).
"""

from __future__ import annotations

import itertools
import random

import pytest
from sim_timing import DECODE_STEP_S, PREFILL_S_PER_TOKEN, TRANSFER_S_PER_TOKEN, FakeTiming

from fleetpilot.sim import kvcache
from fleetpilot.sim import scheduler as scheduler_mod


def make(capacity: int = 1_000_000, **config: float) -> scheduler_mod.Scheduler:
    return scheduler_mod.Scheduler(FakeTiming(capacity), scheduler_mod.SchedulerConfig(**config))  # type: ignore[arg-type]


def spec(
    prompt: int, max_tokens: int, mode: scheduler_mod.Mode = scheduler_mod.Mode.FULL, rid: str | None = None
) -> scheduler_mod.RequestSpec:
    return scheduler_mod.RequestSpec(prompt_tokens=prompt, max_tokens=max_tokens, mode=mode, request_id=rid)


class Run:
    """Drives a scheduler to quiescence in simulated time and keeps what came out."""

    def __init__(self, scheduler: scheduler_mod.Scheduler) -> None:
        self.scheduler = scheduler
        self.now = 0.0
        self.events: dict[str, list[scheduler_mod.TokenEvent]] = {}
        self.records: dict[str, scheduler_mod.RequestRecord] = {}
        self.plans: list[scheduler_mod.StepPlan] = []

    def step(self) -> scheduler_mod.StepPlan:
        plan, result = self.scheduler.step(self.now)
        if plan.empty:
            deadline = self.scheduler.next_deadline()
            assert deadline is not None and deadline > self.now, "stuck: nothing to run or wait for"
            self.now = deadline
            return plan
        self.plans.append(plan)
        self.now += self.scheduler.step_duration(plan)
        for event in result.events:
            self.events.setdefault(event.request_id, []).append(event)
        for record in result.finished:
            self.records[record.request_id] = record
        return plan

    def until_idle(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work():
                return
            self.step()
        raise AssertionError(f"not idle after {max_steps} steps")


def assert_complete(events: list[scheduler_mod.TokenEvent], max_tokens: int) -> None:
    assert [e.index for e in events] == list(range(max_tokens))
    assert [e.finish_reason for e in events] == [None] * (max_tokens - 1) + [scheduler_mod.FINISH_LENGTH]
    assert all(a.time <= b.time for a, b in itertools.pairwise(events))


# -- continuous batching ---------------------------------------------------------------------------


def test_admits_up_to_max_num_seqs_and_the_rest_wait() -> None:
    scheduler = make(max_num_seqs=4)
    ids = [scheduler.add(spec(10, 3), 0.0) for _ in range(6)]
    plan = scheduler.schedule(0.0)
    assert plan.admitted == tuple(ids[:4])
    snap = scheduler.snapshot()
    assert (snap.running, snap.waiting) == (4, 2)

    run = Run(scheduler)
    run.plans.append(plan)
    scheduler.complete(plan, scheduler.step_duration(plan))
    run.until_idle()
    assert max(len(p.tokens) for p in run.plans) == 4
    assert set(run.records) == set(ids)
    assert all(r.output_tokens == 3 for r in run.records.values())


def test_a_new_request_joins_a_running_batch_without_waiting_for_it_to_finish() -> None:
    scheduler = make()
    run = Run(scheduler)
    first = scheduler.add(spec(100, 50), 0.0)
    for _ in range(5):
        run.step()
    second = scheduler.add(spec(100, 5), run.now)
    run.until_idle()
    assert run.records[second].finished < run.records[first].finished
    assert run.records[second].scheduled == pytest.approx(run.records[second].arrival)


def test_a_lone_request_gets_its_first_token_after_its_prefill_then_one_per_decode_step() -> None:
    scheduler = make()
    rid = scheduler.add(spec(1000, 4), 0.0)
    run = Run(scheduler)
    run.until_idle()
    times = [e.time for e in run.events[rid]]
    assert times[0] == pytest.approx(1000 * PREFILL_S_PER_TOKEN)
    assert [b - a for a, b in itertools.pairwise(times)] == pytest.approx([DECODE_STEP_S] * 3)
    assert run.records[rid].inter_token_latencies == pytest.approx((DECODE_STEP_S,) * 3)


def test_chunked_prefill_splits_a_long_prompt_within_the_token_budget() -> None:
    scheduler = make(max_num_batched_tokens=512)
    rid = scheduler.add(spec(1300, 2), 0.0)
    run = Run(scheduler)
    chunks = []
    for _ in range(3):
        plan = run.step()
        chunks.append((plan.tokens[rid], plan.prefill_context))
        assert sum(plan.tokens.values()) <= 512
    assert chunks == [(512, 0), (512, 512), (276, 1024)]
    assert [e.index for e in run.events[rid]] == [0]  # the token comes only with the last chunk
    assert run.events[rid][0].time == pytest.approx(1300 * PREFILL_S_PER_TOKEN)


def test_several_chunks_in_one_step_are_priced_with_their_combined_attention_work() -> None:
    scheduler = make(max_num_batched_tokens=8192)
    run = Run(scheduler)
    long = scheduler.add(spec(12_288, 1), 0.0)
    run.step()  # the first 8,192 tokens of the long prompt
    short = scheduler.add(spec(4096, 1), run.now)
    plan = run.step()
    assert (plan.tokens[long], plan.tokens[short]) == (4096, 4096)
    # 4096 tokens after 8192 plus 4096 after none attend over as many pairs as 8192 tokens after 2048.
    assert (plan.prefill_tokens, plan.prefill_context) == (8192, 2048)


def test_decodes_take_their_token_first_and_prefill_gets_the_rest_of_the_budget() -> None:
    scheduler = make(max_num_batched_tokens=256)
    run = Run(scheduler)
    decoding = [scheduler.add(spec(8, 100), 0.0) for _ in range(6)]
    run.step()  # all six prefilled in one step
    long = scheduler.add(spec(1000, 1), run.now)
    plan = run.step()
    assert all(plan.tokens[rid] == 1 for rid in decoding)
    assert plan.tokens[long] == 250
    assert (plan.decode_batch, plan.prefill_tokens) == (6, 250)
    assert scheduler.step_duration(plan) == pytest.approx(250 * PREFILL_S_PER_TOKEN + DECODE_STEP_S)


def test_a_model_that_prices_mixed_steps_is_asked_for_them() -> None:
    class MixedTiming(FakeTiming):
        def mixed_step_time(self, *, prefill_tokens: int, prefill_context: int, decode_batch: int,
                            decode_context: int) -> float:
            return 0.123

    scheduler = scheduler_mod.Scheduler(MixedTiming(), scheduler_mod.SchedulerConfig())
    run = Run(scheduler)
    scheduler.add(spec(8, 10), 0.0)
    run.step()
    scheduler.add(spec(100, 1), run.now)
    plan = scheduler.schedule(run.now)
    assert scheduler.step_duration(plan) == 0.123


# -- KV cache ------------------------------------------------------------------------------------------


def test_requests_wait_while_the_kv_cache_is_full_and_run_when_it_frees() -> None:
    scheduler = make(capacity=64)  # four 16-token blocks
    first = scheduler.add(spec(40, 4), 0.0)  # three blocks
    second = scheduler.add(spec(40, 4), 0.0)  # needs three, one is free
    plan = scheduler.schedule(0.0)
    assert plan.admitted == (first,)
    snap = scheduler.snapshot()
    assert (snap.running, snap.waiting, snap.kv_blocks_used, snap.kv_blocks_total) == (1, 1, 3, 4)
    assert snap.kv_usage == pytest.approx(0.75)

    run = Run(scheduler)
    scheduler.complete(plan, scheduler.step_duration(plan))
    run.until_idle()
    admitted = run.records[second].scheduled
    assert admitted is not None and admitted >= run.records[first].finished
    assert run.records[first].preemptions == run.records[second].preemptions == 0
    assert scheduler.snapshot().kv_blocks_used == 0


def test_kv_exhaustion_during_decode_preempts_the_newest_which_resumes_and_finishes() -> None:
    scheduler = make(capacity=64)
    old = scheduler.add(spec(16, 40), 0.0)
    new = scheduler.add(spec(16, 40), 0.0)
    run = Run(scheduler)
    run.until_idle()

    assert scheduler.snapshot().preemptions >= 1
    assert run.records[old].preemptions == 0
    assert run.records[new].preemptions >= 1
    assert_complete(run.events[old], 40)
    assert_complete(run.events[new], 40)
    preempting = [p for p in run.plans if p.preempted]
    assert preempting and all(p.preempted == (new,) for p in preempting)
    assert all(not p.admitted for p in preempting)  # nothing is admitted in a step that preempted
    assert scheduler.snapshot().kv_blocks_used == 0


def test_a_resumed_request_recomputes_its_prompt_and_its_output_so_far() -> None:
    scheduler = make(capacity=64)
    scheduler.add(spec(16, 40), 0.0)
    new = scheduler.add(spec(16, 40), 0.0)
    run = Run(scheduler)
    for _ in range(1000):
        if any(p.preempted for p in run.plans):
            break
        run.step()
    produced = len(run.events[new])
    for _ in range(1000):
        plan = run.step()
        if new in plan.admitted:
            assert plan.tokens[new] == 16 + produced
            break
    else:
        raise AssertionError("the preempted request never came back")


def test_requests_that_could_never_fit_are_rejected_up_front() -> None:
    scheduler = make(capacity=64, max_model_len=100)
    with pytest.raises(scheduler_mod.RequestRejected, match="KV cache"):
        scheduler.add(spec(60, 10), 0.0)
    with pytest.raises(scheduler_mod.RequestRejected, match="maximum context length"):
        make(max_model_len=100).add(spec(60, 41), 0.0)
    with pytest.raises(scheduler_mod.RequestRejected):
        scheduler.add(spec(0, 10), 0.0)
    assert scheduler.add(spec(60, 5), 0.0)  # 64 resident tokens: exactly the cache


def test_the_block_pool_hands_out_distinct_blocks_and_takes_them_back() -> None:
    pool = kvcache.BlockPool(4)
    first = pool.allocate(3)
    assert first is not None and len(set(first)) == 3 and pool.free == 1
    assert pool.allocate(2) is None and pool.free == 1  # all or nothing
    pool.release(first)
    assert first == [] and pool.free == 4  # the caller's list is emptied: it holds no block any more


def test_kv_capacity_comes_from_the_config_or_else_the_timing_model_in_whole_blocks() -> None:
    assert make(capacity=1000).kv.total == 1000 // 16
    assert make(capacity=1000, kv_capacity_tokens=100, block_size=32).kv.total == 3


@pytest.mark.parametrize("config", [
    {"max_num_seqs": 0}, {"max_num_batched_tokens": 0}, {"block_size": 0}, {"max_model_len": 0},
    {"kv_capacity_tokens": 8, "block_size": 16}, {"kv_bandwidth_bytes_per_s": 0}, {"kv_hold_timeout_s": -1},
])
def test_impossible_limits_are_refused(config: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        scheduler_mod.SchedulerConfig(**config)  # type: ignore[arg-type]


# -- cancellation ------------------------------------------------------------------------------------


def test_cancelling_frees_the_kv_at_once_wherever_the_request_is() -> None:
    scheduler = make(capacity=64)
    run = Run(scheduler)
    running = scheduler.add(spec(40, 20), 0.0)
    waiting = scheduler.add(spec(40, 20), 0.0)
    run.step()
    assert scheduler.phase(running) is scheduler_mod.Phase.DECODE
    assert scheduler.phase(waiting) is scheduler_mod.Phase.WAITING

    record = scheduler.cancel(running, run.now)
    assert record is not None and record.finish_reason == scheduler_mod.FINISH_ABORT
    assert scheduler.snapshot().kv_blocks_used == 0
    assert scheduler.cancel(waiting, run.now) is not None
    assert scheduler.cancel(waiting, run.now) is None  # twice is harmless
    snap = scheduler.snapshot()
    assert (snap.running, snap.waiting, snap.finished) == (0, 0, {scheduler_mod.FINISH_ABORT: 2})
    assert not scheduler.has_work()


def test_a_request_cancelled_while_its_step_runs_gets_no_token() -> None:
    scheduler = make()
    rid = scheduler.add(spec(100, 5), 0.0)
    plan = scheduler.schedule(0.0)
    scheduler.cancel(rid, 0.0005)
    result = scheduler.complete(plan, scheduler.step_duration(plan))
    assert result.events == () and result.finished == ()
    assert scheduler.snapshot().kv_blocks_used == 0


# -- disaggregation ----------------------------------------------------------------------------------


def test_prefill_role_emits_one_token_and_holds_the_kv_until_released() -> None:
    scheduler = make(kv_hold_timeout_s=30.0)
    rid = scheduler.add(spec(100, 50, scheduler_mod.Mode.PREFILL_ONLY), 0.0)
    run = Run(scheduler)
    run.until_idle()
    (event,) = run.events[rid]
    assert event.finish_reason == scheduler_mod.FINISH_LENGTH
    assert len(event.kv_block_ids) == 7  # ceil(100 / 16)
    snap = scheduler.snapshot()
    assert (snap.running, snap.waiting, snap.held, snap.kv_blocks_used) == (0, 0, 1, 7)
    assert scheduler.next_deadline() == pytest.approx(run.now + 30.0)

    assert scheduler.release_after(rid, 0.005, run.now)
    scheduler.advance(run.now + 0.004)
    assert scheduler.snapshot().kv_blocks_used == 7
    scheduler.advance(run.now + 0.005)
    assert scheduler.snapshot().kv_blocks_used == 0
    assert scheduler.phase(rid) is None
    assert not scheduler.release_after(rid, 0.0, run.now)


def test_prefill_role_frees_unpulled_kv_after_the_hold_timeout() -> None:
    scheduler = make(kv_hold_timeout_s=2.0)
    scheduler.add(spec(100, 1, scheduler_mod.Mode.PREFILL_ONLY), 0.0)
    run = Run(scheduler)
    run.until_idle()
    finished_at = run.now
    scheduler.advance(finished_at + 1.9)
    assert scheduler.snapshot().held == 1
    scheduler.advance(finished_at + 2.0)
    assert (scheduler.snapshot().held, scheduler.snapshot().kv_blocks_used) == (0, 0)


def test_decode_role_skips_prefill_first_token_after_transfer_plus_one_decode_step() -> None:
    prompt = 10_000  # a 100 ms prefill, a 10 ms transfer
    scheduler = make()
    remote = scheduler.add(spec(prompt, 3, scheduler_mod.Mode.REMOTE_PREFILL), 0.0)
    plan = scheduler.schedule(0.0)
    assert plan.empty and plan.admitted == (remote,)
    assert scheduler.phase(remote) is scheduler_mod.Phase.TRANSFERRING
    assert scheduler.snapshot().waiting == 1  # vLLM counts requests waiting for remote KV as waiting
    assert scheduler.snapshot().kv_blocks_used == prompt // 16

    run = Run(scheduler)
    run.until_idle()
    events = run.events[remote]
    assert_complete(events, 3)
    assert events[0].time == pytest.approx(prompt * TRANSFER_S_PER_TOKEN + DECODE_STEP_S)
    assert all(p.prefill_tokens == 0 for p in run.plans)
    assert run.records[remote].first_token is not None

    local = make()
    rid = local.add(spec(prompt, 3), 0.0)
    local_run = Run(local)
    local_run.until_idle()
    assert local_run.events[rid][0].time == pytest.approx(prompt * PREFILL_S_PER_TOKEN)


def test_a_preempted_remote_request_recomputes_locally_and_still_finishes() -> None:
    scheduler = make(capacity=64)
    old = scheduler.add(spec(16, 40), 0.0)
    remote = scheduler.add(spec(16, 40, scheduler_mod.Mode.REMOTE_PREFILL), 0.0)
    run = Run(scheduler)
    run.until_idle()
    assert run.records[remote].preemptions >= 1
    assert any(remote in p.tokens and p.prefill_tokens for p in run.plans)
    assert_complete(run.events[old], 40)
    assert_complete(run.events[remote], 40)


# -- conservation --------------------------------------------------------------------------------------


def test_every_request_finishes_or_is_cancelled_under_pressure() -> None:
    rng = random.Random(7)
    scheduler = make(capacity=1024, max_num_seqs=8, max_num_batched_tokens=128)
    run = Run(scheduler)
    submitted: dict[str, int] = {}
    cancelled: set[str] = set()
    for i in range(300):
        for _ in range(rng.randint(0, 2)):
            mode = rng.choice(list(scheduler_mod.Mode))
            max_tokens = 1 if mode is scheduler_mod.Mode.PREFILL_ONLY else rng.randint(1, 60)
            rid = scheduler.add(spec(rng.randint(1, 300), max_tokens, mode), run.now)
            submitted[rid] = max_tokens
        if i % 17 == 0 and submitted:
            victim = rng.choice(sorted(submitted))
            if scheduler.cancel(victim, run.now) is not None:
                cancelled.add(victim)
        if scheduler.has_work():
            run.step()
    run.until_idle()
    scheduler.advance(run.now + 60.0)  # hold timeouts of unpulled prefill-only requests

    assert set(run.records) | cancelled == set(submitted)
    assert not set(run.records) & cancelled
    for rid, record in run.records.items():
        assert_complete(run.events[rid], submitted[rid])
        assert record.output_tokens == submitted[rid]
    snap = scheduler.snapshot()
    assert snap.submitted == len(submitted)
    assert snap.finished == {scheduler_mod.FINISH_LENGTH: len(run.records), scheduler_mod.FINISH_ABORT: len(cancelled)}
    assert snap.generation_tokens >= sum(len(e) for e in run.events.values())
    assert (snap.running, snap.waiting, snap.held, snap.kv_blocks_used) == (0, 0, 0, 0)
    assert snap.preemptions > 0  # the workload did exercise preemption
