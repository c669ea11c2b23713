"""How much each behavioural constant of the planner matters: each moved ×0.5 and ×2, on the backtest's rows.

For every constant of the inventory (docs/planner-constants.md: the principled, measured and fitted ones; not
the user's defaults, not the guards), and for each row (`--quick`: the two quick rows; `--row TEXT`: the full
run's rows whose label contains it; `--family N`: seeds of the synthetic family), the fleetpilot policy's
whole risk sweep runs three times: as shipped, with the constant halved, and with it doubled. The table gives
the change of GPU-hours to meet the SLA (read off the sweep as the backtest reads it) against the run as
shipped, per row, and the largest change over the rows. A constant whose every change stays within 2% on
every row holds up no result of these rows: the planner issue removes such a constant with the mechanism it
served.

How a constant is moved depends on what it is (`Constant.scale`):
- `value`: multiplied;
- `int`: multiplied and rounded, at least 1 (a count of intervals or readings);
- `tail`: a level near 1 (a quantile, a utilisation ceiling) has its distance from 1 multiplied, so ×2 of
  0.99 is 0.98 and ×0.5 is 0.995 (doubling 0.99 itself means nothing).
A moved value the planner refuses (its own ValueError, e.g. a share of 1 that leaves a latency target of
zero) is reported as refused, not as a change.
Every module that holds the same object under the constant's name is patched (a `from m import NAME` copy
too). A constant that the planner binds at import (a default argument, a dataclass field, another module-level
constant computed from it) cannot be moved this way: `bound_at_import` finds those by reading the source,
and the table says so instead of reporting a change of zero.

The runs are shared out over `--workers` forked processes; a patch is undone when its run ends.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/knob_sensitivity.py --quick [--workers 2]`
(about a minute per constant on the quick rows), `--family 20` for the family, `--constant NAME` (repeatable)
for some constants only. Writes benchmarks/results/knob_sensitivity.md (or `--out`), after every row.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the planner runs; before numpy

from fleetpilot.planner.backtest import evaluate

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
FACTORS = (0.5, 2.0)
NEGLIGIBLE = 0.02  # a change this small on every row: the constant holds up no result of these rows

Scale = Literal["value", "int", "tail"]


@dataclasses.dataclass(frozen=True)
class Constant:
    """One behavioural constant: where it lives and how it is moved."""

    module: str  # importable name, e.g. fleetpilot.planner.core
    name: str
    scale: Scale = "value"

    @property
    def label(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.name}"

    def moved(self, value: float, factor: float) -> float:
        if self.scale == "int":
            return max(1, round(value * factor))
        if self.scale == "tail":
            return 1.0 - min(1.0, (1.0 - value) * factor)
        return value * factor


PLANNER = "fleetpilot.planner"
# The inventory's behavioural constants (docs/planner-constants.md), in its order.
CONSTANTS: tuple[Constant, ...] = (
    Constant(f"{PLANNER}.conformal", "SCORE_WINDOW", "int"),
    Constant(f"{PLANNER}.conformal", "MAX_SCORE_WINDOW", "int"),
    Constant(f"{PLANNER}.conformal", "STEP_SIZE"),
    Constant(f"{PLANNER}.conformal", "RISE_BAND"),
    Constant(f"{PLANNER}.conformal", "MIN_SCORES", "int"),
    Constant(f"{PLANNER}.core", "CALIBRATION_INTERVALS", "int"),
    Constant(f"{PLANNER}.core", "MIX_INTERVALS", "int"),
    Constant(f"{PLANNER}.capacity", "DEFAULT_MAX_UTILIZATION", "tail"),
    Constant(f"{PLANNER}.sizing", "CORRECTION_MIN"),
    Constant(f"{PLANNER}.sizing", "CORRECTION_MAX"),
    Constant(f"{PLANNER}.sizing", "OFFSET_MAX_SHARE"),
    Constant(f"{PLANNER}.sizing", "POOLING_PRIOR"),
    Constant(f"{PLANNER}.sizing", "INFEASIBLE_SLACK"),
    Constant(f"{PLANNER}.core", "_SATURATED", "tail"),
    Constant(f"{PLANNER}.core", "_SLOTS_FULL"),
    Constant(f"{PLANNER}.core", "_HANDOFF_STEPS"),
    Constant(f"{PLANNER}.core", "_HANDOFF_QUANTILE", "tail"),
    Constant("fleetpilot.api.contract", "BURST_WINDOW_S"),
    Constant(f"{PLANNER}.core", "CAUTIOUS_RISK", "tail"),
    Constant(f"{PLANNER}.core", "CAUTIOUS_RARER"),
    Constant(f"{PLANNER}.core", "_SILENCE_EXPECTED"),
    Constant(f"{PLANNER}.core", "LULL_SHARE"),
    Constant(f"{PLANNER}.core", "_SILENCE_HISTORY", "int"),
    Constant(f"{PLANNER}.core", "OUTAGE_HOLD_S"),
    Constant(f"{PLANNER}.reactive", "TREND_WINDOW_S"),
    Constant(f"{PLANNER}.reactive", "TREND_Z"),
    Constant(f"{PLANNER}.reactive", "MAX_STEP_SHARE"),
    Constant(f"{PLANNER}.drift", "MIN_INTERVALS", "int"),
)


def _sources() -> Iterable[tuple[str, ast.Module]]:
    for folder, package in ((REPO / "planner", PLANNER), (REPO / "fleetpilot" / "api", "fleetpilot.api")):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            yield ".".join((package, *parts)).removesuffix(".__init__"), ast.parse(path.read_text())


def _reads(tree: ast.Module, name: str) -> tuple[int, int]:
    """(reads inside a function's body, reads anywhere else: module level, class bodies, default arguments).
    A read inside an f-string is a message's, not a decision's, and is not counted."""
    inside: set[int] = set()
    messages = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for sub in ast.walk(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            body = node.body if isinstance(node.body, list) else [node.body]
            for part in body:
                for sub in ast.walk(part):
                    inside.add(id(sub))
    within = elsewhere = 0
    for node in ast.walk(tree):
        read = (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)) or (
            isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load))
        if read and id(node) not in messages:
            if id(node) in inside:
                within += 1
            else:
                elsewhere += 1
    return within, elsewhere


def bound_at_import(constant: Constant, sources: Sequence[tuple[str, ast.Module]] | None = None) -> list[str]:
    """The modules that read `constant` outside a function body (so a patch after import misses that read);
    empty when every read happens at call time. Reads of the name in modules that do not define or import it
    are counted too: a name shared by two constants errs towards reporting, never towards a silent zero."""
    found = []
    for module, tree in sources if sources is not None else list(_sources()):
        _, elsewhere = _reads(tree, constant.name)
        if elsewhere:
            found.append(module)
    return found


@contextlib.contextmanager
def patched(constant: Constant, factor: float) -> Iterator[float]:
    """`constant` moved by `factor` in every loaded module that holds it, for the block; yields the new value.
    Restored after: a pool's worker process runs many tasks, and a patch must not reach the next one."""
    home = importlib.import_module(constant.module)
    old = getattr(home, constant.name)
    new = constant.moved(old, factor)
    holders = [module for module in list(sys.modules.values())
               if isinstance(module, ModuleType) and module.__name__.startswith("fleetpilot")
               and getattr(module, constant.name, None) is old]
    for module in holders:
        setattr(module, constant.name, type(old)(new) if isinstance(old, int) and not isinstance(old, bool) else new)
    try:
        yield float(new)
    finally:
        for module in holders:
            setattr(module, constant.name, old)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The fleetpilot sweep on one row, as shipped or with one constant moved."""

    constant: str | None
    factor: float | None
    value: float | None  # the constant's value in this run
    gpu_hours_to_meet: float | None  # None: no setting met the SLA
    bracketed: bool
    seconds: float
    error: str = ""  # the moved value put the planner outside what it accepts (its ValueError)


_SHARED: dict[str, Any] = {}


def run_one(constant: Constant | None, factor: float | None) -> Outcome:
    """One sweep of `_SHARED`'s policy on `_SHARED`'s scenario, with `constant` moved (in this forked process)."""
    scenario: evaluate.Scenario = _SHARED["scenario"]
    began = time.perf_counter()
    label = constant.label if constant else None
    with contextlib.ExitStack() as stack:
        value = stack.enter_context(patched(constant, factor)) if constant is not None and factor is not None else None
        try:
            group = evaluate.run_group(scenario, _SHARED["policy"], needs=_SHARED["needs"])
        except ValueError as refused:
            if constant is None:
                raise
            return Outcome(label, factor, value, None, False, time.perf_counter() - began, error=str(refused))
    to_meet = evaluate.driver.cost_to_meet(group.results, scenario.sla.percentile / 100.0)
    return Outcome(label, factor, value, to_meet.gpu_hours, to_meet.bracketed,
                   time.perf_counter() - began)


def change(outcome: Outcome, shipped: Outcome) -> float | None:
    """The relative change of GPU-hours to meet against the run as shipped. None: one of the two met the SLA
    and the other did not; 0 when neither did (moving the constant changed nothing that is scored)."""
    if outcome.gpu_hours_to_meet is None and shipped.gpu_hours_to_meet is None:
        return 0.0
    if outcome.gpu_hours_to_meet is None or shipped.gpu_hours_to_meet is None:
        return None
    return outcome.gpu_hours_to_meet / shipped.gpu_hours_to_meet - 1.0


def cell(outcome: Outcome, shipped: Outcome) -> str:
    if outcome.error:
        return f"refused: {outcome.error}"
    if outcome.gpu_hours_to_meet is None:
        return "not met"
    if shipped.gpu_hours_to_meet is None:
        return "met"
    delta = outcome.gpu_hours_to_meet / shipped.gpu_hours_to_meet - 1.0
    return f"{delta:+.1%}" + ("" if outcome.bracketed else "*")


def verdict(changes: Sequence[float | None]) -> str:
    """Over every row and factor: the largest change, and whether the constant holds up any result."""
    if any(c is None for c in changes):
        return "changes whether the SLA is met"
    largest = max((abs(c) for c in changes if c is not None), default=0.0)
    return f"{largest:.1%}" + (" (removal candidate)" if largest <= NEGLIGIBLE else "")


def report(args: argparse.Namespace, labels: Sequence[str], shipped: dict[str, Outcome],
           moved: dict[tuple[str, str, float], Outcome], constants: Sequence[Constant],
           bound: dict[str, list[str]], total_s: float, finished: bool) -> str:
    command = " ".join(["benchmarks/knob_sensitivity.py", *sys.argv[1:]])
    lines = [
        "# Planner constants: sensitivity", "",
        (f"Generated by `~/.cache/fleetpilot/venv/bin/python {command}` ({args.workers} workers, "
         f"{total_s / 60:.1f} min on the 2-core development machine"
         f"{'' if finished else '; stopped before every row ran'})."),
        (f"Policy `{args.policy}`, its whole risk sweep on each row. Each cell: the change of GPU-hours to meet the "
         "SLA against the run as shipped (`*`: read at an end of the sweep, not bracketed); \"not met\": no setting "
         f"met it with the constant moved. A constant within {NEGLIGIBLE:.0%} on every row and factor is a removal "
         "candidate for these rows only: the planner issue's rule reads every shared row and the synthetic family. "
         "How constants are moved and what \"bound at import\" means: the script's docstring."), "",
        "| row | GPU-h to meet, as shipped |", "|---|---:|"]
    for label in labels:
        s = shipped[label]
        lines.append(f"| {label} | {'not met' if s.gpu_hours_to_meet is None else f'{s.gpu_hours_to_meet:.2f}'}"
                     f"{'' if s.bracketed or s.gpu_hours_to_meet is None else '*'} |")
    lines += ["", "| constant | moved to | " + " | ".join(f"{label} ×{f:g}" for label in labels for f in FACTORS)
              + " | largest change |", "|---|---|" + "---:|" * (len(labels) * len(FACTORS) + 1)]
    for constant in constants:
        if bound[constant.label]:
            lines.append(f"| `{constant.label}` | bound at import in {', '.join(bound[constant.label])}: not moved |"
                         + " |" * (len(labels) * len(FACTORS) + 1))
            continue
        outcomes = [moved.get((label, constant.label, f)) for label in labels for f in FACTORS]
        values = sorted({o.value for o in outcomes if o is not None and o.value is not None})
        cells = [cell(o, shipped[label]) if o is not None else "—"
                 for (label, _), o in zip([(label, f) for label in labels for f in FACTORS], outcomes, strict=True)]
        changes = [change(o, shipped[label]) for (label, _), o in
                   zip([(label, f) for label in labels for f in FACTORS], outcomes, strict=True)
                   if o is not None and not o.error]
        lines.append(f"| `{constant.label}` | {', '.join(f'{v:g}' for v in values)} | " + " | ".join(cells)
                     + f" | {verdict(changes) if changes else '—'}"
                     + ("; a move was refused" if any(o is not None and o.error for o in outcomes) else "") + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    rows = parser.add_mutually_exclusive_group(required=True)
    rows.add_argument("--quick", action="store_true", help="the backtest's two quick rows")
    rows.add_argument("--row", action="append", default=[], metavar="TEXT",
                      help="the full run's rows whose label contains TEXT (repeatable)")
    rows.add_argument("--family", type=int, default=0, metavar="N", help="seeds 0..N-1 of the synthetic family")
    parser.add_argument("--constant", action="append", default=[], metavar="NAME",
                        help="only these constants (e.g. LULL_SHARE; repeatable)")
    parser.add_argument("--policy", default="fleetpilot-constant")
    parser.add_argument("--out", type=Path, default=RESULTS / "knob_sensitivity.md")
    args = parser.parse_args()
    constants = [c for c in CONSTANTS if not args.constant or c.name in args.constant]
    if not constants:
        parser.error(f"no constant is called any of {args.constant}")
    import backtest  # the backtest benchmark's rows and scenarios; benchmarks/ is this script's sys.path[0]
    chosen = [row for row in backtest.rows(args.quick, False, range(args.family))
              if not args.row or any(text in row.label for text in args.row)]
    if not chosen:
        parser.error(f"no row's label contains any of {args.row}")
    sources = list(_sources())
    bound = {c.label: bound_at_import(c, sources) for c in constants}
    movable = [c for c in constants if not bound[c.label]]
    profile = evaluate.load_profile(str(backtest.PROFILE))
    began = time.perf_counter()
    labels: list[str] = []
    shipped: dict[str, Outcome] = {}
    moved: dict[tuple[str, str, float], Outcome] = {}
    context = multiprocessing.get_context("fork")
    for row in chosen:
        scenario = backtest.scenario(row, profile, workers=args.workers)
        _SHARED.update(scenario=scenario, policy=args.policy, needs=scenario.needs(1.0))
        print(f"== {row.label}: {len(movable)} constants × {len(FACTORS)} factors + the shipped run", flush=True)
        tasks: list[tuple[Constant | None, float | None]] = [(None, None)] + [(c, f) for c in movable for f in FACTORS]
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            futures = {pool.submit(run_one, c, f): (c, f) for c, f in tasks}
            for future in concurrent.futures.as_completed(futures):
                outcome = future.result()
                if outcome.constant is None:
                    shipped[row.label] = outcome
                else:
                    assert outcome.factor is not None
                    moved[(row.label, outcome.constant, outcome.factor)] = outcome
                print(f"   {outcome.constant or 'as shipped':28} ×{outcome.factor or 1:g}: GPU-h to meet "
                      f"{outcome.gpu_hours_to_meet if outcome.gpu_hours_to_meet is None else round(outcome.gpu_hours_to_meet, 3)}"
                      f" ({outcome.seconds:.0f} s)", flush=True)
        labels.append(row.label)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report(args, labels, shipped, moved, constants, bound,
                                   time.perf_counter() - began, finished=row is chosen[-1]))
    print(f"wrote {args.out} in {(time.perf_counter() - began) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
