"""The simulator's multinode mode: a replica's ranks meet at the leader over a real TCP rendezvous.

Where it sits: beside `server`. A multinode replica is a group of pods; the leader (rank 0) serves
HTTP, the other ranks only hold their share of the model. The simulator imitates what matters to
the control plane, as torch.distributed's rendezvous and NCCL make real engines behave:

- the leader listens on `--master-port`; each rank connects, says who it is (rank, group size,
  model) and is admitted once; the leader starts its engine, and so answers /health, only when all
  `nnodes − 1` ranks have joined;
- both sides send a heartbeat every second; a rank whose connection closes or falls silent for
  `timeout_s` breaks the group for good (a collective with a missing rank hangs; a new rank cannot
  join a formed group): the leader stops its engine (in-flight requests fail, /health turns 503)
  and a rank that lost its leader exits non-zero, so Kubernetes sees it and the operator restarts
  the group whole.

The wire format is one JSON object per line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("fleetpilot.sim")

HEARTBEAT_S = 1.0
TIMEOUT_S = 5.0
HELLO_TIMEOUT_S = 10.0
RETRY_S = 0.5


@dataclass(frozen=True)
class Identity:
    """What every rank of one group agrees on; a rank that disagrees is refused."""

    nnodes: int
    model: str

    def hello(self, rank: int) -> dict[str, Any]:
        return {"rank": rank, "nnodes": self.nnodes, "model": self.model}


def check_hello(hello: Any, identity: Identity, joined: set[int]) -> tuple[int | None, str]:
    """(the rank admitted, "") or (None, why it is refused)."""
    if not isinstance(hello, dict):
        return None, "expected a JSON object"
    rank = hello.get("rank")
    if hello.get("nnodes") != identity.nnodes or hello.get("model") != identity.model:
        return None, (f"group mismatch: rank says nnodes={hello.get('nnodes')} model={hello.get('model')!r}, "
                      f"leader has nnodes={identity.nnodes} model={identity.model!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank < identity.nnodes:
        return None, f"rank must be 1 to {identity.nnodes - 1}, got {rank!r}"
    if rank in joined:
        return None, f"rank {rank} has already joined"
    return rank, ""


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def _receive(reader: asyncio.StreamReader, timeout_s: float) -> Any:
    """The next message, or None when the peer closed or fell silent."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout_s)
    except (TimeoutError, ConnectionError):
        return None
    if not line:
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


async def _heartbeat(writer: asyncio.StreamWriter, every_s: float) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        while True:
            await _send(writer, {"heartbeat": True})
            await asyncio.sleep(every_s)


async def _hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, heartbeat_s: float,
                timeout_s: float) -> None:
    """Beat and listen until the peer closes the connection or falls silent for `timeout_s`."""
    beat = asyncio.create_task(_heartbeat(writer, heartbeat_s))
    try:
        while await _receive(reader, timeout_s) is not None:
            pass
    finally:
        beat.cancel()


class GroupLeader:
    """Rank 0: admits the other ranks, then watches them. `on_complete` runs once all have joined,
    `on_broken` once one is lost."""

    def __init__(self, identity: Identity, *, host: str, port: int,
                 on_complete: Callable[[], Awaitable[None]], on_broken: Callable[[str], Awaitable[None]],
                 heartbeat_s: float = HEARTBEAT_S, timeout_s: float = TIMEOUT_S) -> None:
        self.identity = identity
        self.host, self.port = host, port
        self.on_complete, self.on_broken = on_complete, on_broken
        self.heartbeat_s, self.timeout_s = heartbeat_s, timeout_s
        self.joined: set[int] = set()
        self.complete = False
        self.broken: str | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._stopping = False

    @property
    def status(self) -> str:
        if self.broken is not None:
            return f"the group is broken ({self.broken}): it must restart"
        if not self.complete:
            return f"waiting for the group: {len(self.joined) + 1} of {self.identity.nnodes} ranks have joined"
        return f"all {self.identity.nnodes} ranks have joined"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]  # the one bound, when asked for port 0
        logger.info("group leader: waiting for %d ranks on %s:%d", self.identity.nnodes - 1, self.host, self.port)

    async def stop(self) -> None:
        """Close the rendezvous and every rank's connection (they see their leader go)."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        # Not cancelled (asyncio's stream callback would log a cancelled handler): closed, they end.
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), self.timeout_s * 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        try:
            await self._peer(reader, writer)
        finally:
            if task is not None:
                self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()

    async def _peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await _receive(reader, HELLO_TIMEOUT_S)
        rank, refusal = check_hello(hello, self.identity, self.joined)
        if self.broken is not None or self.complete or rank is None:
            # A formed group admits nobody: a rank that left cannot come back into a collective.
            refusal = "the group is broken" if self.broken else refusal or "the group is already complete"
            logger.warning("group leader: refused a rank: %s", refusal)
            with contextlib.suppress(ConnectionError):
                await _send(writer, {"ok": False, "error": refusal})
            return
        self.joined.add(rank)
        await _send(writer, {"ok": True})
        logger.info("group leader: rank %d joined (%s)", rank, self.status)
        if len(self.joined) == self.identity.nnodes - 1:
            self.complete = True
            await self.on_complete()
        await _hold(reader, writer, heartbeat_s=self.heartbeat_s, timeout_s=self.timeout_s)
        await self._lose(f"rank {rank} is gone (its connection closed or fell silent)")

    async def _lose(self, reason: str) -> None:
        if self.broken is None and not self._stopping:
            self.broken = reason
            logger.error("group leader: %s; the group is broken", reason)
            await self.on_broken(reason)


class GroupMember:
    """A rank > 0: joins the leader (retrying until it answers), then holds the connection."""

    def __init__(self, identity: Identity, *, rank: int, leader_host: str, leader_port: int,
                 heartbeat_s: float = HEARTBEAT_S, timeout_s: float = TIMEOUT_S) -> None:
        self.identity, self.rank = identity, rank
        self.leader_host, self.leader_port = leader_host, leader_port
        self.heartbeat_s, self.timeout_s = heartbeat_s, timeout_s
        self.joined = False

    async def run(self) -> str:
        """Join, then hold on; returns why the group is over for this rank."""
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.leader_host, self.leader_port)
            except OSError as error:  # not up yet, or its name does not resolve yet
                logger.info("rank %d: leader %s:%d not reachable (%s); retrying", self.rank, self.leader_host,
                            self.leader_port, error)
                await asyncio.sleep(RETRY_S)
                continue
            break
        try:
            await _send(writer, self.identity.hello(self.rank))
            answer = await _receive(reader, HELLO_TIMEOUT_S)
            if not isinstance(answer, dict) or not answer.get("ok"):
                refusal = answer.get("error") if isinstance(answer, dict) else "no answer"
                return f"the leader refused rank {self.rank}: {refusal}"
            self.joined = True
            logger.info("rank %d joined the leader at %s:%d", self.rank, self.leader_host, self.leader_port)
            await _hold(reader, writer, heartbeat_s=self.heartbeat_s, timeout_s=self.timeout_s)
            return "the leader is gone (its connection closed or fell silent)"
        finally:
            self.joined = False
            writer.close()
