"""The local control plane's own safety: it refuses to start over another cluster's ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleetpilot.devcluster import cluster as devcluster

pytestmark = pytest.mark.integration


def test_up_refuses_ports_held_by_someone_else(tmp_path: Path) -> None:
    config = devcluster.ClusterConfig(name="clash", port_base=29400, state_root=tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", config.apiserver_port))
        holder.listen()
        with pytest.raises(devcluster.ClusterError, match=r"127\.0\.0\.1:29443 \(kube-apiserver\) is in use"):
            devcluster.Cluster(config).up(reuse=False)
    assert not devcluster.Cluster(config).running()
