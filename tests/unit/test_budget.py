"""Shared GPU budgets: the split by priority (by hand and as properties) and the ledger the live planner
and the backtest keep across intervals: grant, claim, release, and the same grants whatever the order."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetpilot.planner import budget as budgets

PROPERTY = settings(deadline=None, max_examples=150)


# -- split_budget ------------------------------------------------------------------------------------------


def test_split_budget_by_hand() -> None:
    """Budget 20. Minimums 2 + 2 + 1 = 5 first; 15 left. Priority 10 ("chat") wants 8 more: all of it;
    7 left for the two priority-1 graphs wanting 6 and 8 more: in proportion 7 × 6/14 = 3 and
    7 × 8/14 = 4."""
    claims = [
        budgets.BudgetClaim("chat", priority=10, min_gpus=2, wanted_gpus=10),
        budgets.BudgetClaim("batch-a", priority=1, min_gpus=2, wanted_gpus=8),
        budgets.BudgetClaim("batch-b", priority=1, min_gpus=1, wanted_gpus=9),
    ]
    split = budgets.split_budget(claims, 20)
    assert dict(split.gpus) == {"chat": 10, "batch-a": 5, "batch-b": 5}
    assert "all it wants" in split.reasons["chat"]
    assert "of the 8 GPUs it wants" in split.reasons["batch-a"]


def test_split_budget_when_minimums_exceed_it_gives_each_its_minimum() -> None:
    claims = [
        budgets.BudgetClaim("a", priority=5, min_gpus=6, wanted_gpus=10),
        budgets.BudgetClaim("b", priority=1, min_gpus=6, wanted_gpus=6),
    ]
    split = budgets.split_budget(claims, 8)
    assert dict(split.gpus) == {"a": 6, "b": 6}
    assert all("over the budget of 8" in reason for reason in split.reasons.values())


def test_split_budget_leaves_unwanted_gpus_alone() -> None:
    split = budgets.split_budget([budgets.BudgetClaim("a", priority=0, min_gpus=1, wanted_gpus=3)], 10)
    assert dict(split.gpus) == {"a": 3}


claims_lists = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 8), st.integers(0, 20)), min_size=1, max_size=6
).map(
    lambda rows: [
        budgets.BudgetClaim(f"g{i}", priority=priority, min_gpus=low, wanted_gpus=want)
        for i, (priority, low, want) in enumerate(rows)
    ]
)


@PROPERTY
@given(claims=claims_lists, budget=st.integers(0, 80))
def test_split_budget_properties(claims: list[budgets.BudgetClaim], budget: int) -> None:
    split = budgets.split_budget(claims, budget)
    grants = split.gpus
    assert set(grants) == {c.graph for c in claims} == set(split.reasons)
    minimums = sum(c.min_gpus for c in claims)
    for claim in claims:
        assert claim.min_gpus <= grants[claim.graph] <= max(claim.wanted_gpus, claim.min_gpus)
    if minimums > budget:
        assert all(grants[c.graph] == c.min_gpus for c in claims)
        return
    assert sum(grants.values()) <= budget
    # Priorities: a graph short of its want means no lower-priority graph got anything above its minimum.
    for short in claims:
        if grants[short.graph] < max(short.wanted_gpus, short.min_gpus):
            for lower in claims:
                if lower.priority < short.priority:
                    assert grants[lower.graph] == lower.min_gpus
    # Nothing is held back while someone still wants more.
    if any(grants[c.graph] < max(c.wanted_gpus, c.min_gpus) for c in claims):
        assert sum(grants.values()) == budget


# -- the ledger ----------------------------------------------------------------------------------------------


def test_a_shared_budget_serves_the_higher_priority_graph_first() -> None:
    ledger = budgets.BudgetLedger({"shared": 16})
    ledger.claim("shared", budgets.BudgetClaim(graph="ns/gold", priority=10, min_gpus=2, wanted_gpus=12))
    ledger.claim("shared", budgets.BudgetClaim(graph="ns/bronze", priority=0, min_gpus=2, wanted_gpus=12))
    view = ledger.view("shared")
    gold = budgets.grant(view, graph="ns/gold", priority=10, min_gpus=2).gpus
    bronze = budgets.grant(view, graph="ns/bronze", priority=0, min_gpus=2).gpus
    assert (gold, bronze) == (12, 4)
    capped, why = dataclasses.astuple(budgets.grant(view, graph="ns/gold", priority=10, min_gpus=2, own_cap=6))
    assert capped == 6 and "gpuBudget 6" in why


def test_a_grant_stays_within_the_budget_and_a_newcomer_counts_at_its_minimum() -> None:
    ledger = budgets.BudgetLedger({"shared": 10})
    first = budgets.grant(ledger.view("shared"), graph="a", priority=0, min_gpus=2)
    assert first.gpus == 2 and "all it wants" in first.reason  # it has said nothing more yet
    assert ledger.claims("shared") == []  # a grant is read, never written: the claim is the step's to make
    ledger.claim("shared", budgets.BudgetClaim("a", priority=0, min_gpus=2, wanted_gpus=30))
    assert budgets.grant(ledger.view("shared"), graph="a", priority=0, min_gpus=2).gpus == 10
    # b arrives: its minimum comes out of a's share, never out of the budget's cap.
    assert budgets.grant(ledger.view("shared"), graph="b", priority=5, min_gpus=3).gpus == 3
    assert budgets.minimums(ledger.view("shared"), graph="b", min_gpus=3) == 5
    ledger.claim("shared", budgets.BudgetClaim("b", priority=5, min_gpus=3, wanted_gpus=3))
    assert budgets.grant(ledger.view("shared"), graph="a", priority=0, min_gpus=2).gpus == 7
    assert [c.graph for c in ledger.claims("shared")] == ["a", "b"]


def test_a_graph_leaving_frees_its_share() -> None:
    ledger = budgets.BudgetLedger({"shared": 12})
    ledger.claim("shared", budgets.BudgetClaim("gold", priority=10, min_gpus=1, wanted_gpus=10))
    ledger.claim("shared", budgets.BudgetClaim("bronze", priority=0, min_gpus=1, wanted_gpus=10))
    assert budgets.grant(ledger.view("shared"), graph="bronze", priority=0, min_gpus=1).gpus == 2
    ledger.release("gold")
    assert ledger.claims("shared") == [budgets.BudgetClaim("bronze", priority=0, min_gpus=1, wanted_gpus=10)]
    assert budgets.grant(ledger.view("shared"), graph="bronze", priority=0, min_gpus=1).gpus == 10
    ledger.release("gold")  # releasing twice is harmless


def test_a_graph_claims_one_budget_at_a_time() -> None:
    ledger = budgets.BudgetLedger({"a": 8, "b": 8})
    ledger.claim("a", budgets.BudgetClaim("g", priority=0, min_gpus=1, wanted_gpus=6))
    ledger.claim("a", budgets.BudgetClaim("h", priority=0, min_gpus=1, wanted_gpus=6))
    assert budgets.grant(ledger.view("a"), graph="h", priority=0, min_gpus=1).gpus == 4
    # g now names budget b: granted its minimum as a newcomer, it claims there and leaves a to h.
    assert budgets.grant(ledger.view("b"), graph="g", priority=0, min_gpus=1).gpus == 1
    ledger.claim("b", budgets.BudgetClaim("g", priority=0, min_gpus=1, wanted_gpus=1))
    assert [c.graph for c in ledger.claims("a")] == ["h"]
    assert budgets.grant(ledger.view("a"), graph="h", priority=0, min_gpus=1).gpus == 6


def test_the_ledger_knows_its_budgets_only() -> None:
    ledger = budgets.BudgetLedger({"shared": 4})
    assert "shared" in ledger and "other" not in ledger
    with pytest.raises(KeyError, match="no budget 'other'"):
        ledger.claim("other", budgets.BudgetClaim("g", priority=0, min_gpus=0, wanted_gpus=1))
    with pytest.raises(ValueError, match="≥ 0"):
        budgets.BudgetLedger({"broken": -1})


@PROPERTY
@given(claims=claims_lists, budget=st.integers(0, 80))
def test_grants_do_not_depend_on_the_order_claims_came_in(claims: list[budgets.BudgetClaim], budget: int) -> None:
    """Determinism: every order of the same claims gives every graph the same grant and reason."""
    seen = set()
    for order in itertools.islice(itertools.permutations(claims), 6):
        ledger = budgets.BudgetLedger({"shared": budget})
        for claim in order:
            ledger.claim("shared", claim)
        grants = tuple(
            dataclasses.astuple(budgets.grant(ledger.view("shared"), graph=c.graph, priority=c.priority, min_gpus=c.min_gpus))
            for c in claims
        )
        seen.add(grants)
    assert len(seen) == 1
