"""Shared GPU budgets: a pure ledger of who claims what, and each graph's share.

Where it sits: inside the planning step (planner/step.py), before `sizing.constrain`. Graphs that name
the same budget in `spec.planner.budget` share its GPUs; each interval a graph is granted its share
(`grant`: its `gpu_budget` for `constrain`) from every graph's latest claim, and after planning it
claims what its decision would use without the budget. The live planner keeps one `BudgetLedger` of
the claims across intervals, and so does the backtest driver when it runs several graphs under one
budget (`planner.backtest.driver.run_shared`); both hand the step the ledger's `view`.

How a budget is split (`split_budget`): minimums first, then by priority, highest first; graphs of
one priority that cannot all be served share in proportion to what they want above their minimums.
Pure and deterministic: plain data in and out, every result independent of the order claims came in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

# -- splitting one budget ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BudgetClaim:
    """One graph's claim on a shared GPU budget: its priority, its minimum, and what it wants.

    `min_gpus` is what the graph's scaling.min replicas use; `wanted_gpus` what its constrained
    decision would use without the budget (run `constrain` with gpu_budget=None to get it).
    """

    graph: str
    priority: int
    min_gpus: int
    wanted_gpus: int


@dataclasses.dataclass(frozen=True)
class BudgetSplit:
    """GPUs granted per graph (each graph's `gpu_budget` for `constrain`), and why, per graph."""

    gpus: Mapping[str, int]
    reasons: Mapping[str, str]


def _share(amount: int, weights: Mapping[str, int]) -> dict[str, int]:
    """Split `amount` in proportion to `weights` (largest remainder; ties by name), never above a weight."""
    total = sum(weights.values())
    exact = {name: amount * weight / total for name, weight in weights.items()}
    shares = {name: min(weights[name], math.floor(value)) for name, value in exact.items()}
    left = amount - sum(shares.values())
    for name in sorted(weights, key=lambda n: (-(exact[n] - shares[n]), n)):
        if left <= 0:
            break
        if shares[name] < weights[name]:
            shares[name] += 1
            left -= 1
    return shares


def split_budget(claims: Sequence[BudgetClaim], budget: int) -> BudgetSplit:
    """Share one GPU budget between the graphs that name it.

    1. Every graph gets its minimum first. When the minimums alone exceed the budget, every graph
       gets exactly its minimum and nothing more: scaling.min is the graph's own promise (the planner
       never scales below it), so the budget is overrun by that much and every reason says so.
    2. What is left goes by priority, highest first: a priority level is granted its wants in full
       before any lower level gets a GPU above its minimum. Graphs of the same priority that cannot
       all be served share what is left in proportion to what they want above their minimums.
    3. GPUs nobody wants stay unallocated (a grant is a cap, not a target).

    GPUs are granted one at a time; a graph whose replicas take several GPUs uses what its replicas fit.
    """
    if budget < 0:
        raise ValueError(f"budget must be ≥ 0, got {budget}")
    names = [claim.graph for claim in claims]
    if len(set(names)) != len(names):
        raise ValueError(f"each graph may claim a budget once, got {names}")
    for claim in claims:
        if claim.min_gpus < 0 or claim.wanted_gpus < 0:
            raise ValueError(f"{claim.graph}: min_gpus and wanted_gpus must be ≥ 0")

    minimums = sum(claim.min_gpus for claim in claims)
    if minimums > budget:
        note = (
            f"the minimums of the graphs sharing this budget need {minimums} GPUs, over the budget of {budget}: "
            "each graph gets its minimum only; raise the budget or lower scaling.min"
        )
        return BudgetSplit({c.graph: c.min_gpus for c in claims}, {c.graph: note for c in claims})

    grants = {claim.graph: claim.min_gpus for claim in claims}
    reasons: dict[str, str] = {}
    left = budget - minimums
    for priority in sorted({claim.priority for claim in claims}, reverse=True):
        level = [claim for claim in claims if claim.priority == priority]
        extra = {c.graph: max(0, c.wanted_gpus - c.min_gpus) for c in level if c.wanted_gpus > c.min_gpus}
        asked = sum(extra.values())
        given = extra if asked <= left else _share(left, extra)
        left -= sum(given.values())
        for claim in level:
            grant = grants[claim.graph] = claim.min_gpus + given.get(claim.graph, 0)
            want = max(claim.wanted_gpus, claim.min_gpus)
            if grant >= want:
                reasons[claim.graph] = f"granted {grant} of {budget} GPUs: all it wants (priority {priority})"
            else:
                reasons[claim.graph] = (
                    f"granted {grant} of the {want} GPUs it wants (budget {budget}, priority {priority}): "
                    "higher or equal priority graphs took the rest"
                )
    return BudgetSplit(grants, reasons)


# -- the ledger ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a graph may use this interval (its `gpu_budget`) and why."""

    gpus: int
    reason: str


@dataclasses.dataclass(frozen=True)
class BudgetView:
    """What a graph naming a shared budget reads of it before it plans: the budget, every graph's latest
    claim on it, and the GPUs the other graphs run now (their DynamoGraphComponents' replicas)."""

    name: str
    gpus: int
    claims: tuple[BudgetClaim, ...] = ()
    others_in_use: int = 0


def _with_own(view: BudgetView, *, graph: str, priority: int, min_gpus: int) -> list[BudgetClaim]:
    """The view's claims, with `graph`'s own: its latest, or, new to the budget, its minimum (until it has
    planned once and claims what it wants)."""
    claims = list(view.claims)
    if not any(claim.graph == graph for claim in claims):
        claims.append(BudgetClaim(graph=graph, priority=priority, min_gpus=min_gpus, wanted_gpus=min_gpus))
    return claims


def grant(view: BudgetView, *, graph: str, priority: int, min_gpus: int, own_cap: int | None = None) -> Grant:
    """`graph`'s GPUs of the budget for this interval, from every graph's latest claim (pure). `own_cap`
    is the graph's own gpuBudget: the grant never exceeds it."""
    split = split_budget(_with_own(view, graph=graph, priority=priority, min_gpus=min_gpus), view.gpus)
    share = split.gpus[graph]
    if own_cap is not None and own_cap < share:
        return Grant(own_cap, f"gpuBudget {own_cap} (below its {share}-GPU share of the shared budget)")
    return Grant(share, split.reasons[graph])


def minimums(view: BudgetView, *, graph: str, min_gpus: int) -> int:
    """The GPUs the minimums of every graph naming the budget need together, `graph` included: above the
    budget, it is overrun by the difference."""
    return sum(claim.min_gpus for claim in _with_own(view, graph=graph, priority=0, min_gpus=min_gpus))


class BudgetLedger:
    """The GPU budgets graphs share, and each graph's latest claim on the one it names: the store a
    planner keeps between intervals (the decisions are `grant`'s, on the `view` it gives).

    A graph claims one budget at a time: a claim on another budget moves it there, and `release`
    removes it, so that its share goes back to the others. Nothing else is remembered between
    intervals; a ledger rebuilt from the graphs' next claims grants the same.
    """

    def __init__(self, budgets: Mapping[str, int]) -> None:
        for name, gpus in budgets.items():
            if gpus < 0:
                raise ValueError(f"budget {name!r} must be ≥ 0 GPUs, got {gpus}")
        self.budgets: dict[str, int] = dict(budgets)
        self._claims: dict[str, tuple[str, BudgetClaim]] = {}  # graph → (budget, its latest claim)

    def __contains__(self, budget: object) -> bool:
        return budget in self.budgets

    def claims(self, budget: str) -> list[BudgetClaim]:
        """The latest claim of every graph on `budget`, by graph name."""
        claims = [claim for name, claim in self._claims.values() if name == budget]
        return sorted(claims, key=lambda claim: claim.graph)

    def view(self, budget: str, *, others_in_use: int = 0) -> BudgetView:
        """`budget` as a graph reads it before planning."""
        return BudgetView(budget, self.budgets[budget], tuple(self.claims(budget)), others_in_use)

    def claim(self, budget: str, claim: BudgetClaim) -> None:
        """Record what `claim.graph` wants of `budget` (its decision's GPUs without the budget)."""
        if budget not in self.budgets:
            known = ", ".join(sorted(self.budgets)) or "none"
            raise KeyError(f"no budget {budget!r}; the budgets are {known}")
        self._claims[claim.graph] = (budget, claim)

    def release(self, graph: str) -> None:
        """`graph` left (deleted, planner off, no budget named): its share goes back to the others."""
        self._claims.pop(graph, None)
