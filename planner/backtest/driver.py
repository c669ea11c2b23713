"""The backtest driver: a trace through a simulated fleet with a scaling policy in the loop.

Where it sits: the second driver of the planner core (the first is `live`). Every `interval_s` of
simulated time it reads what the metrics would have said about the last interval, asks the policy
for replicas and applies them to the fleet; at the end it scores the run. The fleet is either the
per-request simulator (`fleetsim`, exact batching, for hours of traffic) or the fluid model (`fluid`,
for weeks), both behind `FleetModel`. `run_shared` drives several graphs' fleets under one shared GPU
budget, granting each its share every interval from a `budget.BudgetLedger` as the live planner does.
Pure: plain data in, plain data out; plotting and files are the callers' business (`fleetpilot
planner backtest`, benchmarks/backtest.py).

Scores, per run:
- **SLA attainment**: the share of windows (default: the planning interval) in which the SLA held,
  i.e. the SLA percentile of TTFT and of ITL over the requests that arrived in the window were both
  under target. Windows with no request are left out. A failed request counts as missing both.
- **GPU-hours**: every replica from the moment it is asked for (startup included) until it stops.
- **Goodput per GPU-hour**: requests that met both targets, per GPU-hour.
- **Scaling actions**: decisions that changed a pool's target.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import budget as budget_mod
from fleetpilot.planner import predict
from fleetpilot.planner.backtest import fleetsim, policies, scores
from fleetpilot.planner.backtest.fleetsim import FLEET_POOLS, FleetPool, WindowStats
from fleetpilot.planner.capacity import fewest_near
from fleetpilot.traces import Request


class FleetModel(Protocol):
    """What the driver needs from a simulated fleet."""

    def run_until(self, until: float) -> None: ...

    @property
    def resolution_s(self) -> float:
        """The shortest span the model tells apart (0: any; the fluid model's step otherwise)."""
        ...

    def set_target(self, pool: FleetPool, replicas: int) -> None: ...

    def window(self, start: float, end: float, *, percentile: float, gauges_only: bool = False) -> WindowStats:
        """What the metrics say about [start, end). `gauges_only`: what a fast loop reads between
        decisions (the queues, the replicas, the mean lengths), leaving the latency percentiles, the
        burst rate and the length histograms None: they cost most of a fluid run's time, and no fast
        loop reads them."""
        ...

    def finish(self) -> None: ...

    def gpu_seconds(self, until: float) -> float: ...

    def failed(self) -> int:
        """Requests that could never be served (after `finish`)."""
        ...

    def sla_windows(self, window_s: float, sla: api.SlaTarget, *, duration_s: float) -> WindowScores: ...

    def request_scores(self, sla: api.SlaTarget, *, duration_s: float,
                       scored_from_s: float = 0.0) -> scores.RequestScores:
        """Request-level attainment of the requests that arrived from `scored_from_s` on (call after `finish`)."""
        ...


@dataclasses.dataclass(frozen=True)
class WindowScores:
    """Per window of a run: requests, their latency percentiles, and how many met both targets."""

    requests: np.ndarray
    ttft_p: np.ndarray
    itl_p: np.ndarray
    good: np.ndarray
    met: np.ndarray  # bool: the SLA held in the window (False for an empty one, which is left out)

    @property
    def attainment(self) -> float:
        counted = self.requests > 0
        return float(self.met[counted].mean()) if counted.any() else 1.0

    def since(self, first: int) -> WindowScores:
        """The windows from index `first` on (a run's scored span)."""
        return WindowScores(requests=self.requests[first:], ttft_p=self.ttft_p[first:], itl_p=self.itl_p[first:],
                            good=self.good[first:], met=self.met[first:])


def score_requests(outcomes: fleetsim.RequestOutcomes, window_s: float, sla: api.SlaTarget, *,
                   duration_s: float) -> WindowScores:
    """Window scores from per-request outcomes, each request in the window it arrived in."""
    count = max(1, math.ceil(duration_s / window_s))
    index = np.minimum((outcomes.arrival // window_s).astype(int), count - 1)
    ttft = np.where(outcomes.failed, np.inf, outcomes.ttft)
    itl = np.where(outcomes.failed, np.inf, outcomes.itl)
    good_each = (ttft <= sla.ttft_ms / 1e3) & (itl <= sla.itl_ms / 1e3)
    requests = np.bincount(index, minlength=count)
    good = np.bincount(index, weights=good_each, minlength=count)
    ttft_p = np.full(count, np.nan)
    itl_p = np.full(count, np.nan)
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(count + 1))
    decoded = outcomes.osl > 1
    for w in range(count):
        members = order[bounds[w]:bounds[w + 1]]
        if members.size:
            ttft_p[w] = np.percentile(ttft[members], sla.percentile)
            with_itl = members[decoded[members]]
            itl_p[w] = np.percentile(itl[with_itl], sla.percentile) if with_itl.size else 0.0
    met = (requests > 0) & (ttft_p <= sla.ttft_ms / 1e3) & (itl_p <= sla.itl_ms / 1e3)
    return WindowScores(requests=requests, ttft_p=ttft_p, itl_p=itl_p, good=good, met=met)


class RequestFleet(fleetsim.FleetSimulator):
    """The per-request simulator as a `FleetModel`."""

    resolution_s = 0.0

    def sla_windows(self, window_s: float, sla: api.SlaTarget, *, duration_s: float) -> WindowScores:
        return score_requests(self.outcomes(), window_s, sla, duration_s=duration_s)

    def failed(self) -> int:
        return sum(1 for record in self.records if record.failed)

    def request_scores(self, sla: api.SlaTarget, *, duration_s: float,
                       scored_from_s: float = 0.0) -> scores.RequestScores:
        o = self.outcomes()
        if not hasattr(self, "_unservable"):
            ttft, itl = scores.lone_latencies(o.isl, o.osl, ttft=self.lone_ttft, itl=self.lone_itl)
            self._unservable = (ttft > sla.ttft_ms / 1e3) | (itl > sla.itl_ms / 1e3)
        return scores.score_requests(
            o.arrival, np.where(o.failed, np.inf, o.ttft), np.where(o.failed, np.inf, o.itl), self._unservable,
            ttft_target_s=sla.ttft_ms / 1e3, itl_target_s=sla.itl_ms / 1e3, percentile=sla.percentile,
            duration_s=duration_s, scored_from_s=scored_from_s)


@dataclasses.dataclass(frozen=True)
class Timeline:
    """One row per planning interval: what the load was and what the policy did about it."""

    time: np.ndarray
    rate: np.ndarray
    forecast: np.ndarray  # NaN where the policy does not forecast
    active: Mapping[FleetPool, np.ndarray]
    ready: Mapping[FleetPool, np.ndarray]
    ttft_p: np.ndarray
    itl_p: np.ndarray
    # Every change of the fleet's targets, when it was made (decisions and fast-loop reactions alike),
    # so that another fleet model can replay the very same fleet.
    changes: tuple[tuple[float, Mapping[FleetPool, int]], ...] = ()


@dataclasses.dataclass(frozen=True)
class RunResult:
    policy: str
    knob: float
    gpu_hours: float
    attainment: float
    requests: int
    good: int
    failed: int
    actions: int
    timeline: Timeline
    # Request-level: the primary score (`attainment` above is the share of intervals, kept for continuity).
    # None only for results built by hand.
    scores: scores.RequestScores | None = None

    @property
    def goodput_per_gpu_hour(self) -> float:
        """Requests that met the SLA, per GPU-hour."""
        good = self.scores.good if self.scores is not None else self.good
        return good / self.gpu_hours if self.gpu_hours > 0 else 0.0

    @property
    def request_attainment(self) -> float:
        return self.scores.attainment if self.scores is not None else self.attainment

    @property
    def effective(self) -> float:
        """The score that decides whether the run met the SLA (both rules of `scores`)."""
        return self.scores.effective if self.scores is not None else self.attainment


class _Loop:
    """One graph's run, interval by interval: observe the last interval, decide, apply, record."""

    def __init__(self, fleet: FleetModel, policy: policies.Policy, *, interval_s: float,
                 sla: api.SlaTarget) -> None:
        self.fleet, self.policy, self.interval_s, self.sla = fleet, policy, interval_s, sla
        self.rows: dict[str, list[float]] = {key: [] for key in ("time", "rate", "forecast", "ttft_p", "itl_p")}
        self.active: dict[FleetPool, list[int]] = {pool: [] for pool in FLEET_POOLS}
        self.ready: dict[FleetPool, list[int]] = {pool: [] for pool in FLEET_POOLS}
        self.actions = 0
        self.targets = policy.initial()
        self.changes: list[tuple[float, Mapping[FleetPool, int]]] = [(0.0, dict(self.targets))]

    def step(self, now: float) -> None:
        """Decide at `now`, after the fast loop's ticks since the last decision."""
        self.react_until(now)
        self.fleet.run_until(now)
        stats = self.fleet.window(now - self.interval_s, now, percentile=self.sla.percentile)
        decision = self.policy.decide(stats, now)
        self._apply(decision, now)
        forecast = self.policy.forecast()
        self.rows["time"].append(now)
        self.rows["rate"].append(stats.rate_rps)
        self.rows["forecast"].append(math.nan if forecast is None else forecast)
        self.rows["ttft_p"].append(math.nan if stats.ttft_p is None else stats.ttft_p)
        self.rows["itl_p"].append(math.nan if stats.itl_p is None else stats.itl_p)
        for pool in FLEET_POOLS:
            self.active[pool].append(stats.active[pool])
            self.ready[pool].append(stats.ready[pool])

    def react_until(self, now: float) -> None:
        """The policy's fast loop between the last decision and this one, if it has one.

        It runs no finer than the fleet model tells time apart (the fluid model's step); a step that
        spans several of its periods stands for as many ticks, each on the step's gauges and seeing
        the replicas the last one started (the queue a live loop would see grow between them does
        not grow here). Without that, a loop bounded per tick (fleetpilot's +50%, Dynamo's +1) would
        be twelve times slower on a 60-s fluid than it runs live every 5 s. A fleet model whose step is
        the planning interval (the family's fluid) has no boundary inside it: the loop never ticks there.
        """
        period = self.policy.reactive_period_s
        if period is None:
            return
        step = max(period, self.fleet.resolution_s)
        ticks_per_step = max(1, round(step / period))
        tick = now - self.interval_s + step
        while tick < now - 1e-9:
            self.fleet.run_until(tick)
            for _ in range(ticks_per_step):
                stats = self.fleet.window(tick - step, tick, percentile=self.sla.percentile, gauges_only=True)
                reaction = self.policy.react(stats, tick)
                if reaction is None:
                    break
                self._apply(reaction, tick)
            tick += step

    def _apply(self, targets: Mapping[FleetPool, int], now: float) -> None:
        if any(targets[pool] != self.targets[pool] for pool in FLEET_POOLS):
            self.changes.append((now, dict(targets)))
        for pool in FLEET_POOLS:
            if targets[pool] != self.targets[pool]:
                self.actions += 1
                self.fleet.set_target(pool, targets[pool])
        self.targets = dict(targets)

    def result(self, steps: int, window_s: float | None, *, scored_from_s: float = 0.0) -> RunResult:
        """The run's scores and costs over its scored span: from `scored_from_s` (its burn-in) to its end."""
        end = steps * self.interval_s
        gpu_hours = (self.fleet.gpu_seconds(end) - self.fleet.gpu_seconds(scored_from_s)) / 3600.0
        self.fleet.finish()
        window_s = window_s or self.interval_s
        windows = self.fleet.sla_windows(window_s, self.sla, duration_s=end).since(int(scored_from_s // window_s))
        total = int(windows.requests.sum())
        rows = self.rows
        return RunResult(
            policy=self.policy.name, knob=self.policy.knob, gpu_hours=gpu_hours, attainment=windows.attainment,
            requests=total, good=int(windows.good.sum()), failed=self.fleet.failed(), actions=self.actions,
            scores=self.fleet.request_scores(self.sla, duration_s=end, scored_from_s=scored_from_s),
            timeline=Timeline(
                time=np.array(rows["time"]), rate=np.array(rows["rate"]), forecast=np.array(rows["forecast"]),
                active={pool: np.array(v) for pool, v in self.active.items()},
                ready={pool: np.array(v) for pool, v in self.ready.items()},
                ttft_p=np.array(rows["ttft_p"]), itl_p=np.array(rows["itl_p"]), changes=tuple(self.changes),
            ),
        )


def run(fleet: FleetModel, policy: policies.Policy, *, duration_s: float, interval_s: float,
        sla: api.SlaTarget, window_s: float | None = None, scored_from_s: float = 0.0) -> RunResult:
    """Drive `fleet` (built with `policy.initial()` replicas) for `duration_s`, deciding every interval;
    score and cost it from `scored_from_s` on."""
    loop = _Loop(fleet, policy, interval_s=interval_s, sla=sla)
    steps = max(1, math.ceil(duration_s / interval_s))
    if not 0.0 <= scored_from_s < steps * interval_s:
        raise ValueError(f"scored_from_s={scored_from_s:g} must lie within the run's {steps * interval_s:g} s")
    for k in range(1, steps + 1):
        loop.step(k * interval_s)
    return loop.result(steps, window_s, scored_from_s=scored_from_s)


# -- several graphs under one GPU budget ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SharedGraph:
    """One graph of a shared-budget run: its fleet, the planner that scales it, and its priority."""

    name: str
    priority: int
    fleet: FleetModel
    policy: policies.Fleetpilot


@dataclasses.dataclass(frozen=True)
class SharedRun:
    """Each graph's run, and per interval the GPUs it was granted and those it wanted without the budget."""

    budget: int
    runs: Mapping[str, RunResult]
    granted: Mapping[str, np.ndarray]
    wanted: Mapping[str, np.ndarray]  # -1 where the graph did not plan (no data)

    def capped_share(self, graph: str) -> float:
        """The share of intervals in which `graph` got fewer GPUs than it wanted."""
        wanted, granted = self.wanted[graph], self.granted[graph]
        planned = wanted >= 0
        return float((granted[planned] < wanted[planned]).mean()) if planned.any() else 0.0


SHARED = "shared"  # the budget's name in a shared run's ledger


def run_shared(graphs: Sequence[SharedGraph], *, budget: int, duration_s: float, interval_s: float,
               window_s: float | None = None) -> SharedRun:
    """Several graphs under one GPU budget, as the live planner runs them.

    Every interval, each graph in turn (by name, as the live planner lists them) reads the budget as
    the live planner reads it (`budget.BudgetLedger.view`: every graph's latest claim, and the GPUs the
    others are asked to run now), takes its fast-path ticks and its interval's step on that view (the
    step grants its share and bounds it by what is free), and its decision's claim goes into the
    ledger. Each fleet starts with its policy's initial replicas, and each graph's first claim is what
    they use, as if the graphs had been running before (a newcomer's claim would be its minimum: every
    graph would be cut to it in the first interval).
    """
    names = [graph.name for graph in graphs]
    if len(set(names)) != len(names):
        raise ValueError(f"graph names must differ, got {names}")
    ledger = budget_mod.BudgetLedger({SHARED: budget})
    ordered = sorted(graphs, key=lambda graph: graph.name)
    loops = {g.name: _Loop(g.fleet, g.policy, interval_s=interval_s, sla=g.policy.setting.sla) for g in ordered}
    granted: dict[str, list[int]] = {g.name: [] for g in ordered}
    wanted: dict[str, list[int]] = {g.name: [] for g in ordered}
    for graph in ordered:
        # The step names the graph in the budget's claims as the driver does.
        graph.policy.config = dataclasses.replace(graph.policy.config, graph=graph.name, priority=graph.priority)
        ledger.claim(SHARED, budget_mod.BudgetClaim(graph=graph.name, priority=graph.priority,
                                                     min_gpus=graph.policy.min_gpus(), wanted_gpus=graph.policy.gpus()))
    steps = max(1, math.ceil(duration_s / interval_s))
    for k in range(1, steps + 1):
        for graph in ordered:
            others = sum(g.policy.gpus() for g in ordered if g.name != graph.name)
            graph.policy.budget = ledger.view(SHARED, others_in_use=others)
            loops[graph.name].step(k * interval_s)
            claim = graph.policy.claim()
            if claim is not None:
                ledger.claim(SHARED, claim)
            granted[graph.name].append(graph.policy.granted() or 0)
            plan = graph.policy.last_plan
            want = plan.wanted_gpus if plan is not None else None
            wanted[graph.name].append(-1 if want is None else want)
    return SharedRun(
        budget=budget, runs={name: loop.result(steps, window_s) for name, loop in loops.items()},
        granted={name: np.array(v) for name, v in granted.items()},
        wanted={name: np.array(v) for name, v in wanted.items()},
    )


# -- the oracle's needs ------------------------------------------------------------------------------


def request_needs(requests: Sequence[Request], config: fleetsim.FleetConfig, setting: policies.Setting, *,
                  attainment: float, workers: int = 1) -> list[dict[FleetPool, int]]:
    """Per interval, the fewest prefill then decode replicas with which at least `attainment` of the
    interval's servable requests meet the SLA, on a fleet of that size that has been up since the
    interval before (so it also carries what that interval left queued or decoding: sized on its own
    requests alone, the oracle shrank to a fleet that its predecessors' long decodes then swamped).

    Prefill is searched with decode at its maximum, then decode with that prefill count; where even
    the maximum cannot reach that share, the share the maximum reaches is the goal. Requests no idle
    replica could serve are not judged, as the scores do not judge them, but they load the fleet.
    """
    return request_needs_at(requests, config, setting, attainments=(attainment,), workers=workers)[attainment]


NEEDS_SEGMENT = 15  # intervals searched in a row, each from the need of the one before


def request_needs_at(requests: Sequence[Request], config: fleetsim.FleetConfig, setting: policies.Setting, *,
                     attainments: Sequence[float], workers: int = 1) -> dict[float, list[dict[FleetPool, int]]]:
    """`request_needs` at several attainments in one pass: an interval's simulation on a given fleet is
    the same whatever share it is judged against, so each (prefill, decode) is simulated once per interval
    for all of them (the oracle's sweep was most of a per-request backtest row's time).

    Intervals are searched in segments of `NEEDS_SEGMENT`, each interval from the need of the one
    before, each segment's first from the bottom; `workers` processes search the segments side by side.
    The split is fixed, so the needs do not depend on how many processes found them."""
    search = _NeedsSearch.of(requests, config, setting, attainments)
    spans = [(first, min(first + NEEDS_SEGMENT, search.count)) for first in range(0, search.count, NEEDS_SEGMENT)]
    if workers <= 1 or len(spans) <= 1:
        parts = [search.segment(first, last) for first, last in spans]
    else:
        _SEARCH["search"] = search  # forked: each process has it, nothing is sent but the span
        try:
            context = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(max_workers=min(workers, len(spans)),
                                                        mp_context=context) as pool:
                parts = list(pool.map(_search_segment, spans))
        finally:
            _SEARCH.clear()
    return {attainment: [need for part in parts for need in part[attainment]] for attainment in attainments}


_SEARCH: dict[str, _NeedsSearch] = {}


def _search_segment(span: tuple[int, int]) -> dict[float, list[dict[FleetPool, int]]]:
    return _SEARCH["search"].segment(*span)


def servable(requests: Sequence[Request], config: fleetsim.FleetConfig, sla: api.SlaTarget) -> list[bool]:
    """Whether each request can meet the SLA at all: its TTFT and mean ITL alone on idle replicas within the
    targets. The others are served but judged by no policy: no fleet size gets them in time."""
    probe = fleetsim.FleetSimulator(config, [], {"prefill": 0, "decode": 0})
    ttft_target, itl_target = sla.ttft_ms / 1e3, sla.itl_ms / 1e3
    return [probe.lone_ttft(r.input_tokens) <= ttft_target
            and probe.lone_itl(r.input_tokens, r.output_tokens) <= itl_target for r in requests]


@dataclasses.dataclass(frozen=True)
class _NeedsSearch:
    """What `request_needs_at` searches: the trace cut into intervals, and which requests are judged."""

    requests: Sequence[Request]
    instant: fleetsim.FleetConfig  # replicas up from the start: the oracle sizes a fleet that is there
    sla: api.SlaTarget
    interval_s: float
    bounds: Mapping[FleetPool, tuple[int, int]]
    attainments: Sequence[float]
    edges: np.ndarray  # index of the first request of each interval
    servable: Sequence[bool]

    @classmethod
    def of(cls, requests: Sequence[Request], config: fleetsim.FleetConfig, setting: policies.Setting,
           attainments: Sequence[float]) -> _NeedsSearch:
        interval = setting.interval_s
        instant = dataclasses.replace(config, startup_s=0.0)
        arrivals = np.array([r.arrival_s for r in requests])
        count = max(1, math.ceil((arrivals.max() if len(arrivals) else 0.0) / interval) + 1)
        return cls(requests=requests, instant=instant, sla=setting.sla, interval_s=interval,
                   bounds=setting.bounds, attainments=tuple(attainments),
                   edges=np.searchsorted(arrivals, np.arange(count + 1) * interval),
                   servable=servable(requests, instant, setting.sla))

    @property
    def count(self) -> int:
        return len(self.edges) - 1

    def segment(self, first_interval: int, last_interval: int) -> dict[float, list[dict[FleetPool, int]]]:
        """The needs of intervals [first_interval, last_interval), at every share."""
        ttft_target, itl_target = self.sla.ttft_ms / 1e3, self.sla.itl_ms / 1e3
        (p_lo, p_hi), (d_lo, d_hi) = self.bounds["prefill"], self.bounds["decode"]
        interval, edges, requests = self.interval_s, self.edges, self.requests
        needs: dict[float, list[dict[FleetPool, int]]] = {attainment: [] for attainment in self.attainments}
        guesses: dict[float, dict[FleetPool, int]] = {}  # each share's need in the last interval that had one
        for w in range(first_interval, last_interval):
            begin = max(w - 1, 0) * interval  # the interval before: its work is still on the fleet
            # Unservable requests are not judged, but they are served all the same: a 100k-token prompt
            # holds a prefill replica for seconds and a quarter of a decode replica's KV cache.
            first = edges[max(w - 1, 0)]
            chunk = [dataclasses.replace(r, arrival_s=r.arrival_s - begin) for r in requests[first:edges[w + 1]]]
            judged = np.array([r.arrival_s >= w * interval - begin and ok
                               for r, ok in zip(chunk, self.servable[first:edges[w + 1]], strict=True)], dtype=bool)
            if not judged.any():
                for attainment in self.attainments:
                    needs[attainment].append({"prefill": p_lo, "decode": d_lo})
                continue

            shares: dict[tuple[int, int], tuple[float, float]] = {}

            def share(prefill: int, decode: int, *, itl: bool, chunk: list[Request] = chunk,
                      judged: np.ndarray = judged, shares: dict[tuple[int, int], tuple[float, float]] = shares,
                      ) -> float:
                """The share of the interval's judged requests meeting TTFT (and ITL) on this fleet."""
                if (prefill, decode) not in shares:
                    sim = fleetsim.FleetSimulator(self.instant, chunk, {"prefill": prefill, "decode": decode})
                    sim.finish()
                    o = sim.outcomes()
                    fast = ~o.failed & (o.ttft <= ttft_target)
                    shares[prefill, decode] = (float(fast[judged].mean()),
                                               float((fast & (o.itl <= itl_target))[judged].mean()))
                return shares[prefill, decode][1 if itl else 0]

            for attainment in self.attainments:
                last = guesses.get(attainment, {"prefill": p_lo, "decode": d_lo})
                prefill = _fewest_reaching(max(p_lo, 1), p_hi, last["prefill"], attainment,
                                           lambda p: share(p, d_hi, itl=False))
                decode = _fewest_reaching(max(d_lo, 1), d_hi, last["decode"], attainment,
                                          lambda d, p=prefill: share(p, d, itl=True))  # type: ignore[misc]
                guesses[attainment] = {"prefill": prefill, "decode": decode}
                needs[attainment].append(guesses[attainment])
        return needs


def _fewest_reaching(lo: int, hi: int, guess: int, goal: float, share: Callable[[int], float]) -> int:
    """The fewest replicas in [lo, hi] whose `share` reaches `goal`, searched from `guess` (the interval
    before's: needs move a little from one interval to the next). Where even `hi` cannot serve that
    share (a burst of prompts that queue on any number of replicas), the goal is what `hi` serves:
    asking for the bound there would buy nothing and cost more than a policy with the same score."""
    fewest_meeting = fewest_near(lo, hi, guess, lambda n: share(n) >= goal - 1e-12)
    if fewest_meeting < hi or share(hi) >= goal - 1e-12:
        return fewest_meeting
    reachable = share(hi) - 1e-12
    return fewest_near(lo, hi, guess, lambda n: share(n) >= reachable)


# -- comparing policies ------------------------------------------------------------------------------


def cost_to_meet(results: Sequence[RunResult], target: float, *,
                 score: Callable[[RunResult], float] = lambda r: r.effective) -> scores.CostToMeet:
    """The GPU-hours a sweep needs for `score` to reach `target` (see `scores.cost_to_meet`)."""
    return scores.cost_to_meet([(r.gpu_hours, score(r)) for r in results], target)


def interval_rates(requests: Sequence[Request], interval_s: float, duration_s: float) -> np.ndarray:
    """Arrivals per second in each planning interval: the series every forecaster sees."""
    count = max(1, math.ceil(duration_s / interval_s))
    index = np.minimum((np.array([r.arrival_s for r in requests]) // interval_s).astype(int), count - 1)
    return np.bincount(index, minlength=count) / interval_s


def forecast_mape(rates: Sequence[float], predictor: predict.Predictor, *, horizon: int, interval_s: float,
                  warmup: int = 6) -> float:
    """Mean absolute percentage error of the forecast `horizon` intervals ahead, as the planner uses it.

    At each interval k (after `warmup`), the predictor sees rates[:k+1] — the same calls the planner
    makes, so a memoised predictor answers from its memo — and its forecast for k + horizon is compared
    with what came. Intervals with no traffic are left out (a percentage of zero is undefined).
    """
    errors = []
    for k in range(warmup, len(rates) - horizon):
        actual = rates[k + horizon]
        if actual <= 0:
            continue
        forecast = predictor.forecast(list(rates[:k + 1]), steps=horizon, step_seconds=interval_s)
        errors.append(abs(forecast.mean[horizon - 1] - actual) / actual)
    return float(np.mean(errors)) if errors else math.nan
