"""The fluid fleet: the same fleet as `fleetsim`, in steps of aggregate traffic instead of requests.

Where it sits: `driver` drives it exactly like the per-request simulator (it is a `FleetModel`), for
series too long to simulate request by request (14 days of ServeGen at tens of requests per second is
tens of millions of requests; a sweep runs dozens of them). The per-request simulator is the reference:
`benchmarks/backtest.py` runs both on the 1-hour traces and reports how far apart they are.

Per step of `step_s` (the arrivals of a step are given, optionally per sub-step; lengths are drawn
once, as a sample):
- **Prefill**: a prompt costs a replica S = max(its own prefill time, its share of a full batched
  step) seconds: long prompts pay their quadratic attention, short ones batch. On a request trace
  each step's prompts are priced at that step's own mix (`step_prompt_mix`), not the trace's mean. A request's TTFT is
  its own lone prefill time (long prompts are slow whatever the load) plus its wait, the KV transfer
  and one decode step; percentiles are read off the sample. The wait depends on what is known of
  the arrivals within the step:
  - *Counts per sub-step* (a request trace: its bursts of a second or less): prompt work is a fluid
    between sub-steps; what arrives beyond the ready replicas' capacity piles up and later sub-steps
    drain it (Lindley's recursion). A prompt waits for the backlog ahead of it when it arrives
    and, with probability ρ, for the batched step in progress (chunked prefill: a long prompt shares
    steps, it does not hold the replica).
  - *A count per step* (a rate series: Poisson within the step): an M/G/c wait over the ready
    replicas (the frontend sends each prompt to the least-loaded one): with the Erlang-C probability,
    exponential with mean R / (c·(1 − ρ)), R = E[S²] / 2E[S] (Allen–Cunneen), plus the backlog's
    drain time.
  Validated against `fleetsim` on one fleet (`evaluate.replay`); `benchmarks/backtest.py` reports it.
- **Decode**: with a count per step, Little's law, c = rate per replica × OSL × ITL(c), solved by
  fixed-point iteration with ITL from `decode_step_time(c, c × mean context)`; beyond the batch cap
  or the KV cache, the replica runs at the cap and the excess waits (that wait goes into TTFT). With
  counts per sub-step, the batch is followed sub-step by sub-step instead (a burst of a second fills
  a batch that the step's mean rate would not): what prefill finishes joins it up to the slots, the
  rest waits, and each output-length group leaves at its own pace. A request's ITL is that of a
  batch one standard deviation (√c, Poisson) above the mean at the upper percentiles.
- **Replicas** start, get cancelled and drain as in `fleetsim`; a draining replica holds its GPUs for
  one mean request lifetime after it stops taking work.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence

import numpy as np

from fleetpilot import perfmodel
from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import lengths
from fleetpilot.planner.backtest import scores
from fleetpilot.planner.backtest.driver import WindowScores
from fleetpilot.planner.backtest.fleetsim import (
    FLEET_POOLS,
    FleetConfig,
    FleetPool,
    WindowStats,
    lone_prefill_s,
)
from fleetpilot.planner.capacity import erlang_c, fewest_near

_READY_AT = operator.attrgetter("ready_at")
_SAMPLE = 2000  # requests in the length sample; every percentile is read off it
_OSL_GROUPS = 8  # output-length groups the decode batch is followed in (with sub-steps)

# A fast loop ticking every 5 s reads the prompt queue a dozen times in a 60-s step; below
# utilisation 1 no backlog piles up, but the queue comes and goes (Erlang C), and the largest of a
# dozen readings is near its 90th percentile. The fluid's queue gauge is that quantile of the step's
# prompt waits: a mean (or the fluid backlog alone, 0 below utilisation 1) hid the queue a live loop
# sees — ServeGen m-large sat 10 minutes at p90 TTFT 0.6–0.95 s on one prefill replica unanswered.
QUEUE_SEEN = 0.9


@dataclasses.dataclass
class _Replica:
    created: float
    ready_at: float
    stopped: float | None = None
    draining: bool = False


@dataclasses.dataclass(frozen=True)
class StepLatency:
    """One step's latencies over the length sample, and what the engines' gauges would read."""

    ttft: np.ndarray  # seconds, one per sampled request
    itl: np.ndarray
    busy: float  # prefill utilisation
    kv_usage: float
    prefill_backlog_s: float  # replica-seconds of prompt work waiting
    decode_backlog_requests: float
    decode_concurrency: float = 0.0  # sequences decoding per ready decode replica
    prefill: np.ndarray | None = None  # TTFT's prefill part (queueing and compute), one per sampled request
    # The wait behind queued prompts that a fast loop's reading finds within the step (`QUEUE_SEEN`).
    prefill_queue_s: float = 0.0
    decode_sequences: float = 0.0  # sequences decoding at the end of the step, all replicas (tracked with sub-steps)


@dataclasses.dataclass(frozen=True)
class _Decoding:
    """One step's decode, per sub-step (one entry with a count per step)."""

    itl_mean: np.ndarray
    itl_high: np.ndarray  # one standard deviation of the batch up
    slot_wait: np.ndarray  # a request arriving in the sub-step waits this long for a decode slot
    backlog: float  # requests waiting for a slot at the step's end
    concurrency: float  # sequences per ready replica at the step's end (steady: during it)
    sequences: float  # sequences decoding at the step's end, all replicas (0 when not followed)


@dataclasses.dataclass(frozen=True)
class LengthClasses:
    """Request classes whose mix moves over a run (a generated series: the family's long and short
    prompts): the class of each sampled request, and each step's share of every class. The readings
    (`FluidFleet.window`: mean lengths and histograms) follow each window's own mix, as the frontend's
    histograms follow the requests that came; without classes every window reads the sample's mix."""

    of_sample: Sequence[int]  # per request of the length sample, its class (0..k-1)
    shares: np.ndarray  # per step, the share of its arrivals in each class (steps × k, rows summing to 1)


class FluidFleet:
    """A `FleetModel` over per-step arrival counts (`arrivals[k]` requests in [k·step_s, (k+1)·step_s))."""

    def __init__(self, config: FleetConfig, arrivals: Sequence[float] | np.ndarray, *, step_s: float,
                 isl_sample: Sequence[int], osl_sample: Sequence[int], initial: Mapping[FleetPool, int],
                 seed: int = 0, prompt_mix: Sequence[float] | np.ndarray | None = None,
                 length_classes: LengthClasses | None = None) -> None:
        self.config = config
        self.timing = config.timing
        self.step_s = step_s
        given = np.asarray(arrivals, dtype=float)
        # Arrivals within each step, in sub-steps: bursts shorter than a step queue prompts that a
        # step's mean rate would not (one sub-step per step: Poisson within the step).
        self.sub_arrivals = given if given.ndim == 2 else given[:, None]
        self.arrivals = self.sub_arrivals.sum(axis=1)
        # Per step, its prompts' mean prefill service over the whole sample's (a request trace knows
        # them; a rate series has one mix): Mooncake's prompts cost 0.48-0.57 s in its first ten
        # minutes and 0.34-0.37 s in minutes 25-50 against 0.41 s overall, and priced at the mean the
        # fluid overloaded the oracle's fleet there (66.7% against 95.6% per request; 96.5% with this).
        self.prompt_mix = np.ones(len(self.arrivals)) if prompt_mix is None else np.asarray(prompt_mix, dtype=float)
        if self.prompt_mix.shape != self.arrivals.shape or not (self.prompt_mix > 0).all():
            raise ValueError(f"prompt_mix needs one positive factor per step ({len(self.arrivals)}), "
                             f"got shape {self.prompt_mix.shape}")
        rng = np.random.default_rng(seed)
        # The requests at evenly spaced quantiles of prompt length, not a random draw: prompt cost is
        # convex in length and long-tailed, and a random 2,000 of Mooncake ×4's 48,124 requests put
        # the mean lone prefill 12% above the trace's (0.45 s against 0.40 s), which moved the
        # prefill pool's saturation from 17 to 15 req/s on seven replicas.
        by_length = np.argsort(np.asarray(isl_sample, dtype=float), kind="stable")
        size = min(_SAMPLE, len(isl_sample))
        pick = by_length[((np.arange(size) + 0.5) * len(isl_sample) / size).astype(int)]
        self.isl = np.asarray(isl_sample, dtype=float)[pick]
        self.osl = np.asarray(osl_sample, dtype=float)[pick]
        self.isl_mean, self.osl_mean = float(self.isl.mean()), float(self.osl.mean())
        # The sample's length histograms per arrival, scaled by each window's arrivals when reported.
        isl_histogram, osl_histogram = lengths.of_lengths(list(self.isl)), lengths.of_lengths(list(self.osl))
        assert isl_histogram is not None and osl_histogram is not None
        self._length_histograms = (isl_histogram, osl_histogram)
        # With length classes, each class's histograms within the sample, and every step's shares of them.
        self._class_histograms: list[tuple[lengths.Histogram, lengths.Histogram, int]] = []
        self._class_shares: np.ndarray | None = None
        if length_classes is not None:
            of_sample = np.asarray(length_classes.of_sample)[pick]
            shares = np.asarray(length_classes.shares, dtype=float)
            if shares.shape[0] != len(self.arrivals) or len(length_classes.of_sample) != len(isl_sample):
                raise ValueError(f"length classes need one class per sampled request ({len(isl_sample)}) and "
                                 f"one row of shares per step ({len(self.arrivals)})")
            for c in range(shares.shape[1]):
                mine = of_sample == c
                isl_c, osl_c = lengths.of_lengths(list(self.isl[mine])), lengths.of_lengths(list(self.osl[mine]))
                if isl_c is None or osl_c is None:  # a class too rare to be in the sample reads as the others
                    shares = np.delete(shares, len(self._class_histograms), axis=1)
                    continue
                self._class_histograms.append((isl_c, osl_c, int(mine.sum())))
            self._class_shares = shares
        # Fixed quantiles for the waiting time, so a run is deterministic and percentiles are smooth.
        self._wait_u = rng.permutation((np.arange(len(self.isl)) + 0.5) / len(self.isl))
        self._place_u = rng.permutation((np.arange(len(self.isl)) + 0.5) / len(self.isl))  # when in the step
        budget = config.max_batched_tokens
        alone = lone_prefills_s(self.timing, self.isl, budget)
        self._lone_prefill = self.timing.calibration.ttft_overhead_s + alone
        self._transfer = np.array([self.timing.kv_transfer_time(int(n), config.kv_bandwidth_bytes_per_s)
                                   for n in self.isl])
        service = prompt_service_s(self.timing, self.isl, budget, alone=alone)
        self._service_mean = float(service.mean())
        self._residual_s = float((service**2).mean() / (2 * self._service_mean))
        # Where sub-steps carry the arrivals' variance, a prompt waits at most for the batched step in
        # progress (chunked prefill: a long prompt does not hold the replica, it shares its steps).
        self._step_residual_s = self.timing.prefill_time(budget) / 2
        context = self.isl_mean + self.osl_mean / 2
        kv_limit = config.kv_capacity_tokens / (self.isl_mean + self.osl_mean)
        self.decode_cap = max(1.0, min(float(config.max_num_seqs), kv_limit))
        # Output lengths in equal-count groups, shortest first: a burst's short outputs leave the batch
        # in a few steps and its long ones stay, which one mean lifetime for all would blur.
        groups = np.array_split(np.sort(self.osl), min(_OSL_GROUPS, len(self.osl)))
        self._osl_groups = np.array([group.mean() for group in groups])
        self.context = context
        self.replicas: dict[FleetPool, list[_Replica]] = {pool: [] for pool in FLEET_POOLS}
        # The replicas not stopped (nor draining), by ready time: every one starts after the same
        # startup, so creation order is ready order and "how many are ready at t" is a bisection —
        # a 14-day series at hundreds of replicas asks it five times a step.
        self._live: dict[FleetPool, list[_Replica]] = {pool: [] for pool in FLEET_POOLS}
        for pool in FLEET_POOLS:
            for _ in range(int(initial.get(pool, 0))):
                self._start(pool, _Replica(created=0.0, ready_at=0.0))
        self.now = 0.0
        self._step = 0
        self._prefill_backlog = 0.0
        self._decode_backlog = 0.0
        self._decode_sequences = 0.0
        self.steps: list[StepLatency] = []

    # -- FleetModel ---------------------------------------------------------------------------------------

    @property
    def resolution_s(self) -> float:
        return self.step_s

    def run_until(self, until: float) -> None:
        while (self._step + 1) * self.step_s <= until + 1e-9 and self._step < len(self.arrivals):
            self.now = self._step * self.step_s
            self.steps.append(self._advance(self.arrivals[self._step]))
            self._step += 1
            self.now = self._step * self.step_s
        self.now = max(self.now, until)

    def finish(self) -> None:
        self.run_until(len(self.arrivals) * self.step_s)

    def set_target(self, pool: FleetPool, replicas: int) -> None:
        live = self._live[pool]
        for _ in range(replicas - len(live)):
            self._start(pool, _Replica(created=self.now, ready_at=self.now + self.config.startup_s))
        surplus = max(len(live) - max(replicas, 0), 0)
        # Cancel the replicas still starting, the latest first, then drain the oldest ready ones.
        ready = self.ready(pool)
        cancelled = min(surplus, len(live) - ready)
        for replica in live[len(live) - cancelled:]:
            replica.stopped = self.now
        for replica in live[:surplus - cancelled]:
            replica.draining = True
            replica.stopped = self.now + self._lifetime_s()
        self._live[pool] = live[surplus - cancelled:len(live) - cancelled]

    def _start(self, pool: FleetPool, replica: _Replica) -> None:
        self.replicas[pool].append(replica)
        self._live[pool].append(replica)

    def failed(self) -> int:
        return 0  # a fluid has no request too large to serve: its sample is of served lengths

    def gpu_seconds(self, until: float) -> float:
        total = 0.0
        for pool in FLEET_POOLS:
            for r in self.replicas[pool]:
                end = until if r.stopped is None else min(r.stopped, until)
                total += max(0.0, end - r.created) * self.config.gpus[pool]
        return total

    def ready(self, pool: FleetPool, at: float | None = None) -> int:
        return bisect.bisect_right(self._live[pool], self.now if at is None else at, key=_READY_AT)

    def active(self, pool: FleetPool) -> int:
        return len(self._live[pool])

    def window(self, start: float, end: float, *, percentile: float, gauges_only: bool = False) -> WindowStats:
        """What the metrics say about [start, end) (`driver.FleetModel.window`)."""
        lo, hi = round(start / self.step_s), round(end / self.step_s)
        chosen = self.steps[lo:hi]
        counts = self.arrivals[lo:hi]
        total = float(counts.sum())
        length = max(end - start, 1e-9)
        ttft: float | None = None
        itl: float | None = None
        ttft_mean: float | None = None
        itl_mean: float | None = None
        prefill: float | None = None
        if total > 0 and chosen and not gauges_only:
            ttft = _weighted_percentile([s.ttft for s in chosen], counts, percentile)
            parts = [s.prefill for s in chosen]
            if all(part is not None for part in parts):
                prefill = _weighted_percentile([p for p in parts if p is not None], counts, percentile)
            itl = _weighted_percentile([s.itl for s in chosen], counts, percentile)
            busy = counts > 0  # a step nobody arrived in weighs nothing, even where its latency is infinite
            ttft_mean = float(np.average([s.ttft.mean() for s, b in zip(chosen, busy, strict=True) if b],
                                         weights=counts[busy]))
            itl_mean = float(np.average([s.itl.mean() for s, b in zip(chosen, busy, strict=True) if b],
                                        weights=counts[busy]))
        isl_histogram, osl_histogram = (None, None) if gauges_only else self._histograms(lo, hi, total)
        return WindowStats(
            start=start, end=end, arrivals=int(total), rate_rps=total / length,
            isl_mean=(isl_histogram.mean if isl_histogram else self.isl_mean) if total else None,
            osl_mean=(osl_histogram.mean if osl_histogram else self.osl_mean) if total else None,
            ttft_p=ttft, itl_p=itl, ttft_mean=ttft_mean, itl_mean=itl_mean,
            prefill_busy=float(np.mean([s.busy for s in chosen])) if chosen else 0.0,
            decode_kv_usage=float(np.mean([s.kv_usage for s in chosen])) if chosen else 0.0,
            ready={pool: self.ready(pool) for pool in FLEET_POOLS},
            active={pool: self.active(pool) for pool in FLEET_POOLS},
            prefill_p=prefill,
            burst_rate_p=self._burst_rate(lo, hi, percentile) if total > 0 and not gauges_only else None,
            **self._gauges(chosen[-1] if chosen else None),
            isl_histogram=isl_histogram, osl_histogram=osl_histogram,
        )

    def _histograms(self, lo: int, hi: int, total: float) -> tuple[lengths.Histogram | None, lengths.Histogram | None]:
        """The prompt and output length histograms of steps [lo, hi)'s `total` arrivals: the sample's, or with
        length classes, each class's in proportion to the arrivals it had in those steps."""
        if self._class_shares is None or total <= 0:
            return self._histogram(0, total), self._histogram(1, total)
        per_class = self.arrivals[lo:hi] @ self._class_shares[lo:hi]
        scale = total / per_class.sum() if per_class.sum() > 0 else 0.0
        pooled = []
        for which in (0, 1):
            parts = []
            for (isl_c, osl_c, size), arrivals_c in zip(self._class_histograms, per_class, strict=True):
                if arrivals_c > 0:
                    own = isl_c if which == 0 else osl_c
                    parts.append(lengths.Histogram(tuple(n * arrivals_c * scale / size for n in own.counts), own.mean))
            pooled.append(lengths.pooled(parts))
        return pooled[0], pooled[1]

    def _histogram(self, which: int, arrivals: float) -> lengths.Histogram | None:
        """The length histogram (0: prompts, 1: outputs) of `arrivals` requests drawn from the trace's sample."""
        if arrivals <= 0:
            return None
        sample = self._length_histograms[which]
        share = arrivals / len(self.isl)
        return lengths.Histogram(tuple(c * share for c in sample.counts), sample.mean)

    def _burst_rate(self, lo: int, hi: int, percentile: float) -> float | None:
        """The trailing burst-window rate the percentile's request saw, from the arrivals per sub-step
        (None for a rate series: Poisson within a step is all the model knows of it)."""
        per_step = self.sub_arrivals.shape[1]
        if per_step == 1:
            return None
        sub_s = self.step_s / per_step
        span = max(1, round(contract.BURST_WINDOW_S / sub_s))
        first = lo * per_step
        flat = self.sub_arrivals[:hi].ravel()
        trailing = np.convolve(flat, np.ones(span))[:len(flat)]  # arrivals in the window ending at each sub-step
        weights, rates = flat[first:], trailing[first:] / (span * sub_s)
        if weights.sum() <= 0:
            return None
        return _weighted_percentile([np.array([rate]) for rate in rates], weights, percentile)

    def _gauges(self, last: StepLatency | None) -> dict[str, float]:
        """The queue gauges at the end of a window, from its last step."""
        if last is None:
            return {}
        return {
            # Replica-seconds of prompts ahead of the next one, as tokens: what a reading finds queued.
            "prefill_queued_tokens": (last.prefill_queue_s * self.ready("prefill") if self.ready("prefill")
                                      else last.prefill_backlog_s) * self.isl_mean / self._service_mean,
            "decode_waiting": last.decode_backlog_requests,
            "decode_running": last.decode_concurrency * self.ready("decode"),
        }

    def servable(self, sla: api.SlaTarget) -> np.ndarray:
        """Which sampled requests could meet the SLA alone on idle replicas (the others are excluded)."""
        lone_ttft = self._lone_prefill + self._transfer + np.array(
            [self.timing.decode_step_time(1, int(n)) for n in self.isl])
        lone_itl = np.array([self.timing.itl(1, int(i + o // 2)) if o > 1 else 0.0
                             for i, o in zip(self.isl, self.osl, strict=True)])
        servable: np.ndarray = ~((lone_ttft > sla.ttft_ms / 1e3) | (lone_itl > sla.itl_ms / 1e3))
        return servable

    def request_scores(self, sla: api.SlaTarget, *, duration_s: float,
                       scored_from_s: float = 0.0) -> scores.RequestScores:
        """Each step's arrivals meet the SLA in the proportion its sampled requests do."""
        eligible = self.servable(sla)
        counts = self.arrivals[:len(self.steps)]
        good_share = np.array([float(np.mean(eligible & (step.ttft <= sla.ttft_ms / 1e3)
                                             & (step.itl <= sla.itl_ms / 1e3))) for step in self.steps])
        times = np.arange(len(self.steps)) * self.step_s
        eligible_bins, good_bins = scores.binned(times, counts * float(eligible.mean()), counts * good_share,
                                                 duration_s=duration_s, scored_from_s=scored_from_s)
        total = float(counts[times >= scored_from_s].sum())
        return scores.score_bins(eligible_bins, good_bins, requests=round(total),
                                 excluded=round(total * (1.0 - float(eligible.mean()))), target=sla.percentile / 100,
                                 scored_from_s=scored_from_s)

    def sla_windows(self, window_s: float, sla: api.SlaTarget, *, duration_s: float) -> WindowScores:
        per = max(1, round(window_s / self.step_s))
        count = math.ceil(len(self.steps) / per)
        requests = np.zeros(count)
        good = np.zeros(count)
        ttft_p = np.full(count, np.nan)
        itl_p = np.full(count, np.nan)
        met = np.zeros(count, dtype=bool)
        for w in range(count):
            chosen = self.steps[w * per:(w + 1) * per]
            counts = self.arrivals[w * per:w * per + len(chosen)]
            requests[w] = counts.sum()
            if requests[w] <= 0:
                continue
            ttft_p[w] = _weighted_percentile([s.ttft for s in chosen], counts, sla.percentile)
            itl_p[w] = _weighted_percentile([s.itl for s in chosen], counts, sla.percentile)
            good[w] = sum(c * float(np.mean((s.ttft <= sla.ttft_ms / 1e3) & (s.itl <= sla.itl_ms / 1e3)))
                          for s, c in zip(chosen, counts, strict=True))
            met[w] = ttft_p[w] <= sla.ttft_ms / 1e3 and itl_p[w] <= sla.itl_ms / 1e3
        return WindowScores(requests=requests, ttft_p=ttft_p, itl_p=itl_p, good=good, met=met)

    # -- the model ----------------------------------------------------------------------------------------

    def latency(self, rate_rps: float, prefill: int, decode: int, *, prefill_backlog: float = 0.0,
                decode_backlog: float = 0.0, step_s: float | None = None,
                within: np.ndarray | None = None, decode_running: float = 0.0,
                prompt_mix: float = 1.0) -> StepLatency:
        """Latencies of one step at `rate_rps` on `prefill` and `decode` ready replicas (pure).

        `within`: the step's arrivals per sub-step (default: one sub-step, Poisson within the step);
        `decode_running`: sequences decoding when the step starts (followed only with sub-steps);
        `prompt_mix`: the step's mean prompt service over the sample's.
        """
        step = self.step_s if step_s is None else step_s
        shape = np.asarray(within, dtype=float) if within is not None else np.array([rate_rps * step])
        sub, into = self._placement(shape)
        wait, backlog, rho, prefilled = self._prefill_wait(shape, prefill, prefill_backlog, step / len(shape),
                                                           sub, into, prompt_mix)
        if len(shape) > 1:  # decode sees requests as prefill finishes them: a burst reaches it spread out
            decoding = self._tracked_decode(prefilled, step / len(shape), decode, decode_backlog, decode_running)
        else:
            decoding = self._steady_decode(rate_rps, step, decode, decode_backlog)
        itl_mean = decoding.itl_mean[sub]
        # Requests' ITLs: the mean batch for most, one standard deviation up for the upper tail.
        itl = np.where(self._wait_u > 0.5, decoding.itl_high[sub], itl_mean)
        ttft = self._lone_prefill + wait + self._transfer + decoding.slot_wait[sub] + itl_mean
        return StepLatency(
            ttft=ttft, itl=itl, busy=min(1.0, rho),
            kv_usage=min(1.0, decoding.concurrency * self.context / self.config.kv_capacity_tokens),
            prefill_backlog_s=backlog, decode_backlog_requests=decoding.backlog,
            decode_concurrency=decoding.concurrency, decode_sequences=decoding.sequences,
            prefill_queue_s=float(np.quantile(wait, QUEUE_SEEN)) if prefill > 0 else math.inf,
            prefill=self._lone_prefill + wait,
        )

    def _steady_decode(self, rate_rps: float, step: float, decode: int, backlog: float) -> _Decoding:
        """Decode at a step's mean rate: Little's law fixed point, capped at the batch / KV limit; beyond
        it the excess waits, and every request of the step waits for what is left at its end."""
        concurrency, overloaded = self._concurrency(rate_rps / decode if decode > 0 else math.inf)
        if backlog > 0:  # requests are waiting: the replicas run full batches until they catch up
            concurrency, overloaded = self.decode_cap, True
        itl_mean = self._itl(concurrency)
        itl_high = self._itl(min(concurrency + math.sqrt(max(concurrency, 0.0)), self.decode_cap))
        served = decode * concurrency / (self.osl_mean * itl_mean) if decode > 0 and itl_mean > 0 else 0.0
        backlog = max(0.0, backlog + (rate_rps - served) * step) if overloaded or backlog > 0 else 0.0
        wait = backlog / served if served > 0 else math.inf
        return _Decoding(np.array([itl_mean]), np.array([itl_high]), np.array([wait]), backlog, concurrency, 0.0)

    def _tracked_decode(self, inflow: np.ndarray, sub_s: float, decode: int, backlog: float,
                        running: float) -> _Decoding:
        """Decode followed sub-step by sub-step, for a step whose arrivals come per sub-step.

        A steady state per step (Little's law at the step's mean rate) smooths away what short outputs
        feel: Azure code ×16's bursts of a second filled one decode replica's batch and TTFT's p90 went
        to 1.2 s in the per-request simulator while the fluid's stayed at 0.2 s. Here the sequences
        decoding (`running` at the start) are a state: each sub-step admits what prefill finished
        (`inflow`: prefill spreads a burst out) and what waited, up to the replicas' slots (batch or KV
        cap), the rest waits; each sequence finishes after its OSL at the ITL of the batch it runs in.
        A request arriving in a sub-step waits for a slot as long as the queue then takes to drain at
        the full-batch finishing rate.
        """
        slots = decode * self.decode_cap
        backlog += max(0.0, running - slots)
        lengths = self._osl_groups
        # What runs at the step's start, spread over the groups as in a steady batch (∝ their lifetimes).
        batch = min(running, slots) * lengths / lengths.sum()
        count = len(inflow)
        itl_mean, itl_high, slot_wait = (np.zeros(count) for _ in range(3))
        full_rate = slots / (self.osl_mean * self._itl(self.decode_cap)) if decode > 0 else 0.0
        for j in range(count):
            waiting = backlog + inflow[j]
            admitted = min(waiting, max(0.0, slots - float(batch.sum())))
            backlog = waiting - admitted
            batch = batch + admitted / len(lengths)
            c = float(batch.sum()) / decode if decode > 0 else 0.0
            itl_mean[j] = self._itl(c)
            itl_high[j] = self._itl(min(c + math.sqrt(c), self.decode_cap))
            slot_wait[j] = (backlog / full_rate if full_rate > 0 else math.inf) if backlog > 0 else 0.0
            batch = batch * (1.0 - np.minimum(1.0, sub_s / (lengths * itl_mean[j])))
        running = float(batch.sum())
        return _Decoding(itl_mean, itl_high, slot_wait, backlog, running / decode if decode > 0 else 0.0, running)

    def _placement(self, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which sub-step each sampled request arrives in (in proportion to its arrivals) and how far
        into it (uniformly)."""
        arrived = float(shape.sum())
        if arrived <= 0:
            return np.zeros(len(self.isl), dtype=int), self._place_u
        cumulative = np.cumsum(shape) / arrived
        sub = np.minimum(np.searchsorted(cumulative, self._place_u, side="right"), len(shape) - 1)
        before = np.where(sub > 0, cumulative[sub - 1], 0.0)
        into = np.clip((self._place_u - before) / np.maximum(shape[sub] / arrived, 1e-12), 0.0, 1.0)
        return sub, into

    def _prefill_wait(self, shape: np.ndarray, prefill: int, backlog_in: float, sub_s: float,
                      sub: np.ndarray, into: np.ndarray, prompt_mix: float = 1.0,
                      ) -> tuple[np.ndarray, float, float, np.ndarray]:
        """Each sampled prompt's wait for a prefill replica, the backlog left at the end of the step
        (replica-seconds), the step's utilisation and the requests prefilled per sub-step, from its
        arrivals per sub-step of `sub_s` (each sampled prompt in sub-step `sub`, a share `into` of the
        way through it: `_placement`).

        Between sub-steps the prompt work is a fluid: what arrives beyond the replicas' capacity piles
        up and later sub-steps drain it (Lindley's recursion, vectorised). A prompt arriving a share v
        into its sub-step waits for the backlog then ahead of it, plus: with one sub-step per step, an
        M/G/c wait (Erlang C with the Allen–Cunneen residual R = E[S²] / 2E[S], no more than half the
        step's own work: a queue cannot outgrow what arrived); with finer sub-steps, which already carry
        the arrivals' variance, the batched step in progress, with probability ρ.
        """
        service = self._service_mean * prompt_mix
        work = shape * service  # replica-seconds of prompts arriving per sub-step
        total_work = float(work.sum())
        step_s = sub_s * len(shape)
        if prefill <= 0:
            waits = np.full(len(self.isl), math.inf)
            return waits, backlog_in + total_work, math.inf if total_work > 0 else 0.0, np.zeros(len(shape))
        capacity = prefill * sub_s
        excess = work - capacity
        level = backlog_in + np.concatenate(([0.0], np.cumsum(excess)))
        backlog = level - np.minimum(np.minimum.accumulate(level), 0.0)  # at each sub-step boundary
        ahead = np.maximum(0.0, backlog[sub] + excess[sub] * into)
        rho = np.minimum(work / capacity, 0.99)
        if len(shape) == 1:  # Poisson within the step: the stationary M/G/c wait
            probability = erlang_c(prefill, rho * prefill)[sub]
            mean_wait = np.minimum(self._residual_s * prompt_mix / (prefill * (1.0 - rho)), work / (2 * prefill))[sub]
        else:  # the sub-steps carry the queue; a prompt finding its replica busy waits for the step in progress
            probability = rho[sub]
            mean_wait = np.full(len(sub), self._step_residual_s)
        tail = np.clip((self._wait_u - (1.0 - probability)) / np.maximum(probability, 1e-12), 0.0, 1.0 - 1e-12)
        queued = np.where(self._wait_u > 1.0 - probability, -np.log1p(-tail) * mean_wait, 0.0)
        prefilled = (backlog[:-1] + work - backlog[1:]) / service
        return ahead / prefill + queued, float(backlog[-1]), total_work / (prefill * step_s), prefilled

    def _itl(self, concurrency: float) -> float:
        batch = max(1, round(concurrency))
        return self.timing.decode_step_time(batch, int(batch * self.context))

    def _concurrency(self, per_replica_rps: float) -> tuple[float, bool]:
        if not math.isfinite(per_replica_rps):
            return self.decode_cap, True
        c = per_replica_rps * self.osl_mean * self._itl(1)
        for _ in range(50):
            following = per_replica_rps * self.osl_mean * self._itl(c)
            if following > self.decode_cap:
                return self.decode_cap, True
            if abs(following - c) < 1e-3:
                return following, False
            c = following
        return c, False

    def _lifetime_s(self) -> float:
        return float(self._lone_prefill.mean() + self.osl_mean * self._itl(1))

    def _advance(self, count: float) -> StepLatency:
        mid = self.now + self.step_s / 2
        result = self.latency(count / self.step_s, self.ready("prefill", mid), self.ready("decode", mid),
                              prefill_backlog=self._prefill_backlog, decode_backlog=self._decode_backlog,
                              decode_running=self._decode_sequences,
                              within=self.sub_arrivals[self._step], prompt_mix=float(self.prompt_mix[self._step]))
        self._prefill_backlog = result.prefill_backlog_s
        self._decode_backlog = result.decode_backlog_requests
        self._decode_sequences = result.decode_sequences
        return result


def lone_prefills_s(timing: perfmodel.PerformanceModel, isl: np.ndarray, budget: int) -> np.ndarray:
    """Each prompt's prefill alone on a replica (`lone_prefill_s`), priced once per distinct length."""
    lengths_, index = np.unique(np.asarray(isl, dtype=int), return_inverse=True)
    alone = np.array([lone_prefill_s(timing, int(n), budget) for n in lengths_])
    return alone[index]


def prompt_service_s(timing: perfmodel.PerformanceModel, isl: np.ndarray, budget: int, *,
                     alone: np.ndarray | None = None) -> np.ndarray:
    """What each prompt costs a prefill replica: its lone prefill (long prompts pay their quadratic
    attention; `alone` where the caller has it), or its share of a full batched step where that is
    more (short ones batch)."""
    alone = lone_prefills_s(timing, isl, budget) if alone is None else alone
    batched_tokens_per_s = budget / timing.prefill_time(budget)
    priced: np.ndarray = np.maximum(np.asarray(isl, dtype=float) / batched_tokens_per_s, alone)
    return priced


def step_prompt_mix(timing: perfmodel.PerformanceModel, budget: int, arrivals_s: np.ndarray, isl: np.ndarray, *,
                    step_s: float, steps: int) -> np.ndarray:
    """Per step, the mean prompt service of its arrivals over the whole trace's (1 where none arrive):
    the `prompt_mix` a request trace gives its fluid."""
    service = prompt_service_s(timing, isl, budget)
    index = np.minimum((np.asarray(arrivals_s) // step_s).astype(int), steps - 1)
    total = np.bincount(index, weights=service, minlength=steps)
    count = np.bincount(index, minlength=steps)
    overall = float(service.mean()) if len(service) else 1.0
    return np.where(count > 0, total / np.maximum(count, 1) / overall, 1.0)


def _weighted_percentile(samples: Sequence[np.ndarray], weights: np.ndarray, percentile: float) -> float:
    """The percentile of a mixture of equally sized samples, sample k weighing `weights[k]`."""
    values = np.concatenate(samples)
    each = np.repeat(np.asarray(weights, dtype=float) / max(len(samples[0]), 1), len(samples[0]))
    order = np.argsort(values)  # ties hold equal values: which of them comes first cannot change the answer
    cumulative = np.cumsum(each[order])
    if cumulative[-1] <= 0:
        return math.nan
    position = np.searchsorted(cumulative, percentile / 100.0 * cumulative[-1])
    return float(values[order[min(position, len(values) - 1)]])


def fluid_needs(fleet: FluidFleet, *, interval_s: float, sla: api.SlaTarget, attainment: float,
                bounds: Mapping[FleetPool, tuple[int, int]]) -> list[dict[FleetPool, int]]:
    """Per interval, the fewest prefill then decode replicas with which at least `attainment` of the
    servable sampled requests meet the SLA in every step of the interval: the oracle's needs on the
    fluid model.

    The steps run in order from empty queues, each taking the backlog the last one left, as the run
    will: a pool sized for one step alone can sit at utilisation 1, meet the share in that step and
    pile up a backlog over the next nine (ServeGen m-mid: 45 prefill replicas at 1,229 req/s met 95%
    in one step; in the run TTFT climbed past 1.8 s within the interval).
    """
    per = max(1, round(interval_s / fleet.step_s))
    count = math.ceil(len(fleet.arrivals) / per)
    ttft_target, itl_target = sla.ttft_ms / 1e3, sla.itl_ms / 1e3
    (p_lo, p_hi), (d_lo, d_hi) = bounds["prefill"], bounds["decode"]
    servable = fleet.servable(sla)
    share = max(float(servable.mean()), 1e-12)

    def met(latency: StepLatency, *, itl: bool) -> bool:
        good = servable & (latency.ttft <= ttft_target)
        if itl:
            good &= latency.itl <= itl_target
        return float(good.mean()) / share >= attainment - 1e-12

    def every_step(steps: range, prefill: int, decode: int, *, itl: bool) -> bool:
        prefill_backlog = decode_backlog = decoding = 0.0
        for k in steps:
            if fleet.arrivals[k] <= 0 and prefill_backlog <= 0 and decode_backlog <= 0:
                continue
            latency = fleet.latency(float(fleet.arrivals[k]) / fleet.step_s, prefill, decode,
                                    prefill_backlog=prefill_backlog, decode_backlog=decode_backlog,
                                    within=fleet.sub_arrivals[k], decode_running=decoding,
                                    prompt_mix=float(fleet.prompt_mix[k]))  # the step's own prompts, as a run prices them
            if fleet.arrivals[k] > 0 and not met(latency, itl=itl):
                return False
            prefill_backlog, decode_backlog = latency.prefill_backlog_s, latency.decode_backlog_requests
            decoding = latency.decode_sequences
        return True

    needs: list[dict[FleetPool, int]] = []
    for w in range(count):
        steps = range(w * per, min((w + 1) * per, len(fleet.arrivals)))
        if not fleet.arrivals[steps.start:steps.stop].any():
            needs.append({"prefill": p_lo, "decode": d_lo})
            continue
        last = needs[-1] if needs else {"prefill": p_lo, "decode": d_lo}  # the load moves little: start there
        prefill = fewest_near(max(p_lo, 1), p_hi, last["prefill"],
                              lambda p, s=steps: every_step(s, p, d_hi, itl=False))  # type: ignore[misc]
        decode = fewest_near(max(d_lo, 1), d_hi, last["decode"],
                             lambda d, s=steps, p=prefill: every_step(s, p, d, itl=True))  # type: ignore[misc]
        needs.append({"prefill": prefill, "decode": decode})
    return needs


def poisson_counts(rates_rps: Sequence[float] | np.ndarray, *, step_s: float, seed: int = 0) -> np.ndarray:
    """Arrivals per step of a Poisson process with the given per-step rates (ServeGen synthesis)."""
    rng = np.random.default_rng(seed)
    return rng.poisson(np.asarray(rates_rps, dtype=float) * step_s).astype(float)
