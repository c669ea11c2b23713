"""The last step of a replay: from per-request results to the numbers an SLA is judged by.

Latency percentiles (TTFT, ITL, end-to-end) of the requests that succeeded, throughput, and goodput:
the requests that succeeded *and* met every bound of the SLA, as a count, a fraction of all
requests and a rate. Errors count against goodput; that is the point of it. Pure: results in,
a `Summary` (plain data, JSON-ready through `summary_dict`) or a rich renderable out; the caller
prints or writes it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table

if TYPE_CHECKING:  # only for annotations: the report needs no HTTP client
    from fleetpilot import traces
    from fleetpilot.replay import client

PERCENTILES = (50, 90, 95, 99)
_SLA_PART = re.compile(r"^\s*(?P<key>[a-z_][a-z0-9_]*)\s*[=:]\s*(?P<value>[0-9.]+)\s*(?P<unit>ms|s)?\s*$")
_SLA_KEYS = {
    "ttft": "ttft_ms",
    "itl": "itl_ms",
    "tpot": "itl_ms",
    "latency": "latency_ms",
    "e2e": "latency_ms",
}


@dataclass(frozen=True, slots=True)
class Sla:
    """Bounds a good request stays within; None means that metric is not judged."""

    ttft_ms: float | None = 500.0
    itl_ms: float | None = 50.0
    latency_ms: float | None = None

    def __str__(self) -> str:
        parts = [
            f"{name}≤{value:g}ms"
            for name, value in (("ttft", self.ttft_ms), ("itl", self.itl_ms), ("latency", self.latency_ms))
            if value is not None
        ]
        return ", ".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean and percentiles of one latency, in milliseconds, over `count` requests."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    maximum: float


@dataclass(frozen=True, slots=True)
class Summary:
    """One replay in numbers. Rates are per second of `duration_s`, the first send to the last answer."""

    count: int
    ok: int
    errors: int
    cancelled: int
    duration_s: float
    request_rate_rps: float  # requests finished (any status) per second
    output_tokens: int  # received by the requests that succeeded
    output_tokens_per_s: float
    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    latency_ms: Distribution | None
    lateness_ms: Distribution | None  # the client's own scheduling delay: large values void the run
    sla: Sla
    good: int
    goodput_fraction: float  # of all requests, failed ones included
    goodput_rps: float
    error_kinds: dict[str, int]  # the most common error messages (first line, shortened)


@dataclass(frozen=True, slots=True)
class TraceStats:
    """What a prepared trace asks for, before it is sent (`--dry-run`)."""

    count: int
    span_s: float
    rate_rps: float
    input_tokens: Distribution | None
    output_tokens: Distribution | None
    with_prefix_blocks: int


def parse_sla(text: str) -> Sla:
    """`ttft=500ms,itl=50ms` (also `latency=10s`; a bare number is ms; `tpot` = itl, `e2e` = latency).

    Metrics not named are not judged, so `itl=50` alone makes a decode-only SLA.
    """
    bounds: dict[str, float] = {}
    for part in filter(str.strip, text.split(",")):
        match = _SLA_PART.match(part.lower())
        if match is None or match["key"] not in _SLA_KEYS:
            raise ValueError(
                f"bad SLA bound {part.strip()!r}: expected e.g. ttft=500ms, itl=50ms, latency=10s"
            )
        try:
            value = float(match["value"])
        except ValueError as error:
            raise ValueError(f"bad SLA bound {part.strip()!r}: {match['value']!r} is not a number") from error
        bounds[_SLA_KEYS[match["key"]]] = value * (1000.0 if match["unit"] == "s" else 1.0)
    return Sla(
        ttft_ms=bounds.get("ttft_ms"), itl_ms=bounds.get("itl_ms"), latency_ms=bounds.get("latency_ms")
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100), interpolating linearly between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Iterable[float]) -> Distribution | None:
    """Mean, p50/p90/p95/p99 and maximum of `values`; None when there are none."""
    data = sorted(values)
    if not data:
        return None
    p50, p90, p95, p99 = (percentile(data, q) for q in PERCENTILES)
    return Distribution(
        count=len(data), mean=sum(data) / len(data), p50=p50, p90=p90, p95=p95, p99=p99, maximum=data[-1]
    )


def meets(result: client.Result, sla: Sla) -> bool:
    """Whether a request succeeded within every bound of `sla`.

    A bound on a metric the request has no value for fails (no TTFT without streaming), except ITL
    for a request of at most one output token, which has no gaps to be slow in.
    """
    if result.status != "ok":
        return False
    if sla.ttft_ms is not None and (result.ttft_s is None or result.ttft_s * 1000 > sla.ttft_ms):
        return False
    if sla.itl_ms is not None:
        itl = result.itl_s
        if itl is None and result.output_tokens > 1:
            return False
        if itl is not None and itl * 1000 > sla.itl_ms:
            return False
    return sla.latency_ms is None or result.latency_s * 1000 <= sla.latency_ms


def _error_kind(message: str | None) -> str:
    lines = (message or "").strip().splitlines()
    line = lines[0] if lines else "unknown"
    return line if len(line) <= 120 else line[:117] + "..."


def summarise(results: Sequence[client.Result], sla: Sla | None = None) -> Summary:
    """The numbers of one replay; requests never sent (a cancelled run) are left out."""
    sla = sla if sla is not None else Sla()
    sent = [r for r in results if not math.isnan(r.start_s)]
    ok = [r for r in sent if r.status == "ok"]
    if sent:
        duration = max(r.end_s for r in sent) - min(r.start_s for r in sent)
    else:
        duration = 0.0

    def per_second(amount: float) -> float:
        return amount / duration if duration > 0 else 0.0

    good = sum(1 for r in sent if meets(r, sla))
    output_tokens = sum(r.output_tokens for r in ok)
    errors = Counter(_error_kind(r.error) for r in sent if r.status == "error")
    return Summary(
        count=len(sent),
        ok=len(ok),
        errors=sum(errors.values()),
        cancelled=sum(1 for r in sent if r.status == "cancelled"),
        duration_s=duration,
        request_rate_rps=per_second(len(sent)),
        output_tokens=output_tokens,
        output_tokens_per_s=per_second(output_tokens),
        ttft_ms=distribution(r.ttft_s * 1000 for r in ok if r.ttft_s is not None),
        itl_ms=distribution(r.itl_s * 1000 for r in ok if r.itl_s is not None),
        latency_ms=distribution(r.latency_s * 1000 for r in ok),
        lateness_ms=distribution(r.lateness_s * 1000 for r in sent),
        sla=sla,
        good=good,
        goodput_fraction=good / len(sent) if sent else 0.0,
        goodput_rps=per_second(good),
        error_kinds=dict(errors.most_common(5)),
    )


def describe(requests: Sequence[traces.Request]) -> TraceStats:
    """Count, span, mean rate and length distributions of a prepared trace."""
    span = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    return TraceStats(
        count=len(requests),
        span_s=span,
        rate_rps=len(requests) / span if span > 0 else 0.0,
        input_tokens=distribution(float(r.input_tokens) for r in requests),
        output_tokens=distribution(float(r.output_tokens) for r in requests),
        with_prefix_blocks=sum(1 for r in requests if r.hash_ids),
    )


# -- JSON ------------------------------------------------------------------------------------------


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def summary_dict(summary: Summary) -> dict[str, Any]:
    """The summary as JSON-ready data (times in the units their names say)."""
    data = asdict(summary)
    data["sla"] = {key: value for key, value in data["sla"].items() if value is not None}
    return data


def result_dict(result: client.Result) -> dict[str, Any]:
    """One request's record for `--per-request`; times in ms, NaN (never sent) as null."""

    def ms(seconds: float | None) -> float | None:
        value = _finite(seconds)
        return None if value is None else round(value * 1000, 3)

    return {
        "index": result.index,
        "status": result.status,
        "error": result.error,
        "scheduled_ms": ms(result.scheduled_s),
        "start_ms": ms(result.start_s),
        "lateness_ms": ms(result.lateness_s),
        "ttft_ms": ms(result.ttft_s),
        "itl_ms": ms(result.itl_s),
        "latency_ms": ms(result.latency_s),
        "input_tokens": result.input_tokens,
        "expected_output_tokens": result.expected_output_tokens,
        "output_tokens": result.output_tokens,
        "finish_reason": result.finish_reason,
    }


# -- rich ------------------------------------------------------------------------------------------


def _latency_table(title: str, rows: Sequence[tuple[str, Distribution | None]], *, unit: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("")
    for heading in ("n", "mean", *(f"p{q}" for q in PERCENTILES), "max"):
        table.add_column(heading, justify="right")
    for name, dist in rows:
        if dist is None:
            table.add_row(name, "0", *["–"] * 6)
            continue
        values = (dist.mean, dist.p50, dist.p90, dist.p95, dist.p99, dist.maximum)
        table.add_row(name, str(dist.count), *(f"{v:,.1f}" for v in values))
    table.caption = unit
    return table


def render(summary: Summary) -> RenderableType:
    """The summary as rich tables: totals and goodput, then the latency percentiles."""
    totals = Table(title="replay", box=box.SIMPLE_HEAVY, show_header=False, title_justify="left")
    totals.add_column("what")
    totals.add_column("value", justify="right")
    totals.add_row("requests", f"{summary.count:,}")
    totals.add_row("ok / errors / cancelled", f"{summary.ok:,} / {summary.errors:,} / {summary.cancelled:,}")
    totals.add_row("duration", f"{summary.duration_s:,.1f} s")
    totals.add_row("request rate", f"{summary.request_rate_rps:,.2f} req/s")
    totals.add_row("output tokens", f"{summary.output_tokens:,} ({summary.output_tokens_per_s:,.1f} tok/s)")
    totals.add_row(f"goodput ({summary.sla})", f"{summary.good:,} ({summary.goodput_fraction:.1%})")
    totals.add_row("goodput rate", f"{summary.goodput_rps:,.2f} req/s")
    for message, count in summary.error_kinds.items():
        totals.add_row(f"[red]error ×{count}[/red]", message)
    latencies = _latency_table(
        "latency",
        [
            ("TTFT", summary.ttft_ms),
            ("ITL", summary.itl_ms),
            ("end-to-end", summary.latency_ms),
            ("client lateness", summary.lateness_ms),
        ],
        unit="milliseconds; TTFT, ITL and end-to-end over the requests that succeeded",
    )
    return Group(totals, latencies)


def render_trace(stats: TraceStats) -> RenderableType:
    """A prepared trace's shape, for `--dry-run`."""
    totals = Table(title="trace", box=box.SIMPLE_HEAVY, show_header=False, title_justify="left")
    totals.add_column("what")
    totals.add_column("value", justify="right")
    totals.add_row("requests", f"{stats.count:,}")
    totals.add_row("span", f"{stats.span_s:,.1f} s")
    totals.add_row("mean rate", f"{stats.rate_rps:,.2f} req/s")
    totals.add_row("with prefix blocks", f"{stats.with_prefix_blocks:,}")
    lengths = _latency_table(
        "lengths", [("input", stats.input_tokens), ("output", stats.output_tokens)], unit="tokens"
    )
    return Group(totals, lengths)
