"""The capacity Profile: what the SLA planner knows about one (model, engine, GPU, parallelism).

Where it sits: a DynamoGraph's `spec.planner.profileRef` names a ConfigMap key holding one Profile as
JSON; the planner validates it with this model and hands it to its capacity model
(`fleetpilot.planner.capacity`), which turns it into requests per second per replica at the SLA
targets. A profile comes from measurements (`from_dynamo_csv`: the Dynamo planner's profiling output,
e.g. `../shared/traces/calibration/h200_llama31_8b_fp8_vllm_*.csv`) or, for simulator graphs that
have no measurements, from the performance model (`from_performance_model`).

The format mirrors the measurements it holds:

- `prefill`: one request alone at a time, per input length (ISL): its time to first token and the
  prefill throughput that implies, tokens/s per GPU (= isl / ttft / gpus_per_replica when measured so).
- `decode`: a grid over (context length, concurrency): inter-token latency and decode throughput,
  tokens/s per GPU. Each context length is one row of at least two concurrencies, so ITL can be
  interpolated along concurrency in every row and across rows along context length.
- `kv_capacity_tokens`: KV-cache tokens one replica holds (all its GPUs together).
- `prefill_batched` (optional): TTFT of `batch` prompts sent at once, as `fleetpilot profile` measures
  it; informational (the capacity model reads the lone prefill points).

Field names are snake_case like the CSV columns they come from (this is a data file in a ConfigMap,
not a Kubernetes object, so it does not take the API's camelCase). Points may be given in any order;
validation sorts them and rejects duplicates. The only I/O here is `from_dynamo_csv` reading its files.
"""

from __future__ import annotations

import csv
import itertools
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetpilot import perfmodel


class _ProfileModel(BaseModel):
    """Base for the profile structs: immutable, unknown fields rejected (typos fail loudly)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PrefillPoint(_ProfileModel):
    """One request of `isl` tokens prefilled alone: how long to its first token, how fast per GPU."""

    isl: int = Field(ge=1, description="Input sequence length, tokens.")
    ttft_ms: float = Field(gt=0, description="Time to first token of a lone request, milliseconds.")
    tokens_per_s_per_gpu: float = Field(gt=0, description="Prefill throughput, tokens/s per GPU.")


class PrefillBatchPoint(_ProfileModel):
    """`batch` prompts of `isl` tokens sent at once: how long until the last of them has its first token.

    Measured by `fleetpilot profile` for people reading a profile (how far batching prompts helps); the
    planner's capacity model reads the lone points.
    """

    isl: int = Field(ge=1, description="Input sequence length, tokens.")
    batch: int = Field(ge=2, description="Prompts sent at once.")
    ttft_ms: float = Field(gt=0, description="Time to the last prompt's first token, milliseconds.")
    tokens_per_s_per_gpu: float = Field(gt=0, description="batch × isl / ttft, per GPU.")


class DecodePoint(_ProfileModel):
    """`concurrency` sequences of `context_length` tokens decoding together."""

    context_length: int = Field(ge=1, description="Tokens in each sequence's context (prompt + output so far).")
    concurrency: float = Field(gt=0, description="Sequences decoding at once (may be approximate).")
    itl_ms: float = Field(gt=0, description="Inter-token latency, milliseconds.")
    tokens_per_s_per_gpu: float = Field(gt=0, description="Decode throughput, output tokens/s per GPU.")
    kv_usage: float | None = Field(default=None, ge=0, le=1, description="Share of the KV cache in use, if measured.")


class Profile(_ProfileModel):
    """A capacity profile; see the module docstring for what each part means."""

    model: str = Field(min_length=1, description="Model the profile was measured (or modelled) for.")
    engine: str = Field(min_length=1, description="Serving engine: vllm, sglang, trtllm, simulator, ...")
    gpu: str = Field(min_length=1, description="GPU kind, e.g. h200-sxm.")
    tensor_parallel: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size of one replica.")
    gpus_per_replica: int = Field(default=1, ge=1, le=512, description="GPUs one replica uses (TP × PP).")
    kv_capacity_tokens: int = Field(ge=1, description="KV-cache tokens one replica holds.")
    prefill: tuple[PrefillPoint, ...] = Field(min_length=2, description="Prefill points, at least two ISLs.")
    prefill_batched: tuple[PrefillBatchPoint, ...] = Field(
        default=(), description="TTFT of prompts sent together, per (ISL, batch); informational.")
    decode: tuple[DecodePoint, ...] = Field(min_length=2, description="Decode grid over (context, concurrency).")
    source: str = Field(default="", description="Where the numbers came from, for people reading a decision.")

    @field_validator("prefill")
    @classmethod
    def _prefill_sorted_and_distinct(cls, points: tuple[PrefillPoint, ...]) -> tuple[PrefillPoint, ...]:
        ordered = tuple(sorted(points, key=lambda p: p.isl))
        for before, after in itertools.pairwise(ordered):
            if before.isl == after.isl:
                raise ValueError(f"prefill: two points have isl {after.isl}; each ISL may appear once")
        return ordered

    @field_validator("decode")
    @classmethod
    def _decode_is_a_grid(cls, points: tuple[DecodePoint, ...]) -> tuple[DecodePoint, ...]:
        ordered = tuple(sorted(points, key=lambda p: (p.context_length, p.concurrency)))
        rows: dict[int, list[float]] = {}
        for point in ordered:
            row = rows.setdefault(point.context_length, [])
            if row and row[-1] == point.concurrency:
                raise ValueError(
                    f"decode: two points have context_length {point.context_length} and concurrency "
                    f"{point.concurrency}; each (context_length, concurrency) may appear once"
                )
            row.append(point.concurrency)
        # ITL is interpolated along concurrency within each context row, so every row needs two points.
        thin = sorted(context for context, row in rows.items() if len(row) < 2)
        if thin:
            raise ValueError(
                f"decode: context_length {thin} has fewer than 2 concurrency points; every context row "
                "needs at least two to interpolate ITL along concurrency"
            )
        return ordered

    @model_validator(mode="after")
    def _gpus_hold_the_parallelism(self) -> Self:
        if self.gpus_per_replica % self.tensor_parallel:
            raise ValueError(
                f"gpus_per_replica ({self.gpus_per_replica}) must be a multiple of tensor_parallel "
                f"({self.tensor_parallel}): one replica runs TP × PP GPUs"
            )
        return self

    def decode_rows(self) -> dict[int, tuple[DecodePoint, ...]]:
        """The decode grid by context length (ascending), each row by concurrency (ascending)."""
        rows: dict[int, list[DecodePoint]] = {}
        for point in self.decode:
            rows.setdefault(point.context_length, []).append(point)
        return {context: tuple(row) for context, row in rows.items()}


# -- loaders ---------------------------------------------------------------------------------------------


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def from_dynamo_csv(
    prefill_csv: Path | str,
    decode_csv: Path | str,
    *,
    model: str,
    engine: str,
    gpu: str,
    tensor_parallel: int = 1,
    gpus_per_replica: int | None = None,
    kv_capacity_tokens: int | None = None,
) -> Profile:
    """Read the Dynamo planner's profiling CSVs into a Profile.

    Prefill columns: `isl, ttft_ms, prefill_tokens_per_s_per_gpu`. Decode columns: `kv_usage,
    context_length, itl_ms, decode_tokens_per_s_per_gpu, approx_concurrency`. The files carry no
    metadata (model, engine, GPU), so the caller names them. The KV capacity is not a column either:
    unless given, it is the median over decode rows of concurrency × context / kv_usage (the rows
    round kv_usage to four digits, so single rows scatter; the median of the Dynamo H200 file is
    within 0.01 % of the 945,029 tokens its README states).
    """
    prefill = [
        PrefillPoint(
            isl=int(float(row["isl"])),
            ttft_ms=float(row["ttft_ms"]),
            tokens_per_s_per_gpu=float(row["prefill_tokens_per_s_per_gpu"]),
        )
        for row in _csv_rows(Path(prefill_csv))
    ]
    decode: list[DecodePoint] = []
    implied_capacity: list[float] = []
    for row in _csv_rows(Path(decode_csv)):
        point = DecodePoint(
            context_length=int(float(row["context_length"])),
            concurrency=float(row["approx_concurrency"]),
            itl_ms=float(row["itl_ms"]),
            tokens_per_s_per_gpu=float(row["decode_tokens_per_s_per_gpu"]),
            kv_usage=float(row["kv_usage"]),
        )
        decode.append(point)
        if point.kv_usage:
            implied_capacity.append(point.concurrency * point.context_length / point.kv_usage)
    if kv_capacity_tokens is None:
        if not implied_capacity:
            raise ValueError(f"{decode_csv}: no row has kv_usage > 0; pass kv_capacity_tokens")
        kv_capacity_tokens = round(statistics.median(implied_capacity))
    return Profile(
        model=model,
        engine=engine,
        gpu=gpu,
        tensor_parallel=tensor_parallel,
        gpus_per_replica=gpus_per_replica or tensor_parallel,
        kv_capacity_tokens=kv_capacity_tokens,
        prefill=tuple(prefill),
        decode=tuple(decode),
        source=f"measured: {Path(prefill_csv).name}, {Path(decode_csv).name}",
    )


def _engine_name(calibration: perfmodel.Calibration) -> str:
    """The preset name of a calibration (`vllm`, `sglang`, ...), or `custom` for a hand-made one."""
    for name, preset in perfmodel.CALIBRATIONS.items():
        if preset == calibration:
            return name
    return "custom"


def from_performance_model(
    model: perfmodel.PerformanceModel,
    *,
    isls: Iterable[int],
    contexts: Iterable[int],
    concurrencies: Sequence[int],
    engine: str | None = None,
) -> Profile:
    """Evaluate the performance model on a grid, so a graph with no measurements still gets a profile.

    The points are what the same measurements would have recorded from an engine that behaves like
    the model: prefill TTFT is `model.ttft(isl)` (a lone request, overhead included) and throughput
    isl / ttft per GPU; decode ITL is `model.itl(concurrency, context)` and throughput counts only
    the sequences the engine runs at once (`calibration.max_num_seqs`), as a measured engine reports.
    Decode points whose sequences do not fit the KV cache are left out, like the measured grids that
    stop near a full cache; a context row left with fewer than two points is dropped.
    """
    gpus = model.tensor_parallel * model.pipeline_parallel
    kv_capacity = model.kv_capacity_tokens()
    prefill = []
    for isl in isls:
        ttft = model.ttft(isl)
        prefill.append(PrefillPoint(isl=isl, ttft_ms=ttft * 1e3, tokens_per_s_per_gpu=isl / ttft / gpus))
    decode: list[DecodePoint] = []
    for context in contexts:
        row = []
        for concurrency in concurrencies:
            if concurrency * context > kv_capacity:
                continue
            itl = model.itl(concurrency, context)
            running = min(concurrency, model.calibration.max_num_seqs)
            row.append(
                DecodePoint(
                    context_length=context,
                    concurrency=float(concurrency),
                    itl_ms=itl * 1e3,
                    tokens_per_s_per_gpu=running / itl / gpus,
                    kv_usage=concurrency * context / kv_capacity,
                )
            )
        if len(row) >= 2:
            decode.extend(row)
    engine = engine or _engine_name(model.calibration)
    return Profile(
        model=model.model.name,
        engine=engine,
        gpu=model.gpu.name,
        tensor_parallel=model.tensor_parallel,
        gpus_per_replica=gpus,
        kv_capacity_tokens=kv_capacity,
        prefill=tuple(prefill),
        decode=tuple(decode),
        source=(
            f"performance model: {model.model.name} on {gpus}× {model.gpu.name}, "
            f"TP{model.tensor_parallel} PP{model.pipeline_parallel}, {engine} calibration"
        ),
    )
