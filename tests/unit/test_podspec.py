"""The e2e pod runner's pure half (e2e/podspec.py): what a pod spec asks to exec, without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import source_files

podspec = source_files.load("podspec", Path("e2e/podspec.py"))


def make_pod(*, env: list[dict[str, Any]] | None = None, command: list[str] | None = None,
             args: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "fleetpilot/fleetpilot:0.1.0",
                                 "ports": [{"name": "http", "containerPort": 8000}]}
    if env is not None:
        container["env"] = env
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    return {
        "metadata": {"name": "g-decode-abc", "namespace": "team", "uid": "u-1",
                     "labels": {"fleetpilot.dev/framework": "simulator", "fleetpilot.dev/component": "decode"},
                     "annotations": {"note": "hello"}},
        "spec": {"nodeName": "gpu-0", "serviceAccountName": "worker", "containers": [container], **spec},
    }


IPS = {"pod_ip": "127.2.0.7", "host_ip": "127.0.0.2"}


def test_env_values_expand_references_to_earlier_names_only() -> None:
    pod = make_pod(env=[
        {"name": "A", "value": "a"},
        {"name": "B", "value": "$(A)-$(C)-$$(A)"},  # C comes later: it stays as written; $$ is a literal $
        {"name": "C", "value": "c"},
        {"name": "EMPTY"},
    ])
    env = podspec.container_env(pod, pod["spec"]["containers"][0], **IPS)
    assert env == {"A": "a", "B": "a-$(C)-$(A)", "C": "c", "EMPTY": ""}
    assert list(env) == ["A", "B", "C", "EMPTY"]


@pytest.mark.parametrize(("path", "expected"), [
    ("metadata.name", "g-decode-abc"),
    ("metadata.namespace", "team"),
    ("metadata.uid", "u-1"),
    ("spec.nodeName", "gpu-0"),
    ("spec.serviceAccountName", "worker"),
    ("status.podIP", "127.2.0.7"),
    ("status.podIPs", "127.2.0.7"),
    ("status.hostIP", "127.0.0.2"),
    ("metadata.labels['fleetpilot.dev/component']", "decode"),
    ("metadata.annotations['note']", "hello"),
    ("metadata.labels['absent']", ""),
])
def test_env_from_the_downward_api(path: str, expected: str) -> None:
    pod = make_pod(env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": path}}}])
    assert podspec.container_env(pod, pod["spec"]["containers"][0], **IPS) == {"X": expected}


def test_a_downward_api_value_can_be_referenced_by_a_later_env() -> None:
    pod = make_pod(env=[{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "URL", "value": "http://$(IP):8000"}])
    assert podspec.container_env(pod, pod["spec"]["containers"][0], **IPS)["URL"] == "http://127.2.0.7:8000"


def test_an_unknown_field_path_is_an_error_that_names_it() -> None:
    pod = make_pod(env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.hostname"}}}])
    with pytest.raises(ValueError, match=r"fieldRef 'spec.hostname' is not supported"):
        podspec.container_env(pod, pod["spec"]["containers"][0], **IPS)


def test_env_from_config_maps_is_refused() -> None:
    pod = make_pod(env=[{"name": "KEY", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}])
    with pytest.raises(ValueError, match="env KEY: only value, fieldRef and secretKeyRef"):
        podspec.container_env(pod, pod["spec"]["containers"][0], **IPS)


def secret_env(name: str, key: str, **optional: bool) -> dict[str, Any]:
    return {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": key, **optional}}}


def test_env_from_a_secret_key_is_its_value_and_names_the_secrets_to_read() -> None:
    pod = make_pod(env=[{"name": "A", "value": "a"}, secret_env("hub", "token"), {"name": "B", "value": "$(HF_TOKEN)"}])
    assert podspec.secret_names(pod) == {"hub"}
    env = podspec.container_env(pod, pod["spec"]["containers"][0], secrets={"hub": {"token": "hf_x"}}, **IPS)
    assert env == {"A": "a", "HF_TOKEN": "hf_x", "B": "hf_x"}


def test_a_missing_secret_or_key_stops_the_container_as_the_kubelet_does_unless_optional() -> None:
    container = make_pod(env=[secret_env("hub", "token")])
    with pytest.raises(ValueError, match='secret "hub" not found'):
        podspec.container_env(container, container["spec"]["containers"][0], secrets={}, **IPS)
    with pytest.raises(ValueError, match="couldn't find key token in Secret team/hub"):
        podspec.container_env(container, container["spec"]["containers"][0], secrets={"hub": {"other": "x"}}, **IPS)
    optional = make_pod(env=[secret_env("hub", "token", optional=True)])
    for secrets in ({}, {"hub": {"other": "x"}}):
        assert podspec.container_env(optional, optional["spec"]["containers"][0], secrets=secrets, **IPS) == {}


def test_command_and_args_are_expanded_and_a_wildcard_host_becomes_the_pod_ip() -> None:
    pod = make_pod(
        env=[{"name": "ROLE", "value": "decode"}, {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath":
                                                                                             "metadata.name"}}}],
        command=["fleetpilot", "sim", "worker"],
        args=["--role", "$(ROLE)", "--host", "0.0.0.0", "--name=$(POD)", "--other", "$(UNKNOWN)"],
    )
    spec = podspec.process_spec(pod, **IPS)
    assert spec.program == "fleetpilot"
    assert spec.args == ("sim", "worker", "--role", "decode", "--host", "127.2.0.7", "--name=g-decode-abc",
                         "--other", "$(UNKNOWN)")
    assert spec.env == {"ROLE": "decode", "POD": "g-decode-abc"}


@pytest.mark.parametrize(("args", "expected"), [
    (["--host", "0.0.0.0"], ["--host", "127.2.0.7"]),
    (["--host", "::"], ["--host", "127.2.0.7"]),
    (["--host="], ["--host=127.2.0.7"]),
    (["--host=0.0.0.0", "--port", "8000"], ["--host=127.2.0.7", "--port", "8000"]),
    (["--host", "10.0.0.1"], ["--host", "10.0.0.1"]),  # a specific address is left alone
    (["--host"], ["--host"]),
    (["--hostname", "0.0.0.0"], ["--hostname", "0.0.0.0"]),
])
def test_only_a_wildcard_host_is_bound(args: list[str], expected: list[str]) -> None:
    assert podspec.bind_to_pod_ip(args, "127.2.0.7") == expected


def test_a_container_without_a_command_cannot_run() -> None:
    with pytest.raises(ValueError, match="no command"):
        podspec.process_spec(make_pod(args=["--port", "8000"]), **IPS)


def test_process_env_layers_base_hostname_extra_declared_then_kubeconfig() -> None:
    spec = podspec.ProcessSpec(program="x", args=(), env={"PATH": "/declared", "MINE": "1", "KUBECONFIG": "no"})
    env = podspec.process_env(spec, hostname="pod-a", base={"PATH": "/bin", "HOME": "/root", "HOSTNAME": "base"},
                              extra={"OPENBLAS_NUM_THREADS": "1", "MINE": "extra"}, kubeconfig="/s/kubeconfig")
    assert env == {"PATH": "/declared", "HOME": "/root", "HOSTNAME": "pod-a", "OPENBLAS_NUM_THREADS": "1",
                   "MINE": "1", "KUBECONFIG": "/s/kubeconfig"}
    assert "KUBECONFIG" not in podspec.process_env(podspec.ProcessSpec("x", (), {}), hostname="p", base={},
                                                   extra={}, kubeconfig=None)


def test_service_account_defaults_and_opting_out_of_the_token() -> None:
    assert podspec.service_account(make_pod()) == "worker"
    assert podspec.service_account(make_pod(serviceAccountName="")) == "default"
    assert podspec.service_account(make_pod(automountServiceAccountToken=False)) is None
    pod = make_pod()
    del pod["spec"]["serviceAccountName"]
    assert podspec.service_account(pod) == "default"


def test_the_pod_kubeconfig_holds_the_token_and_defaults_to_the_pods_namespace() -> None:
    config = podspec.kubeconfig(server="https://127.0.0.1:6443", ca="/pki/ca.crt", account="worker",
                                namespace="team", token="t0k")
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    assert context == {"cluster": "e2e", "user": "worker", "namespace": "team"}
    assert config["users"] == [{"name": "worker", "user": {"token": "t0k"}}]
    assert config["clusters"][0]["cluster"] == {"server": "https://127.0.0.1:6443", "certificate-authority": "/pki/ca.crt"}


@pytest.mark.parametrize(("port", "expected"), [(8000, 8000), ("9000", 9000), ("http", 8000)])
def test_probe_port_by_number_or_by_the_container_ports_name(port: int | str, expected: int) -> None:
    container = make_pod()["spec"]["containers"][0]
    assert podspec.probe_port({"httpGet": {"port": port, "path": "/health"}}, container) == expected


def test_probe_port_names_must_be_declared() -> None:
    container = make_pod()["spec"]["containers"][0]
    with pytest.raises(ValueError, match="'metrics' is not a declared container port"):
        podspec.probe_port({"httpGet": {"port": "metrics"}}, container)


def test_the_runner_owns_simulator_pods_on_simulated_nodes_only() -> None:
    assert podspec.is_owned(make_pod(), {"gpu-0", "gpu-1"})
    assert not podspec.is_owned(make_pod(), {"gpu-1"})  # bound elsewhere (or not yet bound)
    other = make_pod()
    other["metadata"]["labels"]["fleetpilot.dev/framework"] = "vllm"
    assert not podspec.is_owned(other, {"gpu-0"})


def test_a_pods_dns_name_becomes_its_ip_as_cluster_dns_would_answer() -> None:
    """A group's rank names its leader `<leader>.<service>.<namespace>.svc`; the runner has no DNS."""
    spec = podspec.ProcessSpec(
        program="fleetpilot",
        args=("sim", "worker", "--master-addr", "g-decode-ab-0.g-decode.ns.svc", "--port", "8000"),
        env={"LEADER": "g-decode-ab-0.g-decode.ns.svc.cluster.local", "FRONTEND": "g-frontend.ns.svc"})
    assert podspec.pod_dns_names(spec) == {("g-decode-ab-0", "g-decode", "ns")}  # a Service's name is no pod's
    resolved = podspec.resolve_pod_names(spec, {("g-decode-ab-0", "g-decode", "ns"): "127.2.0.7"})
    assert resolved.args[3] == "127.2.0.7"
    assert resolved.env == {"LEADER": "127.2.0.7", "FRONTEND": "g-frontend.ns.svc"}
    assert podspec.resolve_pod_names(spec, {}) == spec
    pod = make_pod()
    pod["spec"].update(hostname="g-decode-ab-0", subdomain="g-decode")
    assert podspec.pod_dns_key(pod) == ("g-decode-ab-0", "g-decode", pod["metadata"]["namespace"])
    assert podspec.pod_dns_key(make_pod()) is None
