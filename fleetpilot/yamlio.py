"""YAML rendering shared by the CRD generator, the CLI and the tests."""

from __future__ import annotations

from typing import Any

import yaml


class _PlainDumper(yaml.SafeDumper):
    """Never writes anchors/aliases: generated manifests must read well and diff cleanly."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_PlainDumper, sort_keys=False, width=100, allow_unicode=True)


def dump_all(documents: list[Any]) -> str:
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False, width=100, allow_unicode=True)
