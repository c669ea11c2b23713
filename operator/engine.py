"""What render.py asks of an inference engine: the `Engine` base class and the helpers engines share.

Where it sits: below render.py, which builds every Kubernetes object the same way for any engine
and asks the graph's engine (engines.py looks it up by `spec.engine.framework`) only for what
differs between engines:

- `command`: the container's command line: the engine's CLI with the model, the port, the
  parallelism, its disaggregation flags for a prefill or decode role, and its multinode flags for
  a pod of a group. render.py appends the user's engine-wide and component arguments after it, so
  a user's flag always comes last and wins where the engine's parser keeps the last one;
- `probes`: how the kubelet tells whether a pod has loaded its weights and serves, or None for a
  pod that answers no HTTP (then render.py drops the container's HTTP port as well);
- `drain_hook`: the preStop hook that holds SIGTERM back until the engine has no request left,
  or None for an engine that drains on SIGTERM by itself (or whose gauges are not known);
- `env` and `ports`: side channels the engine opens besides its API (a KV-transfer channel, a
  bootstrap server), added after the user's environment and before the group's rendezvous port;
- `config`: files the engine reads at start, which render.py ships as a ConfigMap per component
  and mounts read-only;
- `peer_ports`: the ports other workers of the graph reach a worker on, for its NetworkPolicy (every
  port unless the engine knows them all);
- `shared_memory`: whether the pod gets a memory-backed /dev/shm (NCCL needs more than the
  container runtime's 64 MiB).

Engines decide flags and files only: every name, label, port number and environment variable the
pod is wired with comes in through `Worker` (render.py owns them), so an engine module imports
nothing of the operator's but this module. Pure, like render.py: values in, manifests out.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from fleetpilot.api import v1alpha1 as api

Manifest = dict[str, Any]
#: What a worker pod does in a graph: one half of a disaggregated pair, or both (aggregated). The
#: worker component's own name.
Role = api.WorkerName


@dataclass(frozen=True)
class Group:
    """How one pod of a multinode replica finds the others: the group's size, this pod's rank and
    the leader's address (rank and address as `$(VAR)` references the kubelet expands from the pod's
    environment, or literal values), and the port the ranks meet the leader on."""

    nodes: int
    rank: str
    leader_address: str
    port: int


@dataclass(frozen=True)
class Worker:
    """One worker pod as its engine needs to see it.

    `leader` is true for the pod that serves the API: a single-node replica's only pod, or rank 0
    of a group; false for a group's other ranks. `group` is None for a single-node replica."""

    model: str
    served_name: str
    role: Role
    tensor: int
    pipeline: int
    port: int
    drain_seconds: int
    leader: bool = True
    group: Group | None = None

    @property
    def disaggregated(self) -> bool:
        """Whether the pod is one half of a prefill/decode pair (and so moves KV caches)."""
        return self.role != "aggregated"


@dataclass(frozen=True)
class ConfigFiles:
    """Files an engine reads at start: shipped as the ConfigMap `<component>-<name>`, mounted
    read-only at `mount_path` through the volume `<name>-config`."""

    name: str
    mount_path: str
    files: dict[str, str]


class Engine(abc.ABC):
    """An inference engine as render.py drives it. One module per engine subclasses it
    (engine_vllm.py, engine_sglang.py, engine_trtllm.py, engine_simulator.py) and overrides what
    differs from these defaults; engines.py registers each under its `name`, the value of the
    graph's `spec.engine.framework`."""

    #: The API's name for the engine; also the pods' framework label.
    name: str
    #: Whether worker pods mount a memory-backed emptyDir at /dev/shm.
    shared_memory: bool = False

    @abc.abstractmethod
    def command(self, worker: Worker) -> tuple[list[str], list[str]]:
        """(command, args) that start the engine for `worker`, user arguments not included."""

    def probes(self, worker: Worker) -> Manifest | None:
        """The container's probes (startupProbe, readinessProbe, livenessProbe keys), or None when
        the pod answers no HTTP at all. Default: /health on the pod that serves the API (a group's
        leader); a group's other ranks answer nothing."""
        return health_probes() if worker.leader else None

    def drain_hook(self, worker: Worker) -> Manifest | None:
        """The container's preStop handler, or None when SIGTERM alone drains the engine (default)."""
        return None

    def env(self, worker: Worker) -> list[Manifest]:
        """Environment variables the engine needs beyond the pod's and the user's (default: none)."""
        return []

    def ports(self, worker: Worker) -> list[Manifest]:
        """Container ports the engine opens besides its HTTP API (default: none)."""
        return []

    def config(self, role: Role) -> ConfigFiles | None:
        """Files the engine reads at start for a component of this role, or None (default)."""
        return None

    def peer_ports(self, worker: Worker) -> list[int] | None:
        """The TCP ports `worker` is reached on by other worker pods of its graph (a disaggregated pair's KV
        transfers, a multinode group's ranks): what its NetworkPolicy admits from them (render.py
        `network_policy`). None, the default, is every port: NCCL's bootstrap and socket transport and NIXL's
        UCX transport listen on ephemeral ports no flag pins, beside the rendezvous and side-channel ports
        (`--master-port`, NIXL's side channel, SGLang's bootstrap server); a list of them would cut the
        collectives. Asked only for a pod whose graph is disaggregated or whose replica is a group."""
        return None


# -- helpers engines share ---------------------------------------------------------------------------

def http_probe(path: str, *, period: int, failures: int) -> Manifest:
    """An HTTP GET probe against the container's port named `http`."""
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 3}


def health_probes() -> Manifest:
    """Probes for an engine whose /health answers once the weights are loaded. Loading takes
    minutes, so the startup probe (an hour's worth of failures) holds liveness off until then;
    afterwards /health decides readiness and, more patiently, liveness."""
    return {"startupProbe": http_probe("/health", period=5, failures=720),
            "readinessProbe": http_probe("/health", period=5, failures=3),
            "livenessProbe": http_probe("/health", period=10, failures=6)}


# Polls the engine's /metrics until the named gauges sum to 0 (or the drain time passes), then waits a
# little longer for KV transfers to decode workers, which those gauges do not count. Python is in every
# engine image, curl is not.
_WAIT_IDLE = """\
import sys, time, urllib.request
port, limit, names = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), sys.argv[3:]
while time.monotonic() < limit:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        break
    busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.split("{")[0].split(" ")[0] in names)
    if busy == 0:
        time.sleep(max(0.0, min(5.0, limit - time.monotonic())))
        break
    time.sleep(1)
"""


def wait_until_idle(worker: Worker, busy_gauges: tuple[str, ...]) -> Manifest | None:
    """A preStop hook for engines that stop at once on SIGTERM: it polls the engine's own /metrics
    until `busy_gauges` (the Prometheus gauges of requests it still runs or queues) sum to 0, or
    the worker's drain time is up, so the kubelet sends SIGTERM to an idle engine. The frontend
    has stopped sending the pod requests the moment it began terminating. None when the worker
    has no drain time."""
    if worker.drain_seconds == 0:
        return None
    return {"exec": {"command": ["python3", "-c", _WAIT_IDLE, str(worker.port), str(worker.drain_seconds),
                                 *busy_gauges]}}
