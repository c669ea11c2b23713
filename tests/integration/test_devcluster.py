"""The local control plane: it refuses to start over another cluster's ports, and `up` keeps its data."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from fleetpilot.devcluster import cluster as devcluster

from .conftest import Kubectl, wait_for

pytestmark = pytest.mark.integration


def _unused_config(tmp_path: Path) -> devcluster.ClusterConfig:
    """A cluster whose every port is free now: another checkout's cluster (an e2e run beside this one)
    may hold the default bases, and then the test would clash with it, not with its own holder."""
    for base in range(29400, 40000, 100):
        config = devcluster.ClusterConfig(name="clash", port_base=base, state_root=tmp_path)
        if not devcluster.Cluster(config).held_ports():
            return config
    raise AssertionError("no free port base between 29400 and 40000")


def test_up_refuses_ports_held_by_someone_else(tmp_path: Path) -> None:
    config = _unused_config(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", config.apiserver_port))
        holder.listen()
        held = rf"127\.0\.0\.1:{config.apiserver_port} \(kube-apiserver\) is in use"
        with pytest.raises(devcluster.ClusterError, match=held):
            devcluster.Cluster(config).up(fresh=True)
    assert not devcluster.Cluster(config).running()


def test_up_starts_a_dead_process_again_and_keeps_the_data(control_plane: devcluster.Cluster, kubectl: Kubectl,
                                                           namespace: str) -> None:
    kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept"}, "data": {"k": "v"}},
                  namespace=namespace)
    before = control_plane.status()["processes"]
    os.kill(before["kwok"], signal.SIGKILL)
    wait_for(lambda: control_plane.status()["processes"]["kwok"] is None, timeout=10, what="kwok to be gone")

    said: list[str] = []
    control_plane.up(log=said.append)

    after = control_plane.status()
    assert after["healthy"], after
    assert after["processes"]["kwok"] not in (None, before["kwok"]), after
    # Only the dead process was started again: the others kept running, and so did etcd's data.
    assert {n: p for n, p in after["processes"].items() if n != "kwok"} == {
        n: p for n, p in before.items() if n != "kwok"}, (before, after)
    assert kubectl.json("get", "configmap", "kept", "-n", namespace)["data"] == {"k": "v"}
    assert said and "restarted kwok" in said[0] and "data kept" in said[0], said
