"""The planner backtest: how a scaling policy would have done on a trace, before it goes live.

Where it sits: the second driver of the planner core (the first is `planner.live`). A trace
(`fleetpilot.traces`) runs through a simulated fleet — `fleetsim` request by request, `fluid` as
aggregate traffic — with a scaling policy in the loop (`policies`, the real planning step `step.step`
among them); `driver` steps the fleet interval by interval and scores the run, and runs several
graphs under one shared GPU budget (`planner.budget`). These four are pure. `evaluate` is the adapter
to files (profiles, traces, Markdown, plots) and `cli` is `fleetpilot planner backtest`.

The live planner (`core`, `live`, `observe`, `main`) never imports this package: an import-linter
contract says so.
"""
