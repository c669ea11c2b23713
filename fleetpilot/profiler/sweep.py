"""The profiler's pure part: what to measure, and how measurements become a Profile.

Where it sits: `cli` (flags, progress, files, the ConfigMap) → `client` (OpenAI-compatible requests,
timed) → this module (the sweep's grid, the windows that are read, the Profile). No I/O, no clock:
timings come in as plain numbers (seconds since a request was sent).

Prefill: prompts of each ISL sent `batch` at a time with one output token; the lone TTFT (batch 1,
the median of the repeats) is the Profile's prefill point, as the planner's capacity model reads it;
the batched ones go to `Profile.prefill_batched` for people reading the profile.

Decode: `concurrency` streams started together, each with a prompt of `context − osl / 2` tokens and
`osl` output tokens, so the mean context over the window is `context`. The window runs from the last
stream's first token (every prompt prefilled: only decode steps run from then on) to the first
stream's last token (all `concurrency` still running). ITL is the mean gap between tokens inside the
window, throughput the tokens inside it per second. The window shrinks as the prompts' prefill
staggers the first tokens; `decode_osl` lengthens the output for that (`osl` estimated from the
prefill sweep), and a window shorter than `MIN_WINDOW_GAPS` token gaps per stream is not a
measurement (the point is reported and left out).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence

from fleetpilot.api import profile as profiles

# A decode window must hold this many token gaps per stream to be read.
MIN_WINDOW_GAPS = 8
DEFAULT_ISLS = (128, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_BATCHES = (1, 4)
DEFAULT_CONTEXTS = (512, 1024, 2048, 4096, 8192)
DEFAULT_CONCURRENCIES = (1, 4, 16, 64, 128, 256)
DEFAULT_OSL = 64


@dataclasses.dataclass(frozen=True)
class Stream:
    """One request as the client saw it: when each output token arrived, in seconds after it was sent."""

    token_times: tuple[float, ...]

    @property
    def ttft(self) -> float:
        return self.token_times[0]


@dataclasses.dataclass(frozen=True)
class Window:
    """The stretch of a decode burst during which every stream was decoding."""

    start: float
    end: float
    gaps: int  # token gaps inside the window, all streams together
    tokens: int  # tokens that arrived inside it

    @property
    def seconds(self) -> float:
        return self.end - self.start


def decode_window(streams: Sequence[Stream], *, offsets: Sequence[float] | None = None) -> Window | None:
    """The window of a burst (see the module docstring), or None when the streams never all decoded at once.

    `offsets`: when each stream was sent, relative to the first (token times are per stream).
    """
    if not streams or any(len(s.token_times) < 2 for s in streams):
        return None
    shift = offsets or [0.0] * len(streams)
    absolute = [[shift[i] + t for t in s.token_times] for i, s in enumerate(streams)]
    start = max(times[0] for times in absolute)
    end = min(times[-1] for times in absolute)
    if end <= start:
        return None
    gaps = tokens = 0
    for times in absolute:
        inside = [t for t in times if start <= t <= end]
        tokens += len(inside)
        gaps += max(0, len(inside) - 1)
    return Window(start, end, gaps, tokens)


def window_itl(streams: Sequence[Stream], window: Window, *, offsets: Sequence[float] | None = None) -> float:
    """The mean time between consecutive tokens of a stream inside the window (all streams pooled)."""
    shift = offsets or [0.0] * len(streams)
    gaps: list[float] = []
    for i, stream in enumerate(streams):
        inside = [shift[i] + t for t in stream.token_times if window.start <= shift[i] + t <= window.end]
        gaps += [b - a for a, b in itertools.pairwise(inside)]
    return statistics.fmean(gaps) if gaps else math.nan


def enough(window: Window | None, concurrency: int) -> bool:
    """Whether the window holds enough gaps per stream to be read."""
    return window is not None and window.gaps >= MIN_WINDOW_GAPS * concurrency


def decode_osl(*, osl: int, concurrency: int, lone_ttft_s: float, itl_guess_s: float, context: int,
               max_osl: int = 2048) -> int:
    """Output tokens a burst needs so the window survives the prefill's stagger: the last prompt's first
    token comes about `concurrency` lone prefills after the first, and the window should then still
    hold `MIN_WINDOW_GAPS` × 2 gaps. Never more than leaves half the context for the prompt."""
    stagger = concurrency * lone_ttft_s
    needed = math.ceil(stagger / max(itl_guess_s, 1e-6)) + 2 * MIN_WINDOW_GAPS
    return max(osl, min(needed, max_osl, context))


@dataclasses.dataclass(frozen=True)
class PrefillSample:
    """The TTFTs of one (ISL, batch) point's requests, seconds."""

    isl: int
    batch: int
    ttfts: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class DecodeSample:
    """One decode burst's reading."""

    context: int
    concurrency: int
    itl_s: float
    tokens_per_s: float
    kv_usage: float | None = None


def prefill_points(samples: Sequence[PrefillSample], *, gpus: int, speedup: float = 1.0,
                   ) -> tuple[tuple[profiles.PrefillPoint, ...], tuple[profiles.PrefillBatchPoint, ...]]:
    """Lone points (batch 1, median TTFT) and batched points (the median of each batch's last first token),
    with durations in the engine's own time (× `speedup` for a simulator running faster than real time)."""
    lone: list[profiles.PrefillPoint] = []
    batched: list[profiles.PrefillBatchPoint] = []
    for sample in samples:
        ttft = statistics.median(sample.ttfts) * speedup
        if sample.batch == 1:
            lone.append(profiles.PrefillPoint(isl=sample.isl, ttft_ms=ttft * 1e3,
                                              tokens_per_s_per_gpu=sample.isl / ttft / gpus))
        else:
            batched.append(profiles.PrefillBatchPoint(isl=sample.isl, batch=sample.batch, ttft_ms=ttft * 1e3,
                                                      tokens_per_s_per_gpu=sample.batch * sample.isl / ttft / gpus))
    return tuple(lone), tuple(batched)


def decode_points(samples: Sequence[DecodeSample], *, gpus: int, kv_capacity_tokens: int,
                  speedup: float = 1.0) -> tuple[profiles.DecodePoint, ...]:
    """The decode grid, in the engine's own time; rows left with fewer than two points are dropped (the
    Profile interpolates along concurrency within each context row)."""
    rows: dict[int, list[profiles.DecodePoint]] = {}
    for sample in samples:
        if not (sample.itl_s > 0 and math.isfinite(sample.itl_s)):
            continue
        usage = sample.kv_usage
        if usage is None:
            usage = min(1.0, sample.concurrency * sample.context / kv_capacity_tokens)
        rows.setdefault(sample.context, []).append(profiles.DecodePoint(
            context_length=sample.context, concurrency=float(sample.concurrency), itl_ms=sample.itl_s * speedup * 1e3,
            tokens_per_s_per_gpu=sample.tokens_per_s / speedup / gpus, kv_usage=min(1.0, usage)))
    return tuple(point for row in rows.values() if len(row) >= 2 for point in row)


def kv_capacity(samples: Sequence[DecodeSample]) -> int | None:
    """KV tokens one replica holds, from the engine's KV usage during the bursts: the median of
    concurrency × context / usage over the readings (as `profile.from_dynamo_csv` derives it)."""
    implied = [s.concurrency * s.context / s.kv_usage for s in samples if s.kv_usage and s.kv_usage > 0.01]
    return round(statistics.median(implied)) if implied else None


def cache_config_tokens(labels: Mapping[str, str]) -> int | None:
    """KV tokens from vLLM's `vllm:cache_config_info` labels (num_gpu_blocks × block_size), if present."""
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None


def build(*, model: str, engine: str, gpu: str, tensor_parallel: int, gpus_per_replica: int,
          kv_capacity_tokens: int, prefill: Sequence[PrefillSample], decode: Sequence[DecodeSample],
          speedup: float, source: str) -> profiles.Profile:
    """The Profile of a sweep's samples (raises ValueError, naming what is missing, when too few were read)."""
    lone, batched = prefill_points(prefill, gpus=gpus_per_replica, speedup=speedup)
    points = decode_points(decode, gpus=gpus_per_replica, kv_capacity_tokens=kv_capacity_tokens, speedup=speedup)
    return profiles.Profile(model=model, engine=engine, gpu=gpu, tensor_parallel=tensor_parallel,
                            gpus_per_replica=gpus_per_replica, kv_capacity_tokens=kv_capacity_tokens,
                            prefill=lone, prefill_batched=batched, decode=points, source=source)
