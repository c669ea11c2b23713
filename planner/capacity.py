"""The capacity model: what replicas sustain within the SLA, from a Profile.

Where it sits: step 3 of the planner (size) asks it how many prefill replicas the predicted prompts
need (`prefill_pool`) and how many requests per second one decode replica can take at the predicted
lengths without breaking the ITL target; `sizing` divides the decode rate by that. The planner's observe step also asks it what latency the profile expects
at the observed load (`expected_ttft_s`, `expected_itl_s`), so that observed/expected latency ratios
(the corrections) measure how wrong the profile is, not how loaded the fleet is. Pure: no I/O, no clock.

Prefill: a replica prefills prompts one after another (that is what the profile measured), so it is
a single-server queue whose service time is S = isl / prefill throughput. Prompt lengths vary around
the mean, so waiting is modelled as in an M/M/1 queue: the waiting time exceeds t with probability
ρ·exp(−(1−ρ)·t/S) at utilisation ρ. The TTFT at percentile p is then the lone-request TTFT plus the
p-quantile of the wait,

    W_p(ρ) = 0                              when ρ ≤ 1 − p   (at least p of the requests never wait)
    W_p(ρ) = S / (1 − ρ) · ln(ρ / (1 − p))  otherwise,

and a replica may run at the highest ρ with lone TTFT + W_p(ρ) ≤ target, never above
`max_utilization` (the queue model is optimistic near saturation, where bursts beyond Poisson and
forecast errors bite). Requests/s = ρ / S. Prompts are not batched with each other here: the profile
measured lone requests, so short prompts are sized conservatively (the corrections win that back).

Decode: a replica's ITL grows with the sequences it decodes at once. At the mean context of a running
request (isl + osl/2) the model takes the largest concurrency c with ITL ≤ target at every
concurrency up to c (the first crossing, so a noisy bump in the profile never lets it skip past a
violation), within the KV cache (c × context ≤ kv_capacity_tokens) and within the concurrencies the
profile measured: the ceiling. A KV cache or running-batch cap (the engine's, where known) is a wall,
past which requests wait for a slot without bound, so the ceiling is where a replica serves
`max_utilization` of the requests/s it serves at the wall (its rate, not its sequences: ITL grows with them).
The rate at concurrency c is share(c) × c / (osl × ITL(c)), where share = measured tokens/s × ITL / c is the part of the offered sequences the engine actually runs:
about 1 until its running-batch cap, then falling, because the rest queue (ITL stops growing there,
and so does throughput). The load sets the concurrency (Little's law: c = rate × osl × ITL), so a
replica sustains the best rate at any concurrency up to the ceiling; usually that is the rate at the
ceiling, but past a batch cap the rate can dip. Taking the best also makes the rate grow with the
target, whatever bumps the measurements have.

The prefill pool (`prefill_pool`, what sizing asks): the replicas a rate needs, not a rate per
replica, because how many replicas share the work changes what each can carry. Over the length mix
(`lengths.LengthMix`, from the frontend's histograms) each prompt length x has its service S(x) and
lone TTFT L(x); the pool is offered a = λ·E[S] Erlangs, and the TTFT at percentile p is the t with
Σₓ share(x)·P(L(x) + W > t) = 1 − p, so the long prompts of the mix, not its mean, decide whether the
percentile holds. The wait W lies between two ends, mixed by the pool's queue sharing π
(`late_share_pooled`): one shared queue (M/G/c: the Erlang-C chance to wait, then an exponential
wait of mean R / (c·(1 − ρ)), R = E[S²] / 2E[S], Allen–Cunneen), which is what Poisson arrivals and a
least-loaded router give, and c separate M/G/1 queues at λ/c each (the single replica above, with the
mix's R), which is closer to what clumped arrivals give (prompts that arrive together queue behind each
other however idle the pool is on average, where M/G/c says nothing waits: ADR 0021).
The planner learns π from its fleet's TTFT (`pooling_observed`); with many replicas the shared end
needs far fewer of them than the separate one. Without a mix every prompt is at the mean length with
exponential service (R = S). Decode with the mix takes the context a running sequence holds as the
size-biased mean E[isl] + E[osl²] / 2E[osl] (`decode_context`: long outputs run longer, so they are
more of what is running than of what arrives).

Interpolation is piecewise linear in the quantities that are close to linear, never in ratios of
them: prefill service time and TTFT in ISL (a prompt's cost is about a + b·isl; tokens/s = isl / time
is not linear), decode ITL and running share bilinear in (concurrency, context), which is exact for the
roofline ITL ≈ a + b·c + d·c·context. Outside the grid values are clamped to the nearest edge and the
result says `extrapolated`; past the longest ISL it is the per-token throughput that is clamped, so
times keep growing with the prompt.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from fleetpilot.api import profile as profiles
from fleetpilot.planner import lengths

DEFAULT_MAX_UTILIZATION = 0.9
# The two ends of queue sharing must differ by this much in their late share at the observed TTFT for
# the observation to say where between them a pool lies.
_POOLING_RESOLUTION = 0.02
DEFAULT_PERCENTILE = 90.0


@dataclasses.dataclass(frozen=True)
class Interpolated:
    """A value read off the profile grid, and whether the query lay outside it (clamped)."""

    value: float
    extrapolated: bool


@dataclasses.dataclass(frozen=True)
class TargetCheck:
    """Whether a latency target is reachable at all with this profile, and why not when it is not."""

    met: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class PrefillCapacity:
    """What one prefill replica sustains at an ISL and TTFT target, with the numbers behind it.

    `rate_rps` is 0 when the target is unreachable; `best_effort_rps` is then the rate at which the
    percentile sees no queueing (ρ = 1 − p), so TTFT at the percentile is the lone-request floor:
    the closest to the target more replicas can get.
    """

    rate_rps: float
    best_effort_rps: float
    utilization: float
    service_time_s: float
    lone_ttft_s: float
    target_met: bool
    extrapolated: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class PrefillPool:
    """How many prefill replicas a request rate needs within the TTFT target, with the numbers behind it.

    The pool is one queue (the frontend sends each prompt to the least-loaded replica), so a pool of
    many replicas runs each hotter than one replica alone could at the same percentile. When the target
    is out of reach for more than 1 − p of the prompts whatever the pool, `replicas` is the pool in
    which the percentile's request never waits (the closest more replicas get) and `target_met` False.
    """

    replicas: int
    utilization: float
    service_time_s: float
    lone_ttft_s: float  # at the percentile, over the prompt mix
    target_met: bool
    extrapolated: bool
    reason: str


DecodeLimit = Literal["itl", "kv", "grid", "engine", "unreachable"]


@dataclasses.dataclass(frozen=True)
class DecodeCapacity:
    """What one decode replica sustains at an ISL/OSL and ITL target, with the numbers behind it.

    `max_concurrency` is the ceiling and `limited_by` says what sets it: `itl` (the target), `kv`
    (the KV cache is full first), `grid` (the profile measured no higher concurrency), `engine` (the
    running-sequence cap the fleet has shown, which the profile may not know), `unreachable`
    (ITL exceeds the target even at the lowest measured concurrency; `best_effort_rps` is then the
    rate at that concurrency, the lowest ITL the profile knows). `concurrency` is where the best rate
    up to the ceiling is reached (usually the ceiling itself).
    """

    rate_rps: float
    best_effort_rps: float
    concurrency: float
    max_concurrency: float
    itl_s: float
    context_length: float
    limited_by: DecodeLimit
    target_met: bool
    extrapolated: bool
    reason: str


# -- interpolation -------------------------------------------------------------------------------------


def _lerp(xs: Sequence[float], ys: Sequence[float], x: float) -> Interpolated:
    """Piecewise-linear through (xs, ys), xs ascending; clamped to the end values outside."""
    if x <= xs[0]:
        return Interpolated(ys[0], x < xs[0])
    if x >= xs[-1]:
        return Interpolated(ys[-1], x > xs[-1])
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return Interpolated(y0 + (y1 - y0) * (x - x0) / (x1 - x0), False)


@dataclasses.dataclass(frozen=True)
class _Row:
    """One decode row: a context length and its points by concurrency, per replica, in seconds."""

    context: float
    concurrency: tuple[float, ...]
    itl_s: tuple[float, ...]
    running_share: tuple[float, ...]  # measured tokens/s × ITL / concurrency


@dataclasses.dataclass(frozen=True)
class _Bracket:
    """The decode rows around a context length: value = (1 − w)·low + w·high."""

    low: _Row
    high: _Row
    weight: float
    extrapolated: bool


def _wait_quantile(rho: float, *, service_s: float, percentile: float) -> float:
    """W_p of the M/M/1 waiting time at utilisation `rho` (see the module docstring)."""
    tail = 1.0 - percentile / 100.0
    if rho <= tail:
        return 0.0
    if rho >= 1.0:
        return math.inf
    return service_s / (1.0 - rho) * math.log(rho / tail)


@dataclasses.dataclass(frozen=True)
class _PrefillMix:
    """A prompt-length mix as prefill sees it: per length, its lone TTFT, its service time and its share."""

    lone_s: np.ndarray
    service_s: np.ndarray
    shares: np.ndarray
    mean_isl: float
    extrapolated: bool
    # E[S²] / 2E[S]: the mean residual service a waiting prompt sees (Allen–Cunneen's R). Over a real
    # mix it is the mix's own; at one mean length the old assumption holds, exponential service (R = S).
    residual_s: float

    @property
    def mean_service_s(self) -> float:
        return float(self.shares @ self.service_s)

    def late_share_pool(self, t: float, servers: int, rate_rps: float) -> float:
        """P(L(X) + W > t) for a pool of `servers` replicas the frontend sends each prompt to the least
        loaded of, offered `rate_rps` (M/G/c: the Erlang-C chance to wait, then an exponential wait of
        mean R / (c·(1 − ρ)), Allen–Cunneen)."""
        return self._late_curve(servers, rate_rps)(t)

    def _late_curve(self, servers: int, rate_rps: float) -> Callable[[float], float]:
        """`late_share_pool` of one pool and load as a function of t: what does not depend on t (the
        chance to wait, the wait's rate) worked out once, for a search that asks at many t."""
        shares, lone_s = self.shares, self.lone_s
        offered = rate_rps * self.mean_service_s
        if offered <= 0.0:
            return lambda t: float(shares[lone_s > t].sum())
        if servers <= 0 or offered >= servers:
            return lambda t: 1.0
        waits = float(erlang_c(servers, offered))
        theta = servers * (1.0 - offered / servers) / self.residual_s

        def late(t: float) -> float:
            slack = np.maximum(t - lone_s, 0.0)
            wait_tail = np.where(lone_s > t, 1.0, np.minimum(1.0, waits * np.exp(-theta * slack)))
            return float(shares @ wait_tail)
        return late

    def late_share_pooled(self, t: float, servers: int, rate_rps: float, pooling: float) -> float:
        """P(L(X) + W > t) for a pool between the two ends of how far its replicas share one queue:
        `pooling` 1 is M/G/c (prompts spread over the replicas as they free: Poisson arrivals and a
        least-loaded router), 0 is `servers` separate M/G/1 queues each offered its share (arrivals in
        clumps, or a router that cannot see what each replica has left). The planner learns where its
        fleet lies (`pooling_observed`)."""
        return self._late_pooled_curve(servers, rate_rps, pooling)(t)

    def _late_pooled_curve(self, servers: int, rate_rps: float, pooling: float) -> Callable[[float], float]:
        shared = self._late_curve(servers, rate_rps) if pooling > 0.0 else (lambda t: 0.0)
        separate = (self._late_curve(1, rate_rps / servers) if pooling < 1.0 and servers > 0
                    else (lambda t: 0.0))
        return lambda t: pooling * shared(t) + (1.0 - pooling) * separate(t)

    def lone_quantile_s(self, percentile: float) -> float:
        """The lone TTFT at `percentile` of the mix's requests (the floor no replica count removes)."""
        order = np.argsort(self.lone_s)
        cumulative = np.cumsum(self.shares[order])
        index = int(np.searchsorted(cumulative, percentile / 100.0 - 1e-12))
        return float(self.lone_s[order][min(index, len(order) - 1)])

    def ttft_quantile_s(self, rho: float, *, percentile: float, servers: int = 1, pooling: float = 1.0) -> float:
        """The TTFT at `percentile` with `servers` replicas each at utilisation ρ: the t at which the late
        share falls to 1 − p."""
        if rho >= 1.0:
            return math.inf
        tail = 1.0 - percentile / 100.0
        late = self._late_pooled_curve(servers, rho * servers / self.mean_service_s, pooling)
        low, high = 0.0, max(float(self.lone_s.max()), self.residual_s)
        while late(high) > tail:
            high *= 2.0
        # Bisection to `_TTFT_RESOLUTION_S` (relative, for answers over a second): far finer than any TTFT
        # target or measurement, in about 27 steps where a fixed 60 halvings spent 40% of an interval's
        # planning (benchmarks/planner_bench.py).
        while high - low > _TTFT_RESOLUTION_S * max(1.0, high):
            mid = (low + high) / 2.0
            if late(mid) > tail:
                low = mid
            else:
                high = mid
        return high


_DECODE_ANSWERS_KEPT = 4096  # a few intervals of a thousand graphs' lengths
# Halvings of [lowest, wall] when finding where a decode replica runs `max_utilization` of the wall's
# rate: 2⁻⁴⁰ of a few hundred sequences is far below one.
_WALL_BISECTIONS = 40
# How finely a TTFT quantile is searched for (seconds; relative beyond one second): a tenth of a microsecond.
_TTFT_RESOLUTION_S = 1e-7


@functools.lru_cache(maxsize=4096)
def _erlang_c_one(servers: int, offered: float) -> float:
    """Erlang C for one load, in plain floats (numpy per step is slower). Cached: a TTFT quantile's
    bisection asks for the same pool and load at every step (a third of a live interval's planning time
    went to recomputing it)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1.0 - b))


def erlang_c(servers: int, offered: float | np.ndarray) -> np.ndarray:
    """The probability that an arrival waits in an M/M/c queue with `offered` Erlangs of load (an array
    of loads at once: Erlang B's recursion, then B → C)."""
    if isinstance(offered, (int, float)):
        return np.asarray(_erlang_c_one(servers, float(offered)))
    offered = np.asarray(offered, dtype=float)
    blocking = np.ones_like(offered)
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    with np.errstate(divide="ignore", invalid="ignore"):
        waiting = servers * blocking / (servers - offered * (1.0 - blocking))
    return np.where(offered <= 0, 0.0, np.where(offered >= servers, 1.0, waiting))


class CapacityModel:
    """Per-replica capacity at latency targets, read from one Profile (one parallelism, one GPU kind).

    A disaggregated graph whose prefill and decode pools run different parallelisms needs one
    CapacityModel per pool, each from its own profile.
    """

    def __init__(self, profile: profiles.Profile, *, max_utilization: float = DEFAULT_MAX_UTILIZATION) -> None:
        if not 0.0 < max_utilization < 1.0:
            raise ValueError(f"max_utilization must lie in (0, 1), got {max_utilization}")
        self.profile = profile
        self.max_utilization = max_utilization
        gpus = profile.gpus_per_replica
        self._isl = tuple(float(p.isl) for p in profile.prefill)
        self._ttft_s = tuple(p.ttft_ms / 1e3 for p in profile.prefill)
        self._service_s = tuple(p.isl / (p.tokens_per_s_per_gpu * gpus) for p in profile.prefill)
        self._rows = tuple(
            _Row(
                context=float(context),
                concurrency=tuple(p.concurrency for p in row),
                itl_s=tuple(p.itl_ms / 1e3 for p in row),
                # c sequences cannot make more than c tokens per step: a share above 1 is noise.
                running_share=tuple(
                    min(1.0, p.tokens_per_s_per_gpu * gpus * p.itl_ms / 1e3 / p.concurrency) for p in row
                ),
            )
            for context, row in profile.decode_rows().items()
        )
        self._contexts = tuple(row.context for row in self._rows)
        # decode_capacity's answers by its arguments: the fast path asks it for the same lengths every
        # tick until the next interval's means (a quarter of a 14-day fluid backtest run went to asking).
        self._decode_answers = functools.lru_cache(maxsize=_DECODE_ANSWERS_KEPT)(self._decode_capacity)

    # -- prefill ------------------------------------------------------------------------------------------

    def prefill_service_s(self, isl: float) -> Interpolated:
        """How long one prompt occupies a prefill replica: isl / its prefill throughput at that ISL.

        Past the longest profiled ISL the edge throughput is kept, so the time keeps growing; below the
        shortest the time is clamped (a shorter prompt is not slower).
        """
        longest = self._isl[-1]
        if isl > longest:
            return Interpolated(isl * self._service_s[-1] / longest, True)
        return _lerp(self._isl, self._service_s, isl)

    def prefill_tokens_per_s(self, isl: float) -> Interpolated:
        """Prefill throughput of one replica at this ISL (tokens/s)."""
        service = self.prefill_service_s(isl)
        return Interpolated(isl / service.value, service.extrapolated)

    def lone_ttft_s(self, isl: float) -> Interpolated:
        """TTFT of a request alone on a replica: the floor no number of replicas gets under.

        Past the longest profiled ISL the extra tokens cost the edge throughput, so TTFT keeps growing;
        below the shortest it is clamped (a shorter prompt is not slower).
        """
        longest = self._isl[-1]
        if isl > longest:
            extra = (isl - longest) * self._service_s[-1] / longest
            return Interpolated(self._ttft_s[-1] + extra, True)
        return _lerp(self._isl, self._ttft_s, isl)

    def check_ttft_target(self, isl: float, ttft_target_s: float) -> TargetCheck:
        """Whether any number of prefill replicas can meet the TTFT target at this ISL."""
        lone = self.lone_ttft_s(isl)
        note = " (extrapolated beyond the profile)" if lone.extrapolated else ""
        if lone.value > ttft_target_s:
            return TargetCheck(
                False,
                f"TTFT target {ttft_target_s * 1e3:.0f} ms is unreachable at ISL {isl:.0f}: a lone request "
                f"already takes {lone.value * 1e3:.0f} ms{note}",
            )
        return TargetCheck(True, f"lone-request TTFT {lone.value * 1e3:.0f} ms at ISL {isl:.0f}{note}")

    def _prefill_mix(self, mix: lengths.LengthMix | None, isl: float) -> _PrefillMix:
        """Lone TTFT and service time at each length of the mix, with its shares; without a mix, every
        prompt at `isl` with exponentially distributed service (prompt lengths vary around the mean)."""
        points = mix if mix is not None else lengths.point(isl)
        lone = [self.lone_ttft_s(x) for x in points.lengths]
        service = [self.prefill_service_s(x) for x in points.lengths]
        service_s = np.array([v.value for v in service])
        shares = np.array(points.shares)
        mean = float(shares @ service_s)
        residual = float(shares @ service_s**2) / (2.0 * mean) if mix is not None else mean
        return _PrefillMix(
            lone_s=np.array([v.value for v in lone]), service_s=service_s, shares=shares, mean_isl=points.mean,
            extrapolated=any(v.extrapolated for v in (*lone, *service)), residual_s=residual)

    def prefill_mean_service_s(self, isl: float, *, mix: lengths.LengthMix | None = None) -> float:
        """How long a prompt occupies a prefill replica on average: over the `mix`, or at `isl`."""
        return self._prefill_mix(mix, isl).mean_service_s

    def prefill_capacity(
        self, isl: float, ttft_target_s: float, *, percentile: float = DEFAULT_PERCENTILE
    ) -> PrefillCapacity:
        """Requests/s one prefill replica alone sustains with TTFT at `percentile` under the target, every
        prompt at `isl` (the M/M/1 of the module docstring): what a pool of separate queues multiplies."""
        _check_positive(isl=isl, ttft_target_s=ttft_target_s)
        _check_percentile(percentile)
        service = self.prefill_service_s(isl)
        lone = self.lone_ttft_s(isl)
        extrapolated = service.extrapolated or lone.extrapolated
        tail = 1.0 - percentile / 100.0
        best_effort = min(tail, self.max_utilization) / service.value
        check = self.check_ttft_target(isl, ttft_target_s)
        if not check.met:
            return PrefillCapacity(
                rate_rps=0.0,
                best_effort_rps=best_effort,
                utilization=0.0,
                service_time_s=service.value,
                lone_ttft_s=lone.value,
                target_met=False,
                extrapolated=extrapolated,
                reason=check.reason,
            )
        rho = self._highest_utilization(
            slack_s=ttft_target_s - lone.value, service_s=service.value, percentile=percentile
        )
        capped = rho >= self.max_utilization
        rho = min(rho, self.max_utilization)
        rate = rho / service.value
        why = f"utilisation cap {self.max_utilization:.0%}" if capped else f"p{percentile:g} queueing"
        reason = (
            f"{rate:.3g} req/s per prefill replica at ISL {isl:.0f}: {service.value * 1e3:.1f} ms per prompt, "
            f"utilisation {rho:.0%} ({why}) keeps p{percentile:g} TTFT ≤ {ttft_target_s * 1e3:.0f} ms"
            + (" (extrapolated beyond the profile)" if extrapolated else "")
        )
        return PrefillCapacity(
            rate_rps=rate,
            best_effort_rps=best_effort,
            utilization=rho,
            service_time_s=service.value,
            lone_ttft_s=lone.value,
            target_met=True,
            extrapolated=extrapolated,
            reason=reason,
        )

    def prefill_rate_per_replica(
        self, isl: float, ttft_target_s: float, *, percentile: float = DEFAULT_PERCENTILE
    ) -> float:
        """Requests/s one prefill replica sustains within the TTFT target; 0 when unreachable."""
        return self.prefill_capacity(isl, ttft_target_s, percentile=percentile).rate_rps

    def expected_ttft_s(
        self, isl: float, rate_per_replica: float, *, percentile: float = DEFAULT_PERCENTILE
    ) -> float:
        """TTFT at `percentile` the model expects of one replica alone offered `rate_per_replica`, every
        prompt at `isl` (infinite at or beyond saturation); `expected_ttft_pool_s` is the pool's.
        """
        _check_percentile(percentile)
        service = self.prefill_service_s(isl).value
        rho = max(0.0, rate_per_replica) * service
        return self.lone_ttft_s(isl).value + _wait_quantile(rho, service_s=service, percentile=percentile)

    @staticmethod
    def _highest_utilization(*, slack_s: float, service_s: float, percentile: float) -> float:
        """The largest ρ with W_p(ρ) ≤ slack. W_p rises monotonically from 0 at ρ = 1 − p to ∞ at 1."""
        tail = 1.0 - percentile / 100.0
        low, high = tail, 1.0
        # Bisection: 60 halvings pin ρ to 1e-18, far below anything a replica count can resolve.
        for _ in range(60):
            mid = (low + high) / 2.0
            if _wait_quantile(mid, service_s=service_s, percentile=percentile) <= slack_s:
                low = mid
            else:
                high = mid
        return low

    def prefill_pool(self, rate_rps: float, ttft_target_s: float, *, isl: float,
                     percentile: float = DEFAULT_PERCENTILE, mix: lengths.LengthMix | None = None,
                     pooling: float = 1.0, most: int | None = None) -> PrefillPool:
        """The fewest prefill replicas that serve `rate_rps` with TTFT at `percentile` under the target
        (over the prompt-length `mix`, or exponential service at `isl`; `pooling` as in
        `late_share_pooled`), never above `max_utilization`. `most`: no answer above it is any use (the
        pool's scaling.max); a load that needs more gets `most` without the search, whose cost grows
        with the replica count (a garbage rate of 10⁹ requests/s must not stall the planner)."""
        _check_positive(isl=isl, ttft_target_s=ttft_target_s)
        _check_percentile(percentile)
        work = self._prefill_mix(mix, isl)
        service, tail = work.mean_service_s, 1.0 - percentile / 100.0
        lone_p = work.lone_quantile_s(percentile)
        offered = max(rate_rps, 0.0) * service
        if offered <= 0.0:
            return PrefillPool(0, 0.0, service, lone_p, True, work.extrapolated, "no prompts to prefill")
        late_alone = float(work.shares[work.lone_s > ttft_target_s].sum())
        reachable = late_alone <= tail

        def enough(servers: int) -> bool:
            # (1e-9: a pool exactly at the target is enough; floating point must not buy one more replica)
            if reachable:
                return work.late_share_pooled(ttft_target_s, servers, rate_rps, pooling) <= tail + 1e-9
            # Out of reach for more than 1 − p of the prompts: a pool in which the percentile never waits.
            return pooling * float(erlang_c(servers, offered)) + (1.0 - pooling) * offered / servers <= tail + 1e-9

        mix_words = (f"over the prompt-length mix (mean {work.mean_isl:.0f} tokens, p{percentile:g} alone "
                     f"{lone_p * 1e3:.0f} ms)" if mix is not None else f"at ISL {isl:.0f}")
        shared = f", queue sharing {pooling:.2f}" if pooling < 1.0 else ""
        note = " (extrapolated beyond the profile)" if work.extrapolated else ""
        start = max(1, math.ceil(offered / self.max_utilization - 1e-9))
        if most is not None and most >= 1 and (start >= most or not enough(most)):
            rho = offered / most
            return PrefillPool(most, rho, service, lone_p, reachable, work.extrapolated,
                               f"{rate_rps:.3g} req/s {mix_words}: {service * 1e3:.1f} ms per prompt, more than"
                               f" {most} replicas needed (utilisation {rho:.0%} at {most}){shared}{note}")
        servers = _fewest_from(start, enough)
        rho = offered / servers
        if not reachable:
            reason = (f"TTFT target {ttft_target_s * 1e3:.0f} ms is out of reach for {late_alone:.0%} of the prompts "
                      f"{mix_words} even alone (p{percentile:g} allows {tail:.0%}): {servers} replicas so that "
                      f"p{percentile:g} requests never queue{shared}{note}")
        else:
            reason = (f"{rate_rps:.3g} req/s {mix_words}: {service * 1e3:.1f} ms per prompt, {servers} replicas at "
                      f"utilisation {rho:.0%} keep p{percentile:g} TTFT ≤ {ttft_target_s * 1e3:.0f} ms{shared}{note}")
        return PrefillPool(servers, rho, service, lone_p, reachable, work.extrapolated, reason)

    def expected_ttft_pool_s(self, rate_rps: float, replicas: int, *, isl: float,
                             percentile: float = DEFAULT_PERCENTILE, mix: lengths.LengthMix | None = None,
                             pooling: float = 1.0) -> float:
        """TTFT at `percentile` the model expects of a pool of `replicas` offered `rate_rps` (infinite at
        or beyond saturation): what the planner compares the observed TTFT with."""
        _check_percentile(percentile)
        work = self._prefill_mix(mix, isl)
        if replicas <= 0:
            return math.inf
        rho = max(rate_rps, 0.0) * work.mean_service_s / replicas
        return work.ttft_quantile_s(rho, percentile=percentile, servers=replicas, pooling=pooling)

    def pooling_observed(self, observed_s: float, rate_rps: float, replicas: int, *, isl: float,
                         percentile: float = DEFAULT_PERCENTILE, mix: lengths.LengthMix | None = None) -> float:
        """Where between one shared queue (1) and separate queues (0) a pool lies, from the TTFT its
        percentile request saw (`observed_s`, on the profile's clock): the `pooling` at which the model's
        late share at `observed_s` is exactly 1 − p. Clamped to [0, 1]; NaN when the two ends agree
        there (nobody waited, or everyone did), so the observation says nothing about the queue.
        """
        _check_percentile(percentile)
        if replicas <= 0 or not (observed_s > 0 and math.isfinite(observed_s)):
            return math.nan
        work = self._prefill_mix(mix, isl)
        if rate_rps * work.mean_service_s >= replicas:
            return math.nan
        tail = 1.0 - percentile / 100.0
        shared = work.late_share_pool(observed_s, replicas, rate_rps)
        separate = work.late_share_pool(observed_s, 1, rate_rps / replicas)
        if separate - shared < _POOLING_RESOLUTION:
            return math.nan
        return min(1.0, max(0.0, (separate - tail) / (separate - shared)))

    # -- decode -------------------------------------------------------------------------------------------

    def _bracket(self, context: float) -> _Bracket:
        rows, contexts = self._rows, self._contexts
        if context <= contexts[0]:
            return _Bracket(rows[0], rows[0], 0.0, context < contexts[0])
        if context >= contexts[-1]:
            return _Bracket(rows[-1], rows[-1], 0.0, context > contexts[-1])
        i = bisect.bisect_right(contexts, context)
        low, high = rows[i - 1], rows[i]
        return _Bracket(low, high, (context - low.context) / (high.context - low.context), False)

    @staticmethod
    def _along(bracket: _Bracket, concurrency: float, field: Literal["itl_s", "running_share"]) -> Interpolated:
        low = _lerp(bracket.low.concurrency, getattr(bracket.low, field), concurrency)
        high = _lerp(bracket.high.concurrency, getattr(bracket.high, field), concurrency)
        w = bracket.weight
        return Interpolated(
            (1.0 - w) * low.value + w * high.value,
            bracket.extrapolated or low.extrapolated or (w > 0.0 and high.extrapolated),
        )

    def itl_s(self, concurrency: float, context_length: float) -> Interpolated:
        """ITL of one replica decoding `concurrency` sequences of `context_length` tokens."""
        return self._along(self._bracket(context_length), concurrency, "itl_s")

    def running_share(self, concurrency: float, context_length: float) -> Interpolated:
        """Share of `concurrency` offered sequences the engine runs at once (1 below its batch cap)."""
        return self._along(self._bracket(context_length), concurrency, "running_share")

    def decode_tokens_per_s(self, concurrency: float, context_length: float) -> Interpolated:
        """Output tokens/s of one replica: running share × concurrency / ITL."""
        bracket = self._bracket(context_length)
        itl = self._along(bracket, concurrency, "itl_s")
        share = self._along(bracket, concurrency, "running_share")
        return Interpolated(share.value * concurrency / itl.value, itl.extrapolated or share.extrapolated)

    def _concurrency_range(self, bracket: _Bracket) -> tuple[float, float]:
        """The lowest and highest concurrency the profile measured around this context."""
        w = bracket.weight
        lowest = (1.0 - w) * bracket.low.concurrency[0] + w * bracket.high.concurrency[0]
        highest = (1.0 - w) * bracket.low.concurrency[-1] + w * bracket.high.concurrency[-1]
        return lowest, highest

    def check_itl_target(self, isl: float, osl: float, itl_target_s: float, *,
                         context_length: float | None = None) -> TargetCheck:
        """Whether any number of decode replicas can meet the ITL target at this ISL/OSL."""
        context = context_length if context_length is not None else isl + osl / 2.0
        bracket = self._bracket(context)
        lowest, _ = self._concurrency_range(bracket)
        if context > self.profile.kv_capacity_tokens:
            return TargetCheck(
                False,
                f"a request's mean context ({context:.0f} tokens) exceeds the KV cache of one decode replica "
                f"({self.profile.kv_capacity_tokens} tokens)",
            )
        floor = self.itl_s(lowest, context)
        note = " (extrapolated beyond the profile)" if floor.extrapolated else ""
        if floor.value > itl_target_s:
            return TargetCheck(
                False,
                f"ITL target {itl_target_s * 1e3:.1f} ms is unreachable at context {context:.0f}: even "
                f"{lowest:g} sequence(s) at once take {floor.value * 1e3:.1f} ms per token{note}",
            )
        return TargetCheck(True, f"ITL {floor.value * 1e3:.1f} ms at concurrency {lowest:g}{note}")

    def decode_capacity(self, isl: float, osl: float, itl_target_s: float, *,
                        max_running: float | None = None, context_length: float | None = None) -> DecodeCapacity:
        """Requests/s one decode replica sustains with ITL under the target (see the module docstring).

        `max_running`: the most sequences a replica of the fleet has been seen to run at once (an
        engine's batch cap, e.g. vLLM's max_num_seqs); the ceiling never passes it. `context_length`:
        the mean context of a running sequence when known from the length mix (`decode_context`);
        by default isl + osl / 2.
        """
        return self._decode_answers(isl, osl, itl_target_s, max_running, context_length)

    def _decode_capacity(self, isl: float, osl: float, itl_target_s: float, max_running: float | None,
                         context_length: float | None) -> DecodeCapacity:
        _check_positive(isl=isl, osl=osl, itl_target_s=itl_target_s)
        context = context_length if context_length is not None else isl + osl / 2.0
        bracket = self._bracket(context)
        lowest, reach = self._concurrency_range(bracket)
        kv_bound = self.profile.kv_capacity_tokens / context
        check = self.check_itl_target(isl, osl, itl_target_s, context_length=context)
        if not check.met:
            floor_c = min(lowest, max(kv_bound, 0.0))
            best = self._rate_at(floor_c, context, osl) if floor_c > 0 else 0.0
            return DecodeCapacity(
                rate_rps=0.0,
                best_effort_rps=best,
                concurrency=0.0,
                max_concurrency=0.0,
                itl_s=self.itl_s(lowest, context).value,
                context_length=context,
                limited_by="unreachable",
                target_met=False,
                extrapolated=bracket.extrapolated,
                reason=check.reason,
            )
        top = min(reach, kv_bound)
        limit: DecodeLimit = "kv" if kv_bound < reach else "grid"
        if max_running is not None and 0 < max_running < top:
            top, limit = max(max_running, lowest), "engine"
        if limit != "grid":
            # A full KV cache or running batch is a wall, not a slope: at it, requests queue for a slot
            # without bound, so a replica is planned below it as a prefill replica is planned below
            # saturation (`max_utilization` of the rate it serves there).
            top = self._below_the_wall(top, lowest, context, osl)
        ceiling = top
        # ITL is linear in concurrency between the rows' breakpoints: walk them, stop at the first
        # crossing of the target and solve that segment exactly.
        points = sorted({c for c in (*bracket.low.concurrency, *bracket.high.concurrency) if lowest < c < top})
        previous = min(lowest, top)
        previous_itl = self.itl_s(previous, context).value
        walked = [previous]
        for c in (*points, top):
            itl = self.itl_s(c, context).value
            if itl > itl_target_s:
                ceiling = previous + (itl_target_s - previous_itl) * (c - previous) / (itl - previous_itl)
                limit = "itl"
                break
            previous, previous_itl = c, itl
            walked.append(c)
        if walked[-1] != ceiling:
            walked.append(ceiling)
        # Load sets the concurrency (Little's law), so a replica sustains the best rate at any
        # concurrency up to the ceiling, not necessarily the rate at the ceiling: past an engine's batch
        # cap the rate can dip while ITL still meets the target.
        concurrency = max(self._rate_candidates(walked, context), key=lambda c: (self._rate_at(c, context, osl), c))
        itl_at = self.itl_s(concurrency, context)
        share = self.running_share(concurrency, context)
        rate = share.value * concurrency / (osl * itl_at.value)
        extrapolated = itl_at.extrapolated or share.extrapolated
        # Measured engines run a little under every offered sequence; far under means the engine hit
        # its running-batch cap and the rest queue, which is worth saying.
        saturated = share.value < 0.9
        reason = (
            f"{rate:.3g} req/s per decode replica at context {context:.0f}: concurrency {concurrency:.1f} "
            f"at ITL {itl_at.value * 1e3:.1f} ms (target {itl_target_s * 1e3:.1f} ms); ceiling {ceiling:.1f} "
            f"set by {_LIMIT_WORDS[limit]}"
            + (f"; the engine runs only {share.value:.0%} of them at once" if saturated else "")
            + (" (extrapolated beyond the profile)" if extrapolated else "")
        )
        return DecodeCapacity(
            rate_rps=rate,
            best_effort_rps=rate,
            concurrency=concurrency,
            max_concurrency=ceiling,
            itl_s=itl_at.value,
            context_length=context,
            limited_by=limit,
            target_met=True,
            extrapolated=extrapolated,
            reason=reason,
        )

    def _below_the_wall(self, wall: float, lowest: float, context: float, osl: float) -> float:
        """The concurrency at which a replica serves `max_utilization` of the requests/s it serves at
        its wall (a full KV cache or batch cap), found by bisection.

        The margin is kept in requests/s, as for prefill, not in sequences: ITL grows with the
        sequences, so a replica's rate flattens towards the wall and 90% of the wall's sequences still
        serve nearly all of its rate (~98% on the H200 profile's 256 slots: ADR 0023), and a load that
        rises within an interval meets the wall.
        """
        if wall <= lowest:
            return wall
        wanted = self.max_utilization * self._rate_at(wall, context, osl)
        if self._rate_at(lowest, context, osl) >= wanted:
            return lowest
        low, high = lowest, wall
        for _ in range(_WALL_BISECTIONS):
            mid = (low + high) / 2.0
            if self._rate_at(mid, context, osl) < wanted:
                low = mid
            else:
                high = mid
        return low

    def decode_rate_per_replica(self, isl: float, osl: float, itl_target_s: float) -> float:
        """Requests/s one decode replica sustains within the ITL target; 0 when unreachable."""
        return self.decode_capacity(isl, osl, itl_target_s).rate_rps

    def _rate_candidates(self, walked: Sequence[float], context: float) -> list[float]:
        """Where the rate share(c)·c / ITL(c) can peak on the walked segments: their ends, and any
        interior point where its derivative vanishes.

        On a segment ITL = a + b·c and share = p + q·c, so the rate ∝ (p·c + q·c²) / (a + b·c), whose
        derivative is zero where q·b·c² + 2·q·a·c + p·a = 0.
        """
        candidates = list(walked)
        for c0, c1 in itertools.pairwise(walked):
            if c1 <= c0:
                continue
            i0, i1 = self.itl_s(c0, context).value, self.itl_s(c1, context).value
            s0, s1 = self.running_share(c0, context).value, self.running_share(c1, context).value
            b, q = (i1 - i0) / (c1 - c0), (s1 - s0) / (c1 - c0)
            a, p = i0 - b * c0, s0 - q * c0
            candidates.extend(c for c in _roots(q * b, 2.0 * q * a, p * a) if c0 < c < c1)
        return candidates

    def _rate_at(self, concurrency: float, context: float, osl: float) -> float:
        return self.decode_tokens_per_s(concurrency, context).value / osl

    def expected_itl_s(self, isl: float, osl: float, rate_per_replica: float, *,
                       context_length: float | None = None) -> float:
        """ITL the model expects when each decode replica gets `rate_per_replica` requests/s.

        By Little's law the replica holds c = rate × osl × ITL(c) sequences; the fixed point is found
        by bisection on c (the rate a concurrency sustains grows with it). Beyond what the profile's
        reach or the KV cache allows, the ITL there is returned (the excess queues instead).
        """
        _check_positive(isl=isl, osl=osl)
        context = context_length if context_length is not None else isl + osl / 2.0
        bracket = self._bracket(context)
        lowest, reach = self._concurrency_range(bracket)
        top = max(min(reach, self.profile.kv_capacity_tokens / context), lowest)
        if rate_per_replica <= 0 or self._rate_at(lowest, context, osl) >= rate_per_replica:
            return self.itl_s(lowest, context).value
        if self._rate_at(top, context, osl) <= rate_per_replica:
            return self.itl_s(top, context).value
        low, high = lowest, top
        for _ in range(60):
            mid = (low + high) / 2.0
            if self._rate_at(mid, context, osl) < rate_per_replica:
                low = mid
            else:
                high = mid
        return self.itl_s(high, context).value


def decode_context(isl_mean: float, osl: lengths.LengthMix | None, osl_mean: float) -> float:
    """The mean context a running sequence holds: E[isl] + E[osl²] / 2E[osl] over the output mix when
    known (a sequence runs as long as it generates, so long outputs are over-represented among the
    running), else isl + osl / 2 at the means."""
    if osl is None:
        return isl_mean + osl_mean / 2.0
    return isl_mean + osl.size_biased_mean / 2.0


_LIMIT_WORDS: dict[DecodeLimit, str] = {
    "itl": "the ITL target",
    "kv": "the KV cache",
    "grid": "the highest concurrency the profile measured",
    "engine": "the sequences a replica of the fleet ran at most",
    "unreachable": "an unreachable target",
}


def fewest(lo: int, hi: int, enough: Callable[[int], bool]) -> int:
    """The smallest n in [lo, hi] for which `enough(n)` holds (taken as monotone), by bisection; `hi`
    when none does. Replica counts run to the hundreds: a linear walk would evaluate each one."""
    if enough(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def fewest_near(lo: int, hi: int, guess: int, enough: Callable[[int], bool]) -> int:
    """`fewest(lo, hi, enough)` found from `guess` outwards: steps doubling away from it until `enough`
    changes, then bisection between. Where the answer lies near the guess (the last interval's, for a
    load that moves a little), a few evaluations instead of log2(hi − lo); the same answer either way
    for a monotone `enough`."""
    guess = min(max(guess, lo), hi)
    step = 1
    if enough(guess):
        high = guess
        while high > lo:
            low = max(lo, high - step)
            if not enough(low):
                return fewest(low + 1, high, enough)  # low is short: the answer lies in (low, high]
            high, step = low, step * 2
        return lo
    low = guess
    while low < hi:
        high = min(hi, low + step)
        if enough(high):
            return fewest(low + 1, high, enough)
        low, step = high, step * 2
    return hi


def _fewest_from(start: int, enough: Callable[[int], bool]) -> int:
    """The least n ≥ `start` with `enough(n)`, `enough` monotone and true somewhere: doubling to a bound,
    then `fewest`."""
    low, high = start, start
    while not enough(high):
        low, high = high, high * 2
    return fewest(low, high, enough)


def _roots(a: float, b: float, c: float) -> list[float]:
    """Real roots of a·x² + b·x + c (a or b may be 0; none when the equation is trivial)."""
    if a == 0.0:
        return [-c / b] if b != 0.0 else []
    disc = b * b - 4.0 * a * c
    if disc < 0.0:
        return []
    root = math.sqrt(disc)
    return [(-b - root) / (2.0 * a), (-b + root) / (2.0 * a)]


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive finite number, got {value}")


def _check_percentile(percentile: float) -> None:
    if not 0.0 < percentile < 100.0:
        raise ValueError(f"percentile must lie in (0, 100), got {percentile}")
