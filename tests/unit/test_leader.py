"""Leader election's rules (fleetpilot.leader) on a fake clock, and the elector over a fake Lease store."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from fleetpilot import kube, leader

TIMING = leader.Timing(lease_duration_s=8, renew_deadline_s=6, retry_period_s=2)
WALL = datetime.datetime(2025, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def lease(holder: str, *, transitions: int = 0, duration: int = 8, renewed: str = "2025-01-01T11:59:58.000000Z",
          rv: str = "7") -> leader.Lease:
    return leader.Lease(holder=holder, duration_s=duration, acquire_time="2025-01-01T11:00:00.000000Z",
                        renew_time=renewed, transitions=transitions, resource_version=rv)


def decide(current: leader.Lease | None, seen: leader.Seen, *, now: float, me: str = "me") -> leader.Decision:
    return leader.decide(current, seen, identity=me, now=now, wall=WALL, timing=TIMING)


def test_an_absent_lease_is_created_naming_us() -> None:
    decision = decide(None, leader.observe(None, None, now=100.0), now=100.0)
    assert decision.action is leader.Action.CREATE
    assert decision.lease == leader.Lease(holder="me", duration_s=8, acquire_time="2025-01-01T12:00:00.000000Z",
                                          renew_time="2025-01-01T12:00:00.000000Z", transitions=0)
    manifest = decision.lease.manifest(name="fleetpilot-operator", namespace="ops")
    assert "resourceVersion" not in manifest["metadata"]
    assert manifest["spec"]["holderIdentity"] == "me" and manifest["spec"]["leaseDurationSeconds"] == 8


def test_an_unexpired_foreign_lease_is_respected_until_it_stops_changing_for_its_duration() -> None:
    theirs = lease("other")
    seen = leader.observe(None, theirs, now=100.0)
    decision = decide(theirs, seen, now=100.0)
    assert decision.action is leader.Action.WAIT and decision.wait_s == 8.0
    # Unchanged for 7.9 s: still theirs. Our clock is all that counts, not their renewTime.
    seen = leader.observe(seen, theirs, now=107.9)
    assert decide(theirs, seen, now=107.9).action is leader.Action.WAIT
    # They renewed: the wait starts again from when we saw the renewal.
    renewed = lease("other", renewed="2025-01-01T11:59:59.000000Z", rv="8")
    seen = leader.observe(seen, renewed, now=107.95)
    assert seen.since == 107.95
    assert decide(renewed, seen, now=115.0).action is leader.Action.WAIT


def test_an_expired_lease_is_taken_over_with_one_more_transition() -> None:
    theirs = lease("other", transitions=3)
    seen = leader.observe(None, theirs, now=100.0)
    seen = leader.observe(seen, theirs, now=108.01)
    assert seen.since == 100.0
    decision = decide(theirs, seen, now=108.01)
    assert decision.action is leader.Action.TAKE
    assert decision.lease is not None
    assert decision.lease.holder == "me" and decision.lease.transitions == 4
    assert decision.lease.acquire_time == decision.lease.renew_time == "2025-01-01T12:00:00.000000Z"
    # The write is conditional on what we read.
    assert decision.lease.manifest(name="l", namespace="ns")["metadata"]["resourceVersion"] == "7"


def test_a_lease_with_a_stale_renew_time_is_not_taken_by_a_newcomer_at_once() -> None:
    # renewTime an hour old by our wall clock: a newcomer cannot tell skew from death, so it waits a duration.
    theirs = lease("other", renewed="2025-01-01T11:00:00.000000Z")
    seen = leader.observe(None, theirs, now=5.0)
    assert decide(theirs, seen, now=5.0).action is leader.Action.WAIT
    assert decide(theirs, seen, now=13.5).action is leader.Action.TAKE


def test_our_own_lease_is_renewed_without_a_transition() -> None:
    ours = lease("me", transitions=2)
    decision = decide(ours, leader.observe(None, ours, now=1.0), now=1.0)
    assert decision.action is leader.Action.RENEW
    assert decision.lease == leader.Lease(holder="me", duration_s=8, acquire_time="2025-01-01T11:00:00.000000Z",
                                          renew_time="2025-01-01T12:00:00.000000Z", transitions=2,
                                          resource_version="7")


def test_a_released_lease_is_taken_at_once() -> None:
    given_back = leader.released(lease("other", transitions=1), wall=WALL)
    assert given_back.holder == "" and given_back.duration_s == 1
    assert given_back.manifest(name="l", namespace="ns")["spec"]["holderIdentity"] == ""
    decision = decide(given_back, leader.observe(None, given_back, now=50.0), now=50.0)
    assert decision.action is leader.Action.TAKE
    assert decision.lease is not None and decision.lease.transitions == 2


def test_transitions_count_each_change_of_holder() -> None:
    current: leader.Lease | None = None
    now = 0.0
    for who in ("a", "b", "a"):
        now += 100.0  # long after the last holder stopped renewing
        seen = leader.observe(None, current, now=now - 10.0)
        decision = decide(current, seen, now=now, me=who)
        assert decision.lease is not None
        current = decision.lease
    assert current is not None and current.holder == "a" and current.transitions == 2


def test_a_leader_acts_only_within_the_renew_deadline_of_its_last_renew() -> None:
    assert not leader.still_leading(None, now=0.0, timing=TIMING)
    assert leader.still_leading(10.0, now=15.9, timing=TIMING)
    assert not leader.still_leading(10.0, now=16.0, timing=TIMING)


def test_timing_must_leave_the_leader_time_to_stop_before_a_standby_starts() -> None:
    with pytest.raises(ValueError):
        leader.Timing(lease_duration_s=6, renew_deadline_s=6, retry_period_s=2)
    with pytest.raises(ValueError):
        leader.Timing(lease_duration_s=8, renew_deadline_s=2, retry_period_s=2)


def test_lease_round_trips_through_its_manifest() -> None:
    original = lease("me", transitions=5)
    manifest = original.manifest(name="l", namespace="ns")
    assert leader.Lease.from_manifest(manifest) == original
    assert leader.Lease.from_manifest({"metadata": {"resourceVersion": "1"}, "spec": {}}) == leader.Lease(
        resource_version="1")


# -- the elector over a fake apiserver ------------------------------------------------------------------


class FakeLeases:
    """One Lease with resourceVersion checks, standing in for KubeApi's get/create/replace."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.version = 0
        self.fail = False

    def _check(self) -> None:
        if self.fail:
            raise kube.ApiError(503, "apiserver unavailable")

    def _store(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.stored = {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": str(self.version)}}
        return self.stored

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        self._check()
        if self.stored is None:
            raise kube.ApiError(404, "not found")
        return self.stored

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._check()
        if self.stored is not None:
            raise kube.ApiError(409, "already exists", "AlreadyExists")
        return self._store(manifest)

    async def replace(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._check()
        if self.stored is None or manifest["metadata"].get("resourceVersion") != self.stored["metadata"]["resourceVersion"]:
            raise kube.ApiError(409, "the object has been modified", "Conflict")
        return self._store(manifest)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(store: FakeLeases, clock: Clock, identity: str, changes: list[bool] | None = None) -> leader.LeaderElector:
    return leader.LeaderElector(store, name="l", namespace="ns", identity=identity, timing=TIMING,  # type: ignore[arg-type]
                                clock=clock, wall_clock=lambda: WALL,
                                on_change=None if changes is None else changes.append)


def test_two_electors_one_leads_the_other_takes_over_after_the_lease_expires() -> None:
    store, clock = FakeLeases(), Clock()
    changes: list[bool] = []
    a, b = elector(store, clock, "a", changes), elector(store, clock, "b")

    async def scenario() -> None:
        assert await a.try_once() and a.leading
        assert changes == [True]
        assert not await b.try_once() and not b.leading
        clock.now += 2
        assert await a.try_once()  # renew
        clock.now += 2
        assert not await b.try_once()  # saw the renewal: waits 8 s from now
        # a dies (stops renewing). 7.9 s later b still waits; after 8 s it takes over.
        clock.now += 7.9
        assert not await b.try_once()
        clock.now += 0.2
        assert await b.try_once() and b.leading
        assert store.stored is not None and store.stored["spec"]["leaseTransitions"] == 1
        # a comes back, finds b in the Lease: it has lost, and says so instead of writing.
        assert not a.leading
        with pytest.raises(leader.LeadershipLost):
            a._renewed_at = clock.now  # as if a had just renewed: a leader finding a stranger must stop
            await a.try_once()

    asyncio.run(scenario())


def test_two_candidates_racing_for_an_expired_lease_one_wins_the_other_reads_again() -> None:
    store, clock = FakeLeases(), Clock()
    store.stored = {**lease("dead").manifest(name="l", namespace="ns")}
    read = leader.Lease.from_manifest(store.stored)
    seen = leader.observe(None, read, now=0.0)
    takes = [leader.decide(read, seen, identity=who, now=9.0, wall=WALL, timing=TIMING) for who in ("a", "b")]
    assert all(t.action is leader.Action.TAKE and t.lease is not None for t in takes)

    async def scenario() -> None:
        await store.replace(takes[0].lease.manifest(name="l", namespace="ns"))  # type: ignore[union-attr]
        with pytest.raises(kube.ApiError) as refused:
            await store.replace(takes[1].lease.manifest(name="l", namespace="ns"))  # type: ignore[union-attr]
        assert refused.value.conflict
        # The elector treats a 409 as "someone else wrote first": not leading, no error, look again soon.
        b = elector(store, clock, "b")
        real_replace = store.replace

        async def beaten(manifest: dict[str, Any]) -> dict[str, Any]:
            raise kube.ApiError(409, "the object has been modified", "Conflict")

        store.stored["spec"]["holderIdentity"] = ""  # type: ignore[index]
        store.replace = beaten  # type: ignore[method-assign]
        assert not await b.try_once() and not b.leading
        store.replace = real_replace  # type: ignore[method-assign]
        assert await b.try_once() and b.leading

    asyncio.run(scenario())


def test_a_leader_that_cannot_renew_stops_at_the_deadline() -> None:
    store, clock = FakeLeases(), Clock()
    changes: list[bool] = []
    a = elector(store, clock, "a", changes)

    async def scenario() -> None:
        assert await a.try_once()
        store.fail = True
        clock.now += 5.9
        assert a.leading
        clock.now += 0.1
        assert not a.leading  # the renew deadline passed: callers' may_act checks now say no

    asyncio.run(scenario())


def test_hold_raises_when_renewals_fail_past_the_deadline_and_release_hands_the_lease_back() -> None:
    store = FakeLeases()
    timing = leader.Timing(lease_duration_s=0.4, renew_deadline_s=0.3, retry_period_s=0.05)
    changes: list[bool] = []
    a = leader.LeaderElector(store, name="l", namespace="ns", identity="a", timing=timing,  # type: ignore[arg-type]
                             on_change=changes.append)
    b = leader.LeaderElector(store, name="l", namespace="ns", identity="b", timing=timing)  # type: ignore[arg-type]

    async def scenario() -> None:
        stop = asyncio.Event()
        assert await a.acquire(stop)
        await a.release()
        assert store.stored is not None and store.stored["spec"]["holderIdentity"] == ""
        assert store.stored["spec"]["leaseDurationSeconds"] == 1
        assert changes == [False, True, False]
        assert await asyncio.wait_for(b.acquire(stop), 1.0)  # at once: released, not expired
        store.fail = True
        with pytest.raises(leader.LeadershipLost):
            await asyncio.wait_for(b.hold(stop), 2.0)
        assert not b.leading

    asyncio.run(scenario())
