"""The fleet simulator: a disaggregated fleet serving a trace in simulated time, one request at a time.

Where it sits: the backtest driver (`driver`) advances it interval by interval, reads what a
Prometheus would have seen (`window`), hands that to a scaling policy (the real planner core among
them) and applies the replica targets the policy returns (`set_target`). Pure: no clock, no I/O; time
is a float the caller moves forward, so an hour of traffic runs in about a second.

What it models, and how (the `PerformanceModel` is the truth for every step time):

- **Arrivals** come from the trace. A request goes to the prefill replica with the fewest queued
  tokens, then (after its KV transfer) to the decode replica with the fewest sequences, as the
  frontend's least-loaded policy does. With no ready replica in a pool, requests wait at the frontend.
- **Prefill replicas** run FCFS chunked prefill: each step takes up to `max_batched_tokens` prompt
  tokens from the head of the queue, priced like the simulator engine prices a step of several chunks.
  This is exact step by step.
- **Decode replicas** batch continuously up to `max_num_seqs`, admitting FCFS while the KV cache holds
  the request's prompt and whole output (reserved at admission, so there is no preemption). Between
  events (an admission or a completion) the batch is fixed, so the replica's steps advance as a fluid
  at the step time of the batch (`decode_step_time(batch, context)`, re-evaluated at every event);
  a request's ITL is its decode time over its output tokens after the first. This is what makes an
  hour of decode (hundreds of thousands of steps) cost a few thousand events.
- **Replicas** take `startup_s` to become ready and cost GPUs from the moment they are asked for.
  Scaling down first cancels replicas still starting, then drains the emptiest ready ones: a draining
  replica takes no new work and stops (frees its GPUs) once its last request is done.
- **Conservation**: every arrival finishes, or is counted as failed (a request whose prompt and
  output cannot fit one decode replica's KV cache); `finish` runs the fleet until nothing is left.

TTFT is arrival → the first decode token (queueing, prefill, KV transfer, decode admission, one step)
plus the performance model's per-request overhead outside the engine: what a client of the two-hop
frontend sees.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np

from fleetpilot import perfmodel
from fleetpilot.api import contract
from fleetpilot.planner import lengths
from fleetpilot.traces import Request

FleetPool = Literal["prefill", "decode"]
FLEET_POOLS: tuple[FleetPool, ...] = ("prefill", "decode")


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """How the simulated fleet's replicas behave (one replica = `gpus` GPUs of `timing`)."""

    timing: perfmodel.PerformanceModel
    startup_s: float = 120.0
    gpus: Mapping[FleetPool, int] = dataclasses.field(default_factory=lambda: {"prefill": 1, "decode": 1})
    max_batched_tokens: int = 8192  # prefill tokens per step (vLLM's max_num_batched_tokens)
    max_num_seqs: int = 256  # decode batch cap (vLLM's default)
    kv_bandwidth_bytes_per_s: float = 50e9  # one rank's P→D link

    def __post_init__(self) -> None:
        if self.startup_s < 0:
            raise ValueError(f"startup_s must be ≥ 0, got {self.startup_s}")
        if self.max_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_batched_tokens and max_num_seqs must be ≥ 1")

    @property
    def kv_capacity_tokens(self) -> int:
        return self.timing.kv_capacity_tokens()


@dataclasses.dataclass(frozen=True)
class WindowStats:
    """What the frontend's and the engines' metrics say about one window of time.

    Latencies are of the requests whose first token (TTFT) or last token (ITL) came in the window,
    as histograms observed at those moments report them; None when no request got that far.
    """

    start: float
    end: float
    arrivals: int
    rate_rps: float
    isl_mean: float | None
    osl_mean: float | None
    ttft_p: float | None
    itl_p: float | None
    ttft_mean: float | None
    itl_mean: float | None
    prefill_busy: float  # share of the window the ready prefill replicas spent computing
    decode_kv_usage: float  # mean KV cache usage of the ready decode replicas
    ready: Mapping[FleetPool, int]
    active: Mapping[FleetPool, int]  # asked for: ready + starting (not draining)
    # The engines' gauges at the end of the window (what a reactive loop reads between intervals):
    prefill_queued_tokens: float = 0.0  # prompt tokens not yet prefilled, queued or waiting for a replica
    decode_waiting: float = 0.0  # prefilled requests waiting for a decode slot (KV or batch cap)
    decode_running: float = 0.0  # sequences decoding
    # TTFT's prefill part at the percentile: arrival until the prompt was prefilled (queueing and compute,
    # what the frontend's prefill hop takes), of the requests prefilled in the window; None: not known.
    prefill_p: float | None = None
    # The arrival rate over the trailing `contract.BURST_WINDOW_S` that the percentile's request saw
    # (request-weighted); None: not known.
    burst_rate_p: float | None = None
    # The window's prompt and output lengths as the frontend's histograms report them; None: no arrivals.
    isl_histogram: lengths.Histogram | None = None
    osl_histogram: lengths.Histogram | None = None


@dataclasses.dataclass
class _Record:
    """One request's life, filled in as it goes."""

    arrival: float
    isl: int
    osl: int
    prefilled: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    failed: bool = False


class _Replica:
    _ids = itertools.count()

    def __init__(self, pool: FleetPool, created: float, ready_at: float) -> None:
        self.id = next(self._ids)
        self.pool = pool
        self.created = created
        self.ready_at = ready_at
        self.stopped: float | None = None
        self.draining = False

    def idle(self) -> bool:
        raise NotImplementedError

    def is_ready(self, now: float) -> bool:
        return self.stopped is None and not self.draining and self.ready_at <= now


class _Prefill(_Replica):
    def __init__(self, created: float, ready_at: float) -> None:
        super().__init__("prefill", created, ready_at)
        self.queue: deque[list[int]] = deque()  # [request index, tokens still to prefill]
        self.queued_tokens = 0
        self.stepping = False

    def idle(self) -> bool:
        return not self.queue and not self.stepping


class _Decode(_Replica):
    def __init__(self, created: float, ready_at: float) -> None:
        super().__init__("decode", created, ready_at)
        self.waiting: deque[int] = deque()
        self.running: list[tuple[float, int]] = []  # heap of (step at which it finishes, request index)
        self.steps = 0.0  # decode steps done so far (a fluid between events)
        self.updated = 0.0  # when `steps` was last brought up to date
        self.step_s = 0.0  # step time of the current batch
        self.prompt_sum = 0  # Σ prompt tokens of the running batch
        self.start_sum = 0.0  # Σ `steps` at which each running request was admitted
        self.kv_used = 0
        self.kv_area = 0.0  # ∫ kv_used dt, for the mean KV usage
        self.version = 0  # bumps when the batch changes: older completion events are stale
        self.sequences = 0  # running + waiting: the load the frontend routes by

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def context(self) -> float:
        return self.prompt_sum + len(self.running) * self.steps - self.start_sum


_ARRIVAL, _PREFILL_STEP, _TRANSFERRED, _DECODE_DONE, _READY = range(5)
_ID = operator.attrgetter("id")
_PREFILL_LOAD = operator.attrgetter("queued_tokens")
_DECODE_LOAD = operator.attrgetter("sequences")


class FleetSimulator:
    """A prefill pool and a decode pool serving `requests` (sorted by arrival) from `initial` replicas."""

    def __init__(self, config: FleetConfig, requests: Sequence[Request], initial: Mapping[FleetPool, int]) -> None:
        self.config = config
        self.timing = config.timing
        self.kv_capacity = config.kv_capacity_tokens
        # HTTP, tokenising and returning the first token happen outside the engine's steps.
        self.overhead_s = config.timing.calibration.ttft_overhead_s
        self.records = [_Record(r.arrival_s, r.input_tokens, r.output_tokens) for r in requests]
        if any(b.arrival < a.arrival for a, b in itertools.pairwise(self.records)):
            raise ValueError("requests must be sorted by arrival time")
        self._arrival_times = np.array([r.arrival for r in self.records])
        self.now = 0.0
        self._next_arrival = 0
        self._events: list[tuple[float, int, int, object]] = []
        self._tie = itertools.count()
        self.replicas: dict[FleetPool, list[_Replica]] = {"prefill": [], "decode": []}
        self._pending: dict[FleetPool, deque[int]] = {"prefill": deque(), "decode": deque()}
        # Moments latencies became known, for windowed percentiles: (time, request index).
        self._first_tokens: list[tuple[float, int]] = []
        self._prefills: list[tuple[float, int]] = []
        self._finishes: list[tuple[float, int]] = []
        self._busy_starts: list[float] = []  # per prefill step, in time order: when it began,
        self._busy_seconds: list[float] = []  # and how long it computed
        self._longest_step = 0.0
        self._kv_checkpoints: dict[int, tuple[float, float]] = {}
        # The least-loaded pick, per pool, from the replicas that serve (in creation order) rather than
        # every replica ever made, each load an attribute compared in C: at rate ×16 the oracle's search
        # simulates hundreds of replicas, where a scan of them all calling methods was 85% of a run.
        self._serving: dict[FleetPool, list[_Replica]] = {"prefill": [], "decode": []}
        self._starting: dict[FleetPool, list[tuple[float, int, _Replica]]] = {"prefill": [], "decode": []}
        for pool in FLEET_POOLS:
            for _ in range(max(0, int(initial.get(pool, 0)))):
                self._add_replica(pool, ready_at=0.0)

    # -- the driver's interface -------------------------------------------------------------------------

    def run_until(self, until: float) -> None:
        """Process every arrival and event up to and including time `until`."""
        while True:
            arrival_t = (self.records[self._next_arrival].arrival
                         if self._next_arrival < len(self.records) else math.inf)
            event_t = self._events[0][0] if self._events else math.inf
            t = min(arrival_t, event_t)
            if t > until:
                break
            self.now = t
            if arrival_t <= event_t:
                index = self._next_arrival
                self._next_arrival += 1
                self._route_prefill(index)
            else:
                _, _, kind, payload = heapq.heappop(self._events)
                self._handle(kind, payload)
        self.now = max(self.now, until)

    def finish(self, *, limit_s: float = 7 * 86400.0) -> None:
        """Run until every request has finished (or failed); the replicas stay as they are."""
        self.run_until(self.records[-1].arrival if self.records else 0.0)
        deadline = self.now + limit_s
        while self._events and self._events[0][0] <= deadline:
            self.run_until(self._events[0][0])
        for pool in FLEET_POOLS:  # nothing can ever serve what is still pending
            for index in self._pending[pool]:
                self.records[index].failed = True
            self._pending[pool].clear()

    def set_target(self, pool: FleetPool, replicas: int) -> None:
        """Ask for `replicas` in `pool` (ready or starting): start new ones, or cancel / drain some."""
        replicas = max(0, replicas)
        active = [r for r in self.replicas[pool] if r.stopped is None and not r.draining]
        for _ in range(replicas - len(active)):
            self._add_replica(pool, ready_at=self.now + self.config.startup_s)
        surplus = len(active) - replicas
        if surplus <= 0:
            return
        starting = sorted((r for r in active if r.ready_at > self.now), key=lambda r: -r.ready_at)
        for replica in starting[:surplus]:
            replica.stopped = self.now  # cancelled before it ever served
        surplus -= min(surplus, len(starting))
        ready = sorted((r for r in active if r.ready_at <= self.now), key=self._load)
        for replica in ready[:surplus]:
            replica.draining = True
            if replica in self._serving[pool]:
                self._serving[pool].remove(replica)
            self._stop_if_drained(replica)

    def ready(self, pool: FleetPool) -> int:
        return sum(1 for r in self.replicas[pool] if r.is_ready(self.now))

    def active(self, pool: FleetPool) -> int:
        return sum(1 for r in self.replicas[pool] if r.stopped is None and not r.draining)

    def gpu_seconds(self, until: float) -> float:
        """GPU-seconds held by every replica, from being asked for to stopping (or `until`)."""
        total = 0.0
        for pool in FLEET_POOLS:
            gpus = self.config.gpus[pool]
            for r in self.replicas[pool]:
                end = r.stopped if r.stopped is not None else until
                total += max(0.0, min(end, until) - r.created) * gpus
        return total

    def window(self, start: float, end: float, *, percentile: float, gauges_only: bool = False) -> WindowStats:
        """What the metrics say about [start, end); call it once the simulation has reached `end`.
        `gauges_only`: no latencies, burst rate or length histograms (`driver.FleetModel.window`)."""
        arrivals = self._arrived_between(start, end)
        overhead = self.overhead_s
        none = np.zeros(0)
        ttfts = none if gauges_only else self._latencies(
            self._first_tokens, start, end, lambda r: r.first_token - r.arrival + overhead)
        prefills = none if gauges_only else self._latencies(
            self._prefills, start, end, lambda r: r.prefilled - r.arrival + overhead)
        itls = none if gauges_only else self._latencies(
            self._finishes, start, end, lambda r: (r.finish - r.first_token) / (r.osl - 1) if r.osl > 1 else None)
        length = max(end - start, 1e-9)
        ready = {pool: self.ready(pool) for pool in FLEET_POOLS}
        busy = self._busy_between(start, end)
        kv = self._mean_kv_usage(start, end)
        return WindowStats(
            start=start, end=end, arrivals=len(arrivals), rate_rps=len(arrivals) / length,
            isl_mean=float(np.mean([r.isl for r in arrivals])) if arrivals else None,
            osl_mean=float(np.mean([r.osl for r in arrivals])) if arrivals else None,
            ttft_p=float(np.percentile(ttfts, percentile)) if ttfts.size else None,
            itl_p=float(np.percentile(itls, percentile)) if itls.size else None,
            ttft_mean=float(ttfts.mean()) if ttfts.size else None,
            itl_mean=float(itls.mean()) if itls.size else None,
            prefill_busy=min(1.0, busy / (length * max(ready["prefill"], 1))),
            decode_kv_usage=kv,
            ready=ready,
            active={pool: self.active(pool) for pool in FLEET_POOLS},
            prefill_queued_tokens=float(
                sum(r.queued_tokens for r in self.replicas["prefill"] if isinstance(r, _Prefill) and r.stopped is None)
                + sum(self.records[i].isl for i in self._pending["prefill"])),
            decode_waiting=float(
                sum(len(r.waiting) for r in self.replicas["decode"] if isinstance(r, _Decode) and r.stopped is None)
                + len(self._pending["decode"])),
            decode_running=float(
                sum(len(r.running) for r in self.replicas["decode"] if isinstance(r, _Decode) and r.stopped is None)),
            prefill_p=float(np.percentile(prefills, percentile)) if prefills.size else None,
            burst_rate_p=None if gauges_only else self._burst_rate(start, end, percentile),
            isl_histogram=None if gauges_only else lengths.of_lengths([r.isl for r in arrivals]),
            osl_histogram=None if gauges_only else lengths.of_lengths([r.osl for r in arrivals]),
        )

    # -- results --------------------------------------------------------------------------------------

    def lone_ttft(self, isl: int, osl: int = 1) -> float:
        """A request's TTFT alone on idle replicas: prefill, KV transfer, one decode step (and overhead)."""
        return (self.overhead_s + lone_prefill_s(self.timing, isl, self.config.max_batched_tokens)
                + self.timing.kv_transfer_time(isl, self.config.kv_bandwidth_bytes_per_s)
                + self.timing.decode_step_time(1, isl))

    def lone_itl(self, isl: int, osl: int) -> float:
        """Its mean ITL alone: a batch of one at its mean context."""
        return self.timing.itl(1, isl + osl // 2) if osl > 1 else 0.0

    def outcomes(self) -> RequestOutcomes:
        """Every request's arrival, TTFT, ITL and lengths (NaN latencies for failed requests)."""
        arrival = np.array([r.arrival for r in self.records])
        first = np.array([r.first_token for r in self.records])
        finish = np.array([r.finish for r in self.records])
        osl = np.array([r.osl for r in self.records], dtype=float)
        itl = np.where(osl > 1, (finish - first) / np.maximum(osl - 1, 1), 0.0)
        failed = np.array([r.failed for r in self.records], dtype=bool)
        return RequestOutcomes(arrival=arrival, ttft=first - arrival + self.overhead_s, itl=np.where(failed, np.nan, itl),
                               failed=failed, isl=np.array([r.isl for r in self.records], dtype=float), osl=osl)

    # -- internals --------------------------------------------------------------------------------------

    def _arrived_between(self, start: float, end: float) -> list[_Record]:
        lo, hi = np.searchsorted(self._arrival_times, [start, end], side="left")
        return self.records[int(lo):int(hi)]

    def _latencies(self, log: list[tuple[float, int]], start: float, end: float,
                   latency: Callable[[_Record], float | None]) -> np.ndarray:
        """`latency` of each request logged within [start, end) (None: it has none, e.g. one output token)."""
        values = []
        for t, index in reversed(log):  # the log is in time order; recent windows are at its end
            if t < start:
                break
            if t >= end:
                continue
            value = latency(self.records[index])
            if value is not None:
                values.append(value)
        return np.array(values, dtype=float)

    def _burst_rate(self, start: float, end: float, percentile: float) -> float | None:
        """Each arrival's count of arrivals in the trailing burst window, per second, at the percentile."""
        lo, hi = np.searchsorted(self._arrival_times, [start, end], side="left")
        if hi <= lo:
            return None
        times = self._arrival_times[int(lo):int(hi)]
        since = np.searchsorted(self._arrival_times, times - contract.BURST_WINDOW_S, side="right")
        counts = np.arange(int(lo), int(hi)) - since + 1
        return float(np.percentile(counts, percentile)) / contract.BURST_WINDOW_S

    def _busy_between(self, start: float, end: float) -> float:
        """Prefill replica-seconds spent computing within [start, end): the overlap of every step with it.

        Steps are logged by their start, which never decreases, so a window only looks back from its
        end as far as the longest step: reactive loops ask for many short windows.
        """
        total = 0.0
        k = bisect.bisect_left(self._busy_starts, end) - 1
        while k >= 0 and self._busy_starts[k] + self._longest_step > start:
            began = self._busy_starts[k]
            total += max(0.0, min(began + self._busy_seconds[k], end) - max(began, start))
            k -= 1
        return total

    def _mean_kv_usage(self, start: float, end: float) -> float:
        ready = [r for r in self.replicas["decode"] if isinstance(r, _Decode) and r.is_ready(self.now)]
        if not ready:
            return 0.0
        usage = []
        for r in ready:
            self._account_kv(r)
            area_then, t_then = self._kv_checkpoints.get(r.id, (0.0, r.ready_at))
            span = self.now - max(t_then, start, r.ready_at)
            usage.append((r.kv_area - area_then) / span / self.kv_capacity if span > 0 else r.kv_used / self.kv_capacity)
            self._kv_checkpoints[r.id] = (r.kv_area, self.now)
        return float(np.mean(usage))

    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self._events, (t, next(self._tie), kind, payload))

    def _add_replica(self, pool: FleetPool, *, ready_at: float) -> None:
        replica: _Replica = _Prefill(self.now, ready_at) if pool == "prefill" else _Decode(self.now, ready_at)
        if isinstance(replica, _Decode):
            replica.updated = ready_at
        self.replicas[pool].append(replica)
        if ready_at > self.now:
            self._push(ready_at, _READY, replica)
            heapq.heappush(self._starting[pool], (ready_at, replica.id, replica))
        else:
            self._serving[pool].append(replica)

    def _load(self, replica: _Replica) -> float:
        if isinstance(replica, _Prefill):
            return replica.queued_tokens
        assert isinstance(replica, _Decode)
        return replica.sequences

    def _pick(self, pool: FleetPool) -> _Replica | None:
        """The ready replica with the least load, the oldest of equals."""
        serving, starting = self._serving[pool], self._starting[pool]
        while starting and starting[0][0] <= self.now:  # ready now, though its _READY event may not have run
            replica = heapq.heappop(starting)[2]
            if replica.stopped is None and not replica.draining:  # not cancelled nor drained meanwhile
                bisect.insort(serving, replica, key=_ID)
        return min(serving, key=_PREFILL_LOAD if pool == "prefill" else _DECODE_LOAD) if serving else None

    def _handle(self, kind: int, payload: object) -> None:
        if kind == _PREFILL_STEP:
            assert isinstance(payload, tuple)
            replica, done = payload
            self._prefill_step_done(replica, done)
        elif kind == _TRANSFERRED:
            assert isinstance(payload, int)
            self._route_decode(payload)
        elif kind == _DECODE_DONE:
            assert isinstance(payload, tuple)
            replica, version = payload
            if replica.version == version:
                self._decode_checkpoint(replica)
        elif kind == _READY:
            assert isinstance(payload, _Replica)
            if payload.stopped is None:
                self._replica_ready(payload)

    def _replica_ready(self, replica: _Replica) -> None:
        pending = self._pending[replica.pool]
        while pending:
            index = pending.popleft()
            if replica.pool == "prefill":
                self._route_prefill(index)
            else:
                self._route_decode(index)

    # prefill ------------------------------------------------------------------------------------------

    def _route_prefill(self, index: int) -> None:
        record = self.records[index]
        if record.isl + record.osl > self.kv_capacity:
            record.failed = True  # no decode replica could ever hold it
            return
        replica = self._pick("prefill")
        if replica is None:
            self._pending["prefill"].append(index)
            return
        assert isinstance(replica, _Prefill)
        replica.queue.append([index, record.isl])
        replica.queued_tokens += record.isl
        if not replica.stepping:
            self._prefill_step(replica)

    def _prefill_step(self, replica: _Prefill) -> None:
        budget = self.config.max_batched_tokens
        done: list[int] = []
        tokens = pairs2 = 0
        for item in replica.queue:
            if budget <= 0:
                break
            index, remaining = item
            computed = self.records[index].isl - remaining
            n = min(remaining, budget)
            item[1] -= n
            tokens += n
            pairs2 += n * (2 * computed + n + 1)
            budget -= n
        while replica.queue and replica.queue[0][1] == 0:
            done.append(replica.queue.popleft()[0])
        replica.queued_tokens -= tokens
        # Several chunks are priced as one chunk with the same attention work (as the engine does).
        context = max(0, (pairs2 - tokens * (tokens + 1)) // (2 * tokens)) if tokens else 0
        duration = self.timing.prefill_time(tokens, context)
        replica.stepping = True
        self._busy_starts.append(self.now)
        self._busy_seconds.append(duration)
        self._longest_step = max(self._longest_step, duration)
        self._push(self.now + duration, _PREFILL_STEP, (replica, done))

    def _prefill_step_done(self, replica: _Prefill, done: list[int]) -> None:
        replica.stepping = False
        for index in done:
            self.records[index].prefilled = self.now
            self._prefills.append((self.now, index))
            transfer = self.timing.kv_transfer_time(self.records[index].isl, self.config.kv_bandwidth_bytes_per_s)
            self._push(self.now + transfer, _TRANSFERRED, index)
        if replica.queue:
            self._prefill_step(replica)
        else:
            self._stop_if_drained(replica)

    # decode -------------------------------------------------------------------------------------------

    def _route_decode(self, index: int) -> None:
        replica = self._pick("decode")
        if replica is None:
            self._pending["decode"].append(index)
            return
        assert isinstance(replica, _Decode)
        self._bring_up_to_date(replica)
        replica.waiting.append(index)
        replica.sequences += 1
        self._admit(replica)
        self._reschedule(replica)

    def _account_kv(self, replica: _Decode) -> None:
        if self.now > replica.updated:
            replica.kv_area += replica.kv_used * (self.now - replica.updated)

    def _bring_up_to_date(self, replica: _Decode) -> None:
        """Advance the replica's fluid step count to now."""
        self._account_kv(replica)
        if self.now > replica.updated:
            if replica.running and replica.step_s > 0:
                replica.steps += (self.now - replica.updated) / replica.step_s
            replica.updated = self.now

    def _admit(self, replica: _Decode) -> None:
        while replica.waiting and len(replica.running) < self.config.max_num_seqs:
            record = self.records[replica.waiting[0]]
            need = record.isl + record.osl
            if replica.kv_used + need > self.kv_capacity:
                break  # FCFS: the head waits for KV, and so does everyone behind it
            index = replica.waiting.popleft()
            replica.kv_used += need
            heapq.heappush(replica.running, (replica.steps + record.osl, index))
            replica.prompt_sum += record.isl
            replica.start_sum += replica.steps
            # Its first token comes at the end of the first step, known once `_reschedule` prices it.

    def _reschedule(self, replica: _Decode) -> None:
        """Recompute the batch's step time and the next completion; stale events are ignored."""
        replica.version += 1
        batch = len(replica.running)
        if not batch:
            replica.step_s = 0.0
            self._stop_if_drained(replica)
            return
        replica.step_s = self.timing.decode_step_time(batch, int(replica.context()))
        for _, index in replica.running:
            record = self.records[index]
            if math.isnan(record.first_token):
                record.first_token = self.now + replica.step_s
                self._first_tokens.append((record.first_token, index))
        finish_step = replica.running[0][0]
        when = self.now + max(0.0, finish_step - replica.steps) * replica.step_s
        self._push(when, _DECODE_DONE, (replica, replica.version))

    def _decode_checkpoint(self, replica: _Decode) -> None:
        self._bring_up_to_date(replica)
        while replica.running and replica.running[0][0] <= replica.steps + 1e-9:
            finish_step, index = heapq.heappop(replica.running)
            record = self.records[index]
            record.finish = self.now
            self._finishes.append((self.now, index))
            replica.kv_used -= record.isl + record.osl
            replica.prompt_sum -= record.isl
            replica.start_sum -= finish_step - record.osl
            replica.sequences -= 1
        self._admit(replica)
        self._reschedule(replica)

    def _stop_if_drained(self, replica: _Replica) -> None:
        if replica.draining and replica.stopped is None and replica.idle():
            replica.stopped = self.now


def lone_prefill_s(timing: perfmodel.PerformanceModel, isl: int, budget: int) -> float:
    """A prompt's prefill alone on a replica, in chunks of `budget` tokens priced as `_prefill_step`
    prices them (each chunk pays the step's fixed costs and attends to the chunks before it): one
    shot at `timing.prefill_time(isl)` undercounts a long prompt by up to tens of milliseconds, enough
    to call a request servable that never meets its TTFT."""
    total, done = 0.0, 0
    while done < isl:
        n = min(budget, isl - done)
        total += timing.prefill_time(n, done)
        done += n
    return total


@dataclasses.dataclass(frozen=True)
class RequestOutcomes:
    """Per-request results of a run, as arrays (seconds; NaN where a request never got there)."""

    arrival: np.ndarray
    ttft: np.ndarray
    itl: np.ndarray
    failed: np.ndarray
    isl: np.ndarray
    osl: np.ndarray
