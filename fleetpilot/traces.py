"""Trace files: read a public workload trace into requests, then reshape it for a run.

Where it sits: the one reader of trace files, for `fleetpilot replay` (which sends the requests to a
frontend), the planner backtest (which runs them through a simulated fleet) and the benchmarks.
Three formats live in `../shared/traces/` (see its README): the Azure LLM 2023 CSV and the Mooncake
JSONL list requests; the ServeGen CSV only gives a request rate per 10-minute window, so requests are
synthesised from it (Poisson arrivals, lengths from a stated distribution), or the series is read as
it is (`load_rate_series`). Every request reader returns `Request`s sorted by arrival, in seconds from
the first request (for ServeGen: from the start of the chosen window of the series).

Then `prepare` cuts a window of trace time, scales the rate (thinning or replication) and the time
(compression), and caps the count. Everything here is pure except the last section's three functions
(`file_format`, `load_rate_series`, `load`), the only ones that open a file; random choices come from
a seeded numpy Generator, so a replay is repeatable.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TextIO, get_args

import numpy as np

TraceFormat = Literal["azure", "mooncake", "servegen"]
FORMATS: tuple[str, ...] = get_args(TraceFormat)
LengthKind = Literal["lognormal", "exponential", "constant"]
LENGTH_KINDS: tuple[str, ...] = get_args(LengthKind)

BLOCK_TOKENS = 512  # Mooncake's hash_ids each stand for one block of this many prompt tokens
SERVEGEN_WINDOW_S = 600.0  # the series' step when it cannot be read from the data
MAX_SYNTHESISED = 2_000_000  # beyond this a synthesis needs --duration or --max-requests


class TraceError(ValueError):
    """The trace file does not look like the format it was read as."""


NO_TENANTS_IN_A_RATE_SERIES = (
    "--tenant-shift shifts the copies of a request trace (Azure CSV, Mooncake JSONL); a ServeGen rate "
    "series is drawn as Poisson arrivals at rate × --rate-scale, with no copies to shift: drop --tenant-shift"
)


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace: when it arrives and how long its prompt and generation are."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None  # prefix blocks (Mooncake); equal leading ids = shared prefix


@dataclass(frozen=True, slots=True)
class RateWindow:
    """One row of the ServeGen series: a model's mean request rate from `t_start_s` on."""

    model: str
    t_start_s: float
    rate_rps: float
    active_clients: int


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """How synthesised token counts are drawn: `mean` is the target mean, `sigma` the lognormal shape.

    lognormal (default) has the long right tail real prompt and output lengths show; exponential is
    lighter; constant is every request the same. Draws are rounded and clipped to [1, maximum].
    """

    mean: float
    kind: LengthKind = "lognormal"
    sigma: float = 1.0
    maximum: int = 131_072


@dataclass(frozen=True, slots=True)
class Shape:
    """How a trace is reshaped for a run; the default leaves it as it is.

    The window is in the trace's own clock (for ServeGen: seconds from 00:00 on day 1 of the series).
    `rate_factor` scales the request rate and keeps the time line; `time_factor` compresses the time
    line (2 = twice as fast, hence also twice the rate). `seed` drives every random choice.
    `tenant_shift_s`: above rate 1, copies are other tenants (see `rate_scale`) rather than each
    request's burst repeated.
    """

    start_s: float = 0.0
    duration_s: float | None = None
    rate_factor: float = 1.0
    tenant_shift_s: float | None = None
    time_factor: float = 1.0
    max_requests: int | None = None
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Synthesis:
    """What a ServeGen rate series does not say: which model's series, and the token lengths.

    The default means are round numbers near the Azure trace here (input mean 2,048) with outputs
    of a chat-like 256; they are not ServeGen's own, which are not published per window.
    """

    model: str = "m-large"
    input_length: LengthDistribution = LengthDistribution(mean=2048, maximum=32_768)
    output_length: LengthDistribution = LengthDistribution(mean=256, maximum=8_192)


# -- format detection ------------------------------------------------------------------------------


def detect_format(name: str, first_line: str) -> TraceFormat:
    """The trace format from the file name and its first line (a JSON object, or a CSV header)."""
    stripped = first_line.strip()
    if name.endswith((".jsonl", ".json")) or stripped.startswith("{"):
        return "mooncake"
    header = {column.strip() for column in stripped.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"model", "t_start_s", "total_rate_rps"} <= header:
        return "servegen"
    raise TraceError(f"cannot tell the format of {name} from its first line {stripped[:80]!r}; use --format")


# -- readers ---------------------------------------------------------------------------------------


def _azure_ticks(timestamp: str) -> int:
    """`2023-11-16 18:15:46.6805900` in 100 ns ticks since the epoch (naive, read as UTC).

    Integer ticks, because the fraction has 7 digits, which not every Python's `fromisoformat`
    accepts, and because seconds since 1970 as a float would round them away.
    """
    whole, _, fraction = timestamp.strip().partition(".")
    seconds = int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())
    return seconds * 10**7 + int((fraction or "0")[:7].ljust(7, "0"))


def _relative(requests: list[Request]) -> list[Request]:
    """Sorted by arrival (stable), shifted so that the first request arrives at 0."""
    requests.sort(key=lambda request: request.arrival_s)
    if not requests:
        return requests
    first = requests[0].arrival_s
    return [replace(request, arrival_s=request.arrival_s - first) for request in requests]


def parse_azure(lines: Iterable[str]) -> list[Request]:
    """The Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens` rows."""
    reader = csv.DictReader(line for line in lines if line.strip())
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
    if missing:
        raise TraceError(f"not an Azure LLM trace: no column {', '.join(sorted(missing))}")
    rows: list[tuple[int, int, int]] = []
    for number, row in enumerate(reader, start=1):
        try:
            rows.append(
                (_azure_ticks(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"]))
            )
        except (ValueError, TypeError, AttributeError) as error:
            raise TraceError(f"row {number} is not an Azure request: {error}") from error
    first = min((ticks for ticks, _, _ in rows), default=0)
    requests = [
        Request(arrival_s=(ticks - first) / 10**7, input_tokens=inputs, output_tokens=outputs)
        for ticks, inputs, outputs in rows
    ]
    return _relative(requests)


def parse_mooncake(lines: Iterable[str]) -> list[Request]:
    """The Mooncake FAST'25 trace: one JSON object a line, `timestamp` in ms and 512-token `hash_ids`."""
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            hash_ids = row.get("hash_ids")
            requests.append(
                Request(
                    arrival_s=float(row["timestamp"]) / 1000.0,
                    input_tokens=int(row["input_length"]),
                    output_tokens=int(row["output_length"]),
                    hash_ids=tuple(int(h) for h in hash_ids) if hash_ids is not None else None,
                )
            )
        except (ValueError, KeyError, TypeError) as error:
            raise TraceError(f"line {number} is not a Mooncake request: {error}") from error
    return _relative(requests)


def parse_servegen(lines: Iterable[str]) -> list[RateWindow]:
    """The ServeGen aggregate series: `model,t_start_s,total_rate_rps,active_clients` rows."""
    reader = csv.DictReader(line for line in lines if line.strip())
    missing = {"model", "t_start_s", "total_rate_rps"} - set(reader.fieldnames or ())
    if missing:
        raise TraceError(f"not a ServeGen rate series: no column {', '.join(sorted(missing))}")
    return [
        RateWindow(
            model=row["model"],
            t_start_s=float(row["t_start_s"]),
            rate_rps=float(row["total_rate_rps"]),
            active_clients=int(row.get("active_clients") or 0),
        )
        for row in reader
    ]


# -- synthesis from a rate series ------------------------------------------------------------------


def draw_lengths(rng: np.random.Generator, distribution: LengthDistribution, count: int) -> np.ndarray:
    """`count` token counts from `distribution` (integers, clipped to [1, maximum])."""
    if distribution.mean <= 0:
        raise ValueError(f"a mean length must be positive, not {distribution.mean}")
    if distribution.kind == "lognormal":
        # E[exp(N(mu, s²))] = exp(mu + s²/2): pick mu so that the mean is the one asked for
        mu = math.log(distribution.mean) - distribution.sigma**2 / 2
        values = rng.lognormal(mu, distribution.sigma, count)
    elif distribution.kind == "exponential":
        values = rng.exponential(distribution.mean, count)
    else:
        values = np.full(count, float(distribution.mean))
    return np.clip(np.rint(values), 1, distribution.maximum).astype(np.int64)


def window_length(starts: Sequence[float]) -> float:
    """The step of a ServeGen series: the median gap between window starts."""
    gaps = np.diff(np.asarray(starts, dtype=float))
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if len(gaps) else SERVEGEN_WINDOW_S


def synthesise(windows: Sequence[RateWindow], *, synthesis: Synthesis, shape: Shape) -> list[Request]:
    """Poisson arrivals at `rate × shape.rate_factor` in the part of the series inside `shape`'s window.

    Within a window of the series the rate is constant, so the count is Poisson(rate·length) and the
    arrival times are uniform over it (the order statistics of a Poisson process). Arrivals are in
    seconds from `shape.start_s`; synthesis stops once `shape.max_requests` exist. `time_factor` is
    left to `prepare`.
    """
    if shape.rate_factor <= 0:
        raise ValueError(f"--rate-scale must be positive, not {shape.rate_factor}")
    rows = sorted((w for w in windows if w.model == synthesis.model), key=lambda w: w.t_start_s)
    if not rows:
        models = sorted({w.model for w in windows})
        raise TraceError(f"no model {synthesis.model!r} in the rate series; it has {', '.join(models)}")
    length = window_length([w.t_start_s for w in rows])
    start = shape.start_s
    end = start + shape.duration_s if shape.duration_s is not None else math.inf
    spans = [(max(w.t_start_s, start), min(w.t_start_s + length, end), w.rate_rps) for w in rows]
    spans = [(lo, hi, rate * shape.rate_factor) for lo, hi, rate in spans if hi > lo]
    expected = sum((hi - lo) * rate for lo, hi, rate in spans)
    if shape.max_requests is None and expected > MAX_SYNTHESISED:
        raise ValueError(
            f"this would synthesise about {expected:,.0f} requests; narrow it with --duration, "
            "--max-requests or a smaller --rate-scale"
        )
    rng = np.random.default_rng(shape.seed)
    requests: list[Request] = []
    for lo, hi, rate in spans:
        count = int(rng.poisson(rate * (hi - lo)))
        times = np.sort(rng.uniform(lo - start, hi - start, count))
        inputs = draw_lengths(rng, synthesis.input_length, count)
        outputs = draw_lengths(rng, synthesis.output_length, count)
        requests.extend(
            Request(arrival_s=float(t), input_tokens=int(i), output_tokens=int(o))
            for t, i, o in zip(times, inputs, outputs, strict=True)
        )
        if shape.max_requests is not None and len(requests) >= shape.max_requests:
            break
    return requests[: shape.max_requests] if shape.max_requests is not None else requests


# -- transformations -------------------------------------------------------------------------------


def window(
    requests: Sequence[Request], *, start_s: float = 0.0, duration_s: float | None = None
) -> list[Request]:
    """The requests arriving in [start, start + duration) of trace time, in seconds from `start_s`.

    Shifted by the window's start, not by its first request, so a quiet opening stays quiet.
    """
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"--duration must be positive, not {duration_s}")
    end = start_s + duration_s if duration_s is not None else math.inf
    return [replace(r, arrival_s=r.arrival_s - start_s) for r in requests if start_s <= r.arrival_s < end]


def time_scale(requests: Sequence[Request], factor: float) -> list[Request]:
    """Compress time by `factor`: arrival / factor (2 replays the trace twice as fast, at twice the rate)."""
    if factor <= 0:
        raise ValueError(f"--time-scale must be positive, not {factor}")
    return [replace(r, arrival_s=r.arrival_s / factor) for r in requests]


def rate_scale(
    requests: Sequence[Request], factor: float, *, seed: int = 0, jitter_s: float | None = None,
    tenant_shift_s: float | None = None,
) -> list[Request]:
    """Scale the request rate by `factor` and keep the trace's time line.

    Below 1 each request is kept with probability `factor` (thinning a Poisson-like stream keeps its
    shape). Above 1 each request gets `factor - 1` copies on average, each arriving a uniform
    jitter later (default: up to the mean gap between requests) so copies do not land in the same
    instant: every burst of the trace comes `factor` times over, at once, as if every client's burst
    were the whole population's. With `tenant_shift_s` the copies are other tenants instead: copy k of
    every request arrives one shift u_k ~ U(0, tenant_shift_s) later (wrapped around the trace's span, so
    it neither starts late nor runs over), the same shift for the whole copy, so each copy keeps the
    trace's bursts and its time line to within the shift, and the copies' bursts fall independently.
    A copy's prefix blocks are renumbered per copy (copy k's ids are offset by k × (largest id
    + 1)): the copies share prefixes with each other the way the originals do, but not with the
    originals, which would turn every copy into a cache hit.
    """
    if factor <= 0:
        raise ValueError(f"--rate-scale must be positive, not {factor}")
    if factor == 1 or not requests:
        return list(requests)
    rng = np.random.default_rng(seed)
    if factor < 1:
        keep = rng.random(len(requests)) < factor
        return [r for r, kept in zip(requests, keep, strict=True) if kept]
    if tenant_shift_s is not None and tenant_shift_s < 0:
        raise ValueError(f"the tenant shift must not be negative, not {tenant_shift_s}")
    first = requests[0].arrival_s
    span = requests[-1].arrival_s - first
    jitter = jitter_s if jitter_s is not None else span / len(requests)
    whole = math.floor(factor)
    extra = rng.random(len(requests)) < factor - whole
    shifts = rng.uniform(0.0, tenant_shift_s, whole + 1) if tenant_shift_s is not None else None  # by copy number
    id_stride = 1 + max((max(r.hash_ids) for r in requests if r.hash_ids), default=0)
    scaled = list(requests)
    for request, one_more in zip(requests, extra, strict=True):
        for copy in range(1, whole + int(one_more)):
            hash_ids = (
                tuple(h + copy * id_stride for h in request.hash_ids)
                if request.hash_ids is not None
                else None
            )
            if shifts is not None:
                arrival = first + (request.arrival_s - first + float(shifts[copy])) % span if span > 0 \
                    else request.arrival_s
            elif jitter > 0:
                arrival = request.arrival_s + float(rng.uniform(0.0, jitter))
            else:
                arrival = request.arrival_s
            scaled.append(replace(request, arrival_s=arrival, hash_ids=hash_ids))
    scaled.sort(key=lambda request: request.arrival_s)
    return scaled


def prepare(requests: Sequence[Request], shape: Shape) -> list[Request]:
    """Window (trace time) → rate scale → time scale → the first `max_requests`, in that order.

    The window is cut before any scaling, so `--start`/`--duration` always mean the trace's own clock.
    """
    if shape.max_requests is not None and shape.max_requests < 0:
        raise ValueError(f"--max-requests must not be negative, not {shape.max_requests}")
    shaped = window(requests, start_s=shape.start_s, duration_s=shape.duration_s)
    shaped = rate_scale(shaped, shape.rate_factor, seed=shape.seed, tenant_shift_s=shape.tenant_shift_s)
    shaped = time_scale(shaped, shape.time_factor)
    return shaped[: shape.max_requests] if shape.max_requests is not None else shaped


# -- the functions that read a file ----------------------------------------------------------------


def _open(path: Path) -> TextIO:
    return path.open(encoding="utf-8-sig")  # -sig: a BOM is no part of the header


def file_format(path: str | Path) -> TraceFormat:
    """The format of a trace file, told by its name and first line."""
    path = Path(path)
    with _open(path) as file:
        return detect_format(path.name, file.readline())


def load_rate_series(path: str | Path, *, model: str) -> list[RateWindow]:
    """One model's windows of a ServeGen rate series, by start time, as the file states them (no synthesis)."""
    with _open(Path(path)) as file:
        windows = [w for w in parse_servegen(file) if w.model == model]
    return sorted(windows, key=lambda w: w.t_start_s)


def rate_series_models(path: str | Path) -> list[str]:
    """The models a ServeGen rate series has windows for, sorted."""
    with _open(Path(path)) as file:
        return sorted({w.model for w in parse_servegen(file)})


def load(
    path: str | Path,
    *,
    shape: Shape = Shape(),
    synthesis: Synthesis = Synthesis(),
    trace_format: TraceFormat | None = None,
    max_rows: int | None = None,
) -> list[Request]:
    """Read a trace file and shape it for a run: the requests to send, arrivals in seconds from 0.

    The format comes from the file (or `trace_format`); at most `max_rows` rows are read. A ServeGen
    series is synthesised with `synthesis`, inside `shape`'s window and at its rate factor.
    """
    path = Path(path)
    with _open(path) as file:
        first = file.readline()
        chosen = trace_format or detect_format(path.name, first)
        body = itertools.chain([first], file)
        # a CSV's header line is not a row; JSONL has no header
        limit = None if max_rows is None else max_rows + (0 if chosen == "mooncake" else 1)
        lines = list(itertools.islice(body, limit))
    if chosen == "azure":
        return prepare(parse_azure(lines), shape)
    if chosen == "mooncake":
        return prepare(parse_mooncake(lines), shape)
    if shape.tenant_shift_s is not None:
        raise ValueError(NO_TENANTS_IN_A_RATE_SERIES)
    synthesised = synthesise(parse_servegen(lines), synthesis=synthesis, shape=shape)
    return prepare(synthesised, Shape(time_factor=shape.time_factor, max_requests=shape.max_requests))
