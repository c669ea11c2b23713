"""The engines render.py can run, by the name a graph gives in `spec.engine.framework`.

Adding an engine: a module beside the others subclassing `engine.Engine` (its flags, probes,
drain hook, side channels and files), a line below, its name in the API's `Framework`, and golden
tests of what it renders. The API refuses any other name at admission (the CRD's enum, pydantic's
Literal), so `lookup` failing means the API and this registry disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetpilot.operator import engine_sglang, engine_simulator, engine_trtllm, engine_vllm
from fleetpilot.operator.engine import Engine

#: Every engine by name, in the API's order.
ENGINES: Mapping[str, Engine] = {
    e.name: e
    for e in (engine_vllm.ENGINE, engine_sglang.ENGINE, engine_trtllm.ENGINE, engine_simulator.ENGINE)
}


class UnknownEngine(LookupError):
    """A `spec.engine.framework` no engine module is registered for."""


def lookup(name: str) -> Engine:
    """The engine a graph's `spec.engine.framework` names; UnknownEngine, naming the field and the
    values it may take, for any other name."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngine(f"spec.engine.framework: no engine is registered as {name!r}; "
                            f"allowed values: {', '.join(ENGINES)}") from None
