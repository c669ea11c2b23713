"""Leader election on a coordination.k8s.io/v1 Lease: of N replicas, only the one holding the Lease acts.

Sits beside the REST adapter, under the entry points: `fleetpilot operator run` and `fleetpilot
planner run` (with `--leader-elect`) wait in `LeaderElector.acquire` before they start to act, keep
the Lease with `LeaderElector.hold`, and hand it back with `LeaderElector.release` on SIGTERM.

The rules are those of client-go's leaderelection, as a pure function (`decide`) of what is in the
Lease, who we are and what time our own clock says:

- a Lease that is absent, released (no holder) or expired is taken; ours is renewed; anyone
  else's unexpired Lease is left alone;
- "expired" is judged by the candidate's own monotonic clock: the Lease has not changed for
  `leaseDurationSeconds` since we first saw its current content. The `renewTime` written by
  another machine is never compared with our wall clock, so clock skew between nodes does not
  matter, only clock rate does;
- writes are PUTs carrying the `resourceVersion` that was read: when two candidates race, the
  apiserver answers the loser 409 and it simply reads again;
- the leader counts itself leading until `renew_deadline_s` after it *sent* its last successful
  renew. The other candidate first saw that renew after it was committed, so it cannot take over
  before `lease_duration_s` after the send: the old leader has stopped acting
  `lease_duration_s - renew_deadline_s` earlier. A leader that misses its deadline, or finds
  someone else in the Lease, must stop acting at once (the entry points exit non-zero and let
  Kubernetes restart them, as client-go users do).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import enum
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from fleetpilot import kube as kube_mod

logger = logging.getLogger("fleetpilot.leader")

_MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # the Lease's MicroTime fields


@dataclasses.dataclass(frozen=True)
class Timing:
    """How long a Lease lasts, how long a leader keeps trying to renew it, and how often candidates look.

    The hand-over after a leader dies takes at most `lease_duration_s + retry_period_s` (the standby
    sees the last renew up to one retry period late); the defaults hand over within 10 s.
    """

    lease_duration_s: float = 8.0
    renew_deadline_s: float = 6.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration; got"
                             f" {self.retry_period_s}s, {self.renew_deadline_s}s, {self.lease_duration_s}s")


@dataclasses.dataclass(frozen=True)
class Lease:
    """The spec of a Lease, plus the resourceVersion it was read at (empty for one not yet created)."""

    holder: str = ""
    duration_s: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str = ""

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> Lease:
        spec = manifest.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str(manifest.get("metadata", {}).get("resourceVersion", "")),
        )

    def content(self) -> tuple[str, int, str | None, str | None, int, str]:
        """What changes with every write, renewals included (the resourceVersion, should two renewTimes tie)."""
        return (self.holder, self.duration_s, self.acquire_time, self.renew_time, self.transitions,
                self.resource_version)

    def manifest(self, *, name: str, namespace: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        spec: dict[str, Any] = {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_s,
                                "leaseTransitions": self.transitions}
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


@dataclasses.dataclass(frozen=True)
class Seen:
    """A candidate's memory of the Lease: its content, and when (own monotonic clock) that content first appeared."""

    content: tuple[str, int, str | None, str | None, int, str] | None
    since: float


def observe(seen: Seen | None, lease: Lease | None, *, now: float) -> Seen:
    """Remember when the Lease last changed; unchanged content keeps its first-seen time."""
    content = lease.content() if lease is not None else None
    if seen is not None and seen.content == content:
        return seen
    return Seen(content=content, since=now)


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: POST one naming us
    TAKE = "take"  # released or expired: PUT ourselves in, one more transition
    RENEW = "renew"  # ours: PUT a fresh renewTime
    WAIT = "wait"  # someone else's and still valid: look again later


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    lease: Lease | None = None  # what to write, for every action but WAIT
    wait_s: float = 0.0  # for WAIT: how long until the holder's Lease runs out, as far as we can tell


def microtime(wall: datetime.datetime) -> str:
    return wall.astimezone(datetime.UTC).strftime(_MICROTIME)


def decide(lease: Lease | None, seen: Seen, *, identity: str, now: float, wall: datetime.datetime,
           timing: Timing) -> Decision:
    """What a candidate does with the Lease it just read.

    `seen` is `observe(...)` of this very read; `now` is the monotonic clock, `wall` the time to
    stamp into the Lease (for people and kubectl; candidates never compare it with their clock).
    """
    stamp = microtime(wall)
    duration = max(1, round(timing.lease_duration_s))
    if lease is None:
        return Decision(Action.CREATE, Lease(holder=identity, duration_s=duration, acquire_time=stamp,
                                             renew_time=stamp))
    if lease.holder == identity:
        return Decision(Action.RENEW, dataclasses.replace(
            lease, duration_s=duration, renew_time=stamp, acquire_time=lease.acquire_time or stamp))
    left = seen.since + lease.duration_s - now
    if lease.holder and left > 0:
        return Decision(Action.WAIT, wait_s=left)
    return Decision(Action.TAKE, dataclasses.replace(
        lease, holder=identity, duration_s=duration, acquire_time=stamp, renew_time=stamp,
        transitions=lease.transitions + 1))


def released(lease: Lease, *, wall: datetime.datetime) -> Lease:
    """The Lease handed back on a clean shutdown: no holder, and a 1 s duration for any reader that ignores that."""
    stamp = microtime(wall)
    return dataclasses.replace(lease, holder="", duration_s=1, acquire_time=stamp, renew_time=stamp)


def still_leading(renewed_at: float | None, *, now: float, timing: Timing) -> bool:
    """A leader acts only while its last successful renew (sent at `renewed_at`) is within the renew deadline."""
    return renewed_at is not None and now - renewed_at < timing.renew_deadline_s


def default_identity() -> str:
    """$POD_NAME in a pod (the Downward API), else host-pid: unique per running replica."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def default_namespace() -> str:
    return os.environ.get("POD_NAMESPACE") or "default"


def _api_errors(*also: type[Exception]) -> tuple[type[Exception], ...]:
    """What a failed Lease call raises (and `also`). Imported on first use: every `fleetpilot` command
    builds its parser with this module's flags, and should not load the kubernetes package to do so."""
    import httpx

    from fleetpilot import kube as kube_mod

    return (kube_mod.ApiError, httpx.HTTPError, *also)


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep, or less when `stop` is set (then True).

    In the current task, never in a new one (hence not `wait_for`): kopf shares the event loop,
    takes every task made after its start for its own, and waits for them when it stops.
    """
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True


class LeadershipLost(Exception):
    """The renew deadline passed, or someone else holds the Lease: stop acting now."""


class LeaderElector:
    """One replica's side of the election, over KubeApi."""

    def __init__(self, kube: kube_mod.KubeApi, *, name: str, namespace: str, identity: str,
                 timing: Timing | None = None, on_change: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)) -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.timing = timing or Timing()
        self.on_change = on_change
        self._clock = clock
        self._wall = wall_clock
        self._seen: Seen | None = None
        self._lease: Lease | None = None  # as last read or written
        self._renewed_at: float | None = None
        self._wait_s = self.timing.retry_period_s

    @property
    def leading(self) -> bool:
        return still_leading(self._renewed_at, now=self._clock(), timing=self.timing)

    def _where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    async def _read(self) -> Lease | None:
        try:
            return Lease.from_manifest(await self.kube.get("Lease", self.namespace, self.name))
        except _api_errors() as error:
            if getattr(error, "not_found", False):
                return None
            raise

    async def try_once(self) -> bool:
        """Read the Lease and create, take, renew or leave it; True when we hold it afterwards."""
        lease = await self._read()
        now = self._clock()
        self._seen = observe(self._seen, lease, now=now)
        self._lease = lease
        decision = decide(lease, self._seen, identity=self.identity, now=now, wall=self._wall(), timing=self.timing)
        if decision.action is Action.WAIT:
            self._wait_s = decision.wait_s
            if self._renewed_at is not None:
                raise LeadershipLost(f"{self._where()} is now held by {lease.holder if lease else '?'}")
            return False
        assert decision.lease is not None
        manifest = decision.lease.manifest(name=self.name, namespace=self.namespace)
        sent_at = self._clock()  # the deadline counts from the send: the write commits after it
        try:
            written = await (self.kube.create(manifest) if decision.action is Action.CREATE
                             else self.kube.replace(manifest))
        except _api_errors() as error:
            if getattr(error, "conflict", False):  # another candidate wrote first (409 Conflict or AlreadyExists): read again
                self._wait_s = 0.0
                return False
            raise
        self._lease = Lease.from_manifest(written)
        self._seen = observe(self._seen, self._lease, now=self._clock())
        if self._renewed_at is None:
            logger.info("%s became the leader (%s, transitions %d)", self.identity, self._where(),
                        self._lease.transitions)
            if self.on_change is not None:
                self.on_change(True)
        self._renewed_at = sent_at
        self._wait_s = self.timing.retry_period_s
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until we hold the Lease (True) or `stop` is set (False)."""
        logger.info("%s is waiting to lead (%s)", self.identity, self._where())
        if self.on_change is not None:
            self.on_change(False)
        while not stop.is_set():
            try:
                async with asyncio.timeout(self.timing.retry_period_s * 2):
                    if await self.try_once():
                        return True
            except _api_errors(TimeoutError) as error:  # keep campaigning
                logger.warning("%s: could not read or write %s: %s", self.identity, self._where(), error)
                self._wait_s = self.timing.retry_period_s
            # Look again when the holder's Lease would run out, but at least every retry period.
            await _sleep(stop, min(self.timing.retry_period_s, max(self._wait_s, 0.05)))
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew every retry period until `stop` is set; raise LeadershipLost when the Lease slips away."""
        while not stop.is_set():
            if await _sleep(stop, self.timing.retry_period_s):
                return
            while True:
                assert self._renewed_at is not None
                left = self._renewed_at + self.timing.renew_deadline_s - self._clock()
                if left <= 0:
                    self._lost(f"could not renew {self._where()} within {self.timing.renew_deadline_s}s")
                try:
                    async with asyncio.timeout(left):
                        if await self.try_once():
                            break
                except LeadershipLost as error:
                    self._lost(str(error))
                except TimeoutError:
                    continue  # the deadline check above ends it
                except _api_errors() as error:  # retry until the deadline
                    logger.warning("%s: renewing %s failed: %s", self.identity, self._where(), error)
                if await _sleep(stop, min(0.5, self.timing.retry_period_s / 4)):
                    return

    def _lost(self, why: str) -> NoReturn:
        self._renewed_at = None
        logger.error("%s stopped leading: %s", self.identity, why)
        if self.on_change is not None:
            self.on_change(False)
        raise LeadershipLost(why)

    async def release(self) -> None:
        """Hand the Lease back (clean shutdown), so the next candidate takes it at once instead of after it expires."""
        if not self.leading or self._lease is None:
            return
        lease = released(self._lease, wall=self._wall())
        self._renewed_at = None
        if self.on_change is not None:
            self.on_change(False)
        try:
            async with asyncio.timeout(self.timing.retry_period_s):
                await self.kube.replace(lease.manifest(name=self.name, namespace=self.namespace))
            logger.info("%s released %s", self.identity, self._where())
        except _api_errors(TimeoutError) as error:  # then it simply expires
            logger.warning("%s could not release %s (it will expire): %s", self.identity, self._where(), error)


def add_arguments(parser: argparse.ArgumentParser, *, lease_name: str) -> None:
    """The --leader-elect flags, the same for every command that can run as several replicas."""
    group = parser.add_argument_group("leader election (run several replicas; only the Lease holder acts)")
    group.add_argument("--leader-elect", action="store_true",
                       help="act only while holding a coordination.k8s.io Lease (default: act at once, alone)")
    group.add_argument("--lease-name", default=lease_name, help=f"the Lease's name (default: {lease_name})")
    group.add_argument("--lease-namespace", default=None,
                       help="the Lease's namespace (default: $POD_NAMESPACE, else default)")
    defaults = Timing()
    group.add_argument("--lease-duration", type=float, default=defaults.lease_duration_s, metavar="SECONDS",
                       help="how long a standby waits after the leader's last renew before taking over"
                            f" (default: {defaults.lease_duration_s:g})")
    group.add_argument("--renew-deadline", type=float, default=defaults.renew_deadline_s, metavar="SECONDS",
                       help="how long the leader keeps acting without a successful renew"
                            f" (default: {defaults.renew_deadline_s:g})")
    group.add_argument("--retry-period", type=float, default=defaults.retry_period_s, metavar="SECONDS",
                       help=f"how often the Lease is renewed or looked at (default: {defaults.retry_period_s:g})")


def elector_from_args(kube: kube_mod.KubeApi, args: argparse.Namespace, *,
                      on_change: Callable[[bool], None] | None = None) -> LeaderElector:
    try:
        timing = Timing(lease_duration_s=args.lease_duration, renew_deadline_s=args.renew_deadline,
                        retry_period_s=args.retry_period)
    except ValueError as error:
        raise SystemExit(f"fleetpilot: {error}") from None
    return LeaderElector(kube, name=args.lease_name, namespace=args.lease_namespace or default_namespace(),
                         identity=default_identity(), timing=timing, on_change=on_change)


def exit_now(code: int = 1) -> NoReturn:
    """Leave at once, skipping every cleanup that could still write: the process lost its Lease."""
    logging.shutdown()
    os._exit(code)
