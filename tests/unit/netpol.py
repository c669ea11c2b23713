"""NetworkPolicies judged by a real NetworkPolicy engine: cyclonus' matcher, through tests/netpol/netpolcheck.

The tests describe traffic (a source pod's namespace and labels, a destination pod's, a port) and this
module hands it, with the policies and the namespaces' labels, to the Go program, which evaluates it with
cyclonus' code (github.com/mattfenwick/cyclonus/pkg/matcher). Nothing here decides whether a policy admits
anything: a verdict is the engine's. Used by tests/unit/test_netpol.py (rendered policies, made-up pods) and
tests/integration/test_netpol.py (the operator's policies, pods and namespaces read from the apiserver).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Pod:
    """Where traffic comes from or goes to: a pod's namespace and labels."""

    namespace: str
    labels: dict[str, str]

    def as_peer(self) -> Manifest:
        return {"namespace": self.namespace, "podLabels": dict(self.labels)}


@dataclass(frozen=True)
class Verdict:
    """The engine's answer for one connection: allowed overall, and on ingress (all the policies here govern)."""

    allowed: bool
    ingress: bool
    egress: bool
    allowed_by: list[str]
    denied_by: list[str]


def namespace(name: str, labels: dict[str, str] | None = None) -> Manifest:
    """A namespace as the apiserver labels it: always with kubernetes.io/metadata.name, its own name."""
    return {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}}


def evaluate(checker: Path, policies: list[Manifest], namespaces: list[Manifest],
             connections: list[tuple[Pod, Pod, int]]) -> list[Verdict]:
    """The engine's verdict on each (source, destination, TCP port) under `policies`, in order."""
    queries = [{"source": source.as_peer(), "destination": destination.as_peer(), "port": port,
                "portName": "", "protocol": "TCP"} for source, destination, port in connections]
    stdin = json.dumps({"policies": policies, "namespaces": namespaces, "queries": queries})
    result = subprocess.run([str(checker)], input=stdin, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"netpolcheck failed:\n{result.stderr}"
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == len(queries), result.stdout
    return [Verdict(allowed=line["allowed"], ingress=line["ingress"], egress=line["egress"],
                    allowed_by=line["ingressAllowedBy"], denied_by=line["ingressDeniedBy"]) for line in lines]


def allowed(checker: Path, policies: list[Manifest], namespaces: list[Manifest],
            connections: dict[str, tuple[Pod, Pod, int]]) -> dict[str, bool]:
    """{name: allowed} for named connections: what a test compares with what it expects, all at once."""
    verdicts = evaluate(checker, policies, namespaces, list(connections.values()))
    return {name: verdict.allowed for name, verdict in zip(connections, verdicts, strict=True)}
