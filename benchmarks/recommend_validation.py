"""How often `fleetpilot recommend` picks the parallelism the measured sweeps say is cheapest at an SLA.

The calibration sweeps (`../shared/traces/calibration/silicon_sweeps_h100_h200.csv`) measured aggregated
engines at several tensor-parallel sizes and concurrencies per (engine, model, GPU, ISL, OSL). At an SLA
(mean TTFT ≤ T and mean TPOT ≤ I: the sweeps report means) the measured best parallelism is the one
whose best row within the SLA serves the most requests per second per GPU (closed loop: concurrency /
(TTFT + (OSL − 1) · TPOT) / TP). The SLAs are each group's own quartiles of measured TTFT and TPOT (nine
pairs), kept where at least one row meets it and two parallelisms were measured.

Two picks are scored against it:

- the recommender (`planner/recommend.py`, aggregated layouts of the measured sizes, the engine's
  calibration, SLA at p50, a load of 64 GPUs' worth at the measured best's rate): what
  `fleetpilot recommend --mode aggregated` says. Its sizing is the planner's (open-loop queues,
  time-shared prefill and decode), not the sweeps' closed loop, so this is the end-to-end check.
- the performance model under the sweeps' own conditions (`aggregated_steady_state` at the measured
  concurrencies): how well the model alone ranks, without the planner's sizing in between.

Both report the share of cases where the pick is the measured best, and the measured throughput per GPU
the pick gives up where it is not (a pick with no measured row within the SLA gives up everything).

Run: `python benchmarks/recommend_validation.py [--out benchmarks/results/recommend_validation.md]`
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from fleetpilot import perfmodel
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import recommend, sizing

# The shared traces beside the checkout; FLEETPILOT_TRACES names another copy (as for benchmarks/backtest.py).
TRACES = Path(os.environ.get("FLEETPILOT_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"))
SWEEPS = TRACES / "calibration" / "silicon_sweeps_h100_h200.csv"
EXPLAINED = (
    "A case is one engine/model/GPU/ISL/OSL group of the aggregated sweeps at one SLA (the group's own TTFT and "
    "TPOT quartiles, nine pairs), where at least one row meets it. Per pick: the share of cases where it is the "
    "measured best tensor-parallel size (most requests/s per GPU within the SLA); the share where its measured "
    "throughput per GPU is within 10% of the best's; the median throughput per GPU it gives up where it is not "
    "the best (100%: no measured row of the picked size meets the SLA). Picks: the recommender; the recommender "
    "sizing aggregated pools as the planner does (time-shared); the performance model's closed loop at the "
    "measured concurrencies.")
LOAD_GPUS = 64  # the load, in GPUs of the measured best: large enough that rounding a replica up hardly ranks


@dataclasses.dataclass(frozen=True)
class Row:
    tp: int
    concurrency: int
    ttft_s: float
    tpot_s: float

    def rate_per_gpu(self, osl: int) -> float:
        return self.concurrency / (self.ttft_s + (osl - 1) * self.tpot_s) / self.tp


@dataclasses.dataclass(frozen=True)
class Group:
    engine: str
    version: str
    model: str
    gpu: str
    isl: int
    osl: int
    rows: tuple[Row, ...]

    @property
    def tps(self) -> list[int]:
        return sorted({r.tp for r in self.rows})

    def calibration(self) -> str:
        return "trtllm-1.0" if self.engine == "trtllm" and self.version.startswith("1.0") else self.engine

    def label(self) -> str:
        return f"{self.engine} {self.version or '-'} {self.model} {self.gpu} {self.isl}/{self.osl}"


def load_groups(path: Path) -> list[Group]:
    grouped: dict[tuple[str, ...], list[Row]] = collections.defaultdict(list)
    for raw in csv.DictReader(path.open()):
        if raw["mode"] != "agg" or float(raw["pp_size"]) != 1:
            continue
        # Rows without a precision ran the 16-bit checkpoint (docs/perfmodel.md).
        model = raw["model_path"].split("/")[-1] + ("" if raw["precision"] else "@bf16")
        key = (raw["backend"], raw["backend_version"], model, raw["system"].replace("_", "-"), raw["isl"], raw["osl"])
        grouped[key].append(Row(int(float(raw["tp_size"])), int(float(raw["batch_size"])),
                                float(raw["silicon_ttft_ms"]) / 1e3, float(raw["silicon_tpot_ms"]) / 1e3))
    groups = []
    for (engine, version, model, gpu, isl, osl), rows in sorted(grouped.items()):
        name, _, bf16 = model.partition("@")
        group = Group(engine, version, name + ("@bf16" if bf16 else ""), gpu, int(isl), int(osl), tuple(rows))
        if len(group.tps) >= 2:
            groups.append(group)
    return groups


def _preset_of(group: Group) -> str:
    """The performance-model preset of a group's model (its 16-bit variant for rows without a precision)."""
    base, _, bf16 = group.model.partition("@")
    key = {"Llama-3.1-8B-Instruct": "llama-3.1-8b", "Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
           "Llama-3.1-70B": "llama-3.1-70b", "Qwen3-32B": "qwen3-32b"}[base]
    return key + ("-bf16" if bf16 else "")


def measured_best(group: Group, ttft_s: float, tpot_s: float) -> dict[int, float]:
    """Per parallelism, the best measured requests/s per GPU within the SLA (absent: no row within it)."""
    best: dict[int, float] = {}
    for row in group.rows:
        if row.ttft_s <= ttft_s and row.tpot_s <= tpot_s:
            best[row.tp] = max(best.get(row.tp, 0.0), row.rate_per_gpu(group.osl))
    return best


def modelled_best(group: Group, ttft_s: float, tpot_s: float) -> int | None:
    """The performance model's pick under the sweeps' own conditions (the measured concurrencies)."""
    spec, gpu = perfmodel.MODELS[_preset_of(group)], perfmodel.GPUS[group.gpu]
    calibration = perfmodel.CALIBRATIONS[group.calibration()]
    scores: dict[int, float] = {}
    for row in group.rows:
        engine = perfmodel.PerformanceModel(spec, gpu, row.tp, calibration=calibration)
        if engine.kv_capacity_tokens() < group.isl + group.osl:
            continue
        state = engine.aggregated_steady_state(group.isl, group.osl, row.concurrency)
        if state.ttft <= ttft_s and state.tpot <= tpot_s:
            scores[row.tp] = max(scores.get(row.tp, 0.0), state.request_rate / row.tp)
    return max(scores, key=lambda tp: (scores[tp], -tp)) if scores else None


def recommended(group: Group, ttft_s: float, tpot_s: float, rate_rps: float, *, planner_sizing: bool = False,
                ) -> int | None:
    """What `fleetpilot recommend --mode aggregated` picks among the measured parallelisms; with
    `planner_sizing`, what it picks when it sizes aggregated pools as the planner does (time-sharing: what
    it does for a measured profile)."""
    spec, gpu = perfmodel.MODELS[_preset_of(group)], perfmodel.GPUS[group.gpu]
    candidates, _ = recommend.modelled_candidates(
        spec, gpu, isl=group.isl, osl=group.osl, calibration=perfmodel.CALIBRATIONS[group.calibration()],
        splits=[recommend.Parallelism(tp) for tp in group.tps])
    if planner_sizing:
        candidates = [dataclasses.replace(c, engine=None) for c in candidates]
    if not candidates:
        return None
    sla = api.SlaTarget(ttft_ms=ttft_s * 1e3, itl_ms=tpot_s * 1e3, percentile=50)
    result = recommend.recommend(candidates, sizing.Load(rate_rps=rate_rps, isl=group.isl, osl=group.osl), sla,
                                 modes=("aggregated",))
    best = result.best
    return best.pools["aggregated"].parallelism.tensor if best is not None else None


@dataclasses.dataclass
class Tally:
    cases: int = 0
    hits: int = 0
    near: int = 0  # within 10% of the measured best's throughput per GPU
    lost: list[float] = dataclasses.field(default_factory=list)  # throughput per GPU given up, misses only

    def add(self, pick: int | None, measured: dict[int, float]) -> None:
        best = max(measured.values())
        self.cases += 1
        self.near += measured.get(pick or 0, 0.0) >= 0.9 * best
        if pick is not None and measured.get(pick, 0.0) >= best:
            self.hits += 1
        else:
            self.lost.append(1.0 - measured.get(pick, 0.0) / best if pick is not None else 1.0)

    def cells(self) -> str:
        """`hits (share) | within 10% | median loss of the misses` as Markdown cells."""
        lost = f"{statistics.median(self.lost):.0%}" if self.lost else "-"
        return (f"{self.hits}/{self.cases} ({self.hits / max(self.cases, 1):.0%}) | "
                f"{self.near / max(self.cases, 1):.0%} | {lost}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", type=Path, default=SWEEPS)
    parser.add_argument("--out", type=Path, default=None, help="also write the table as Markdown here")
    args = parser.parse_args()

    started = time.perf_counter()
    picks_named = ("recommender", "recommender, planner's aggregated sizing", "model, closed loop")
    by_stack: dict[str, list[Tally]] = collections.defaultdict(lambda: [Tally() for _ in picks_named])
    total = [Tally() for _ in picks_named]
    misses: list[str] = []
    for group in load_groups(args.sweeps):
        ttft_quartiles = statistics.quantiles(sorted(r.ttft_s for r in group.rows), n=4)
        tpot_quartiles = statistics.quantiles(sorted(r.tpot_s for r in group.rows), n=4)
        for ttft_s in ttft_quartiles:
            for tpot_s in tpot_quartiles:
                measured = measured_best(group, ttft_s, tpot_s)
                if not measured:
                    continue
                rate = LOAD_GPUS * max(measured.values())
                picks = (recommended(group, ttft_s, tpot_s, rate),
                         recommended(group, ttft_s, tpot_s, rate, planner_sizing=True),
                         modelled_best(group, ttft_s, tpot_s))
                stack = f"{group.engine} {group.model.partition('@')[0]} {group.gpu}"
                for index, pick in enumerate(picks):
                    total[index].add(pick, measured)
                    by_stack[stack][index].add(pick, measured)
                best = max(measured, key=lambda tp: measured[tp])
                if picks[0] != best:
                    misses.append(f"{group.label()} TTFT≤{ttft_s * 1e3:.0f} ms TPOT≤{tpot_s * 1e3:.1f} ms: measured "
                                  f"best TP{best} ({measured[best]:.3g} req/s/GPU), recommended "
                                  f"TP{picks[0]} ({measured.get(picks[0] or 0, 0.0):.3g})")
    seconds = time.perf_counter() - started

    header = " | ".join(f"{name}: = measured best | within 10% | loss when not" for name in picks_named)
    lines = [f"| stack | cases | {header} |", "|---|---|" + "---|" * 3 * len(picks_named)]
    for stack, tallies in sorted(by_stack.items()):
        lines.append(f"| {stack} | {tallies[0].cases} | " + " | ".join(t.cells() for t in tallies) + " |")
    lines.append(f"| **all** | {total[0].cases} | " + " | ".join(t.cells() for t in total) + " |")
    text = "\n".join(lines)
    print(text)
    print(f"\n{len(misses)} recommender misses (first 15):")
    for line in misses[:15]:
        print(f"  {line}")
    cases = total[0].cases
    print(f"\n{cases} cases in {seconds:.1f} s")
    if args.out is not None:
        args.out.write_text(f"# Recommender vs the measured sweeps\n\n`python benchmarks/recommend_validation.py`"
                            f" ({cases} cases, {seconds:.1f} s)\n\n{EXPLAINED}\n\n{text}\n\nRecommender misses:\n\n"
                            + "\n".join(f"- {line}" for line in misses) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
