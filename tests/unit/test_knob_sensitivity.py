"""The constant-sensitivity benchmark's own logic: how a constant is moved, which reads a patch reaches, and
how a change is judged."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import source_files

from fleetpilot.planner import conformal, core

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Any:
    return source_files.load("knob_sensitivity", Path("benchmarks/knob_sensitivity.py"))


def test_a_level_near_one_moves_its_tail_a_count_stays_a_whole_count(bench: Any) -> None:
    tail = bench.Constant("m", "LEVEL", "tail")
    assert tail.moved(0.99, 2.0) == pytest.approx(0.98)
    assert tail.moved(0.99, 0.5) == pytest.approx(0.995)
    assert tail.moved(0.4, 2.0) == pytest.approx(0.0)  # the tail cannot pass 1
    count = bench.Constant("m", "N", "int")
    assert count.moved(6, 0.5) == 3 and count.moved(1, 0.5) == 1 and count.moved(5, 2.0) == 10
    assert bench.Constant("m", "X").moved(0.25, 2.0) == 0.5


def test_reads_bound_at_import_are_told_from_reads_at_call_time(bench: Any) -> None:
    source = ast.parse(
        "A = 1\nB = 2\nC = 3\nD = 4\n"
        "COPY = A\n"  # A read at import
        "def f(x=B):\n    return x\n"  # B a default argument
        "def g():\n    return C + other.D\n"  # C and D read when g runs
        "HELP = f'{D} per second'\n")  # a message, not a decision
    sources = [("m", source)]
    assert bench.bound_at_import(bench.Constant("m", "A"), sources) == ["m"]
    assert bench.bound_at_import(bench.Constant("m", "B"), sources) == ["m"]
    assert bench.bound_at_import(bench.Constant("m", "C"), sources) == []
    assert bench.bound_at_import(bench.Constant("m", "D"), sources) == []


def test_the_inventory_names_constants_that_exist(bench: Any) -> None:
    for constant in bench.CONSTANTS:
        module = importlib.import_module(constant.module)
        assert isinstance(getattr(module, constant.name), int | float), constant.label
    # a known default argument is found where it is
    trend_z = next(c for c in bench.CONSTANTS if c.name == "TREND_Z")
    assert bench.bound_at_import(trend_z) == ["fleetpilot.planner.reactive"]


def test_a_patch_reaches_every_copy_and_is_undone(bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = ModuleType("fleetpilot._copy_for_test")
    copy.LULL_SHARE = core.LULL_SHARE  # type: ignore[attr-defined]  # as `from core import LULL_SHARE` leaves it
    monkeypatch.setitem(sys.modules, copy.__name__, copy)
    shipped = core.LULL_SHARE
    with bench.patched(bench.Constant("fleetpilot.planner.core", "LULL_SHARE"), 2.0) as value:
        assert value == pytest.approx(2 * shipped)
        assert core.LULL_SHARE == copy.LULL_SHARE == pytest.approx(2 * shipped)  # type: ignore[attr-defined]
    assert core.LULL_SHARE == copy.LULL_SHARE == shipped  # type: ignore[attr-defined]
    with bench.patched(bench.Constant("fleetpilot.planner.conformal", "SCORE_WINDOW", "int"), 0.5):
        assert conformal.SCORE_WINDOW == 72 and isinstance(conformal.SCORE_WINDOW, int)
    assert conformal.SCORE_WINDOW == 144


def test_a_change_is_judged_over_every_row_and_factor(bench: Any) -> None:
    shipped = bench.Outcome(None, None, None, 10.0, True, 1.0)
    assert bench.change(bench.Outcome("c", 2.0, 1.0, 10.5, True, 1.0), shipped) == pytest.approx(0.05)
    assert bench.change(bench.Outcome("c", 2.0, 1.0, None, False, 1.0), shipped) is None
    never = bench.Outcome(None, None, None, None, False, 1.0)  # as shipped, no setting met the SLA
    assert bench.change(bench.Outcome("c", 2.0, 1.0, None, False, 1.0), never) == 0.0  # nor with it moved
    assert bench.change(bench.Outcome("c", 2.0, 1.0, 9.0, True, 1.0), never) is None
    assert bench.cell(bench.Outcome("c", 2.0, 1.0, None, False, 1.0), never) == "not met"
    assert bench.cell(bench.Outcome("c", 2.0, 1.0, 9.0, True, 1.0), never) == "met"
    assert bench.cell(bench.Outcome("c", 2.0, 1.0, 10.5, False, 1.0), shipped) == "+5.0%*"
    refused = bench.Outcome("c", 2.0, 1.0, None, False, 1.0, error="ttft_target_s must be positive")
    assert bench.cell(refused, shipped) == "refused: ttft_target_s must be positive"
    assert bench.verdict([0.01, -0.015]) == "1.5% (removal candidate)"
    assert bench.verdict([0.01, -0.03]) == "3.0%"
    assert bench.verdict([0.0, None]) == "changes whether the SLA is met"
