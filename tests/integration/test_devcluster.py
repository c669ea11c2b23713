"""The local control plane's own safety: it refuses to start over another cluster's ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleetpilot.devcluster import cluster as devcluster

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
            devcluster.Cluster(config).up(reuse=False)
    assert not devcluster.Cluster(config).running()
