"""Load one module of a folder that is no package (benchmarks/, e2e/) from its file, for unit tests.

Only that module is imported: its folder is not put on everyone's `sys.path`, where the e2e harness's other
modules would shadow names of the tests'."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(name: str, path: Path) -> ModuleType:
    """The module in `path` (relative to the repository root), registered in `sys.modules` as `name`."""
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module
