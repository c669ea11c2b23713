"""The capacity model: requests per second one replica sustains within the SLA, from a Profile.

Where it sits: step 3 of the planner (size) asks it, per component, how many requests per second one
replica can take at the predicted ISL/OSL without breaking the TTFT or ITL target; `sizing` divides
the predicted rate by that. The planner's observe step also asks it what latency the profile expects
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
profile measured: the ceiling. The rate at concurrency c is share(c) × c / (osl × ITL(c)), where
share = measured tokens/s × ITL / c is the part of the offered sequences the engine actually runs:
about 1 until its running-batch cap, then falling, because the rest queue (ITL stops growing there,
and so does throughput). The load sets the concurrency (Little's law: c = rate × osl × ITL), so a
replica sustains the best rate at any concurrency up to the ceiling; usually that is the rate at the
ceiling, but past a batch cap the rate can dip. Taking the best also makes the rate grow with the
target, whatever bumps the measurements have.

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
import itertools
import math
from collections.abc import Sequence
from typing import Literal

from fleetpilot.api import profile as profiles

DEFAULT_MAX_UTILIZATION = 0.9
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

    def prefill_capacity(
        self, isl: float, ttft_target_s: float, *, percentile: float = DEFAULT_PERCENTILE
    ) -> PrefillCapacity:
        """Requests/s one prefill replica sustains with TTFT at `percentile` under the target."""
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
        """TTFT at `percentile` the model expects when each prefill replica gets `rate_per_replica`.

        Infinite at or beyond saturation. The planner divides the observed TTFT by this to get the
        prefill correction.
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

    def check_itl_target(self, isl: float, osl: float, itl_target_s: float) -> TargetCheck:
        """Whether any number of decode replicas can meet the ITL target at this ISL/OSL."""
        context = isl + osl / 2.0
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
                        max_running: float | None = None) -> DecodeCapacity:
        """Requests/s one decode replica sustains with ITL under the target (see the module docstring).

        `max_running`: the most sequences a replica of the fleet has been seen to run at once (an
        engine's batch cap, e.g. vLLM's max_num_seqs); the ceiling never passes it.
        """
        _check_positive(isl=isl, osl=osl, itl_target_s=itl_target_s)
        context = isl + osl / 2.0
        bracket = self._bracket(context)
        lowest, reach = self._concurrency_range(bracket)
        kv_bound = self.profile.kv_capacity_tokens / context
        check = self.check_itl_target(isl, osl, itl_target_s)
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

    def expected_itl_s(self, isl: float, osl: float, rate_per_replica: float) -> float:
        """ITL the model expects when each decode replica gets `rate_per_replica` requests/s.

        By Little's law the replica holds c = rate × osl × ITL(c) sequences; the fixed point is found
        by bisection on c (the rate a concurrency sustains grows with it). Beyond what the profile's
        reach or the KV cache allows, the ITL there is returned (the excess queues instead).
        """
        _check_positive(isl=isl, osl=osl)
        context = isl + osl / 2.0
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


_LIMIT_WORDS: dict[DecodeLimit, str] = {
    "itl": "the ITL target",
    "kv": "the KV cache",
    "grid": "the highest concurrency the profile measured",
    "engine": "the sequences a replica of the fleet ran at most",
    "unreachable": "an unreachable target",
}


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
