"""The scoreboard's two numbers: the strongest baseline of a row, and the share of the possible saving
over it that a policy captures."""

from __future__ import annotations

import pytest

from fleetpilot.planner.backtest import scores

BASELINES = ("static-peak", "hpa", "dynamo")


def test_the_strongest_baseline_is_the_cheapest_baseline_that_met_the_sla() -> None:
    costs = {"static-peak": 12.0, "hpa": None, "dynamo": 9.5, "fleetpilot-arima": 7.0, "oracle": 5.0}
    # fleetpilot and the oracle are cheaper, but no baseline; hpa never met the SLA.
    assert scores.strongest_baseline(costs, BASELINES) == ("dynamo", 9.5)
    assert scores.strongest_baseline({"static-peak": None, "hpa": None}, BASELINES) is None
    assert scores.strongest_baseline({"oracle": 1.0}, BASELINES) is None


def test_the_captured_share_runs_from_the_baselines_cost_to_the_oracles() -> None:
    assert scores.captured_share(baseline=10.0, ours=7.0, oracle=4.0) == pytest.approx(0.5)
    assert scores.captured_share(baseline=10.0, ours=4.0, oracle=4.0) == pytest.approx(1.0)
    assert scores.captured_share(baseline=10.0, ours=10.0, oracle=4.0) == pytest.approx(0.0)
    assert scores.captured_share(baseline=10.0, ours=13.0, oracle=4.0) == pytest.approx(-0.5)  # dearer than it


def test_there_is_no_share_where_the_baseline_is_already_the_oracles_cost() -> None:
    assert scores.captured_share(baseline=4.0, ours=5.0, oracle=4.0) is None
    assert scores.captured_share(baseline=3.9, ours=5.0, oracle=4.0) is None
