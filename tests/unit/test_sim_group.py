"""The simulator's multinode mode (fleetpilot/sim/group.py): a real TCP rendezvous on 127.0.0.1.

The in-process tests run a leader and its ranks in one event loop with a fast heartbeat; the last
test runs `fleetpilot sim worker` processes as a pod would: the leader answers /health only once its
rank has joined, serves, and fails health when the rank is killed; a rank refused by it exits 1.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from sim_timing import FakeTiming

from fleetpilot.sim import engine, group, server
from fleetpilot.sim import scheduler as scheduler_mod

IDENTITY = group.Identity(nnodes=3, model="llama-70b")
FAST = {"heartbeat_s": 0.05, "timeout_s": 2.0}  # silence long enough that a loaded machine never trips it


def test_a_rank_is_admitted_once_and_only_into_its_own_group() -> None:
    assert group.check_hello({"rank": 1, "nnodes": 3, "model": "llama-70b"}, IDENTITY, set()) == (1, "")
    assert group.check_hello({"rank": 1, "nnodes": 3, "model": "llama-70b"}, IDENTITY, {1})[1] == \
        "rank 1 has already joined"
    assert "rank must be 1 to 2" in group.check_hello({"rank": 3, "nnodes": 3, "model": "llama-70b"}, IDENTITY,
                                                      set())[1]
    assert "group mismatch" in group.check_hello({"rank": 1, "nnodes": 2, "model": "llama-70b"}, IDENTITY, set())[1]
    assert "group mismatch" in group.check_hello({"rank": 1, "nnodes": 3, "model": "other"}, IDENTITY, set())[1]
    assert group.check_hello(["rank", 1], IDENTITY, set())[0] is None


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_leader_serves_only_while_every_rank_is_joined() -> None:
    async def scenario() -> None:
        sim = engine.Engine(scheduler_mod.Scheduler(FakeTiming(), scheduler_mod.SchedulerConfig()), speedup=100)
        leader = server.leader_group(IDENTITY, sim, host="127.0.0.1", port=0, **FAST)
        await leader.start()
        ranks = [group.GroupMember(IDENTITY, rank=r, leader_host="127.0.0.1", leader_port=leader.port, **FAST)
                 for r in (1, 2)]
        first = asyncio.create_task(ranks[0].run())
        await _until(lambda: ranks[0].joined)
        assert not sim.running and "2 of 3 ranks have joined" in leader.status
        # A rank claiming a taken rank, or another group's, is refused and the group is unharmed.
        impostor = group.GroupMember(group.Identity(3, "other"), rank=2, leader_host="127.0.0.1",
                                     leader_port=leader.port, **FAST)
        assert "refused rank 2: group mismatch" in await impostor.run()
        second = asyncio.create_task(ranks[1].run())
        await _until(lambda: sim.running)
        assert leader.complete and leader.broken is None
        stream = sim.submit(scheduler_mod.RequestSpec(10, 1000, scheduler_mod.Mode.FULL, "r1"))

        # Rank 2 goes: the group is broken for good, the engine stops and what it ran fails.
        second.cancel()
        await _until(lambda: leader.broken is not None)
        assert not sim.running and "rank 2 is gone" in leader.status
        try:
            async for _ in stream:
                pass
            raise AssertionError("the stream finished on a broken group")
        except engine.EngineStopped:
            pass
        late = group.GroupMember(IDENTITY, rank=2, leader_host="127.0.0.1", leader_port=leader.port, **FAST)
        assert "the group is broken" in await late.run()  # no rank re-joins a broken group

        await leader.stop()
        assert await asyncio.wait_for(first, 5) == "the leader is gone (its connection closed or fell silent)"

    asyncio.run(scenario())


def test_a_rank_waits_for_a_leader_that_is_not_up_yet() -> None:
    async def scenario() -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        two = group.Identity(2, "m")
        rank = group.GroupMember(two, rank=1, leader_host="127.0.0.1", leader_port=port, **FAST)
        task = asyncio.create_task(rank.run())
        await asyncio.sleep(1.2)  # a few refused connections
        assert not rank.joined and not task.done()
        started: list[bool] = []

        async def complete() -> None:
            started.append(True)

        async def broken(reason: str) -> None:
            pass

        leader = group.GroupLeader(two, host="127.0.0.1", port=port, on_complete=complete, on_broken=broken, **FAST)
        await leader.start()
        await _until(lambda: rank.joined and started == [True])
        await leader.stop()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return 0


def _wait(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_worker_processes_form_a_group_and_break_it_when_a_rank_dies() -> None:
    fleetpilot = str(Path(sys.executable).parent / "fleetpilot")
    http, http_rank, rendezvous = _free_port(), _free_port(), _free_port()
    common = ["sim", "worker", "--model", "llama-70b", "--model-preset", "llama-3.1-70b", "--host", "127.0.0.1",
              "--tensor-parallel-size", "16", "--nnodes", "2", "--master-port", str(rendezvous),
              "--speedup", "50", "--log-level", "warning"]
    leader = subprocess.Popen([fleetpilot, *common, "--port", str(http), "--node-rank", "0"])
    rank = None
    try:
        url = f"http://127.0.0.1:{http}"
        _wait(lambda: _status(url + "/health") == 503, "the leader to listen, not yet healthy")
        answer = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
        assert answer.status_code == 503 and "1 of 2 ranks have joined" in answer.json()["error"]["message"]
        rank = subprocess.Popen([fleetpilot, *common, "--port", str(http_rank), "--node-rank", "1",
                                 "--master-addr", "127.0.0.1"])
        _wait(lambda: _status(url + "/health") == 200, "the group to form")
        assert _status(f"http://127.0.0.1:{http_rank}/health") == 200
        done = httpx.post(url + "/v1/completions", json={"prompt": "hello there", "max_tokens": 3}, timeout=10)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3

        rank.send_signal(signal.SIGKILL)
        rank.wait(10)
        _wait(lambda: _status(url + "/health") == 503, "the leader to fail health without its rank", timeout=15)
        broken = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
        assert broken.status_code == 503 and "the group is broken" in broken.json()["error"]["message"]

        # A new rank cannot mend a broken group: refused, it exits non-zero (as one whose leader
        # died does), so the pod restarts and the operator restarts the group whole.
        rank = subprocess.Popen([fleetpilot, *common, "--port", str(http_rank), "--node-rank", "1",
                                 "--master-addr", "127.0.0.1"])
        assert rank.wait(30) == 1
        assert _status(url + "/health") == 503
    finally:
        for process in (leader, rank):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)
