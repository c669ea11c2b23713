"""Plots are optional: matplotlib comes with the `plots` extra, `pip install 'fleetpilot[plots]'`.

Where it sits: beneath every function that draws a PNG (the backtest's timeline and cost curves, the
e2e timelines). Each asks `pyplot()` for matplotlib when it runs — never at import, so that nothing
else needs it — and draws nothing when it is missing; its caller then says so once, with
`skipped_note`, and writes its tables and JSON all the same.
"""

from __future__ import annotations

from types import ModuleType

EXTRA = "plots"
INSTALL = f"pip install 'fleetpilot[{EXTRA}]'"


def pyplot() -> ModuleType | None:
    """`matplotlib.pyplot` on the file-only Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # before pyplot: no display, only files
    import matplotlib.pyplot as plt

    return plt


def skipped_note(what: str) -> str:
    """The one line a caller prints when it could not draw `what`."""
    return f"plots skipped ({what}): matplotlib is not installed; {INSTALL} to get them"
