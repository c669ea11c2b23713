"""API keys at the frontend against the real apiserver, with the `openai` SDK as the client.

The operator (running with the chart's RBAC) renders a graph with `frontend.auth`: its frontend Role may
list and watch that one Secret, which the operator could only grant because the chart lets it hold those
verbs (RBAC's escalation check). A `fleetpilot frontend` process then runs with a token of that frontend
ServiceAccount and the API-key flags the operator rendered, in front of a simulator worker: it refuses
everything until the Secret exists, serves the right key, refuses a wrong or missing one with OpenAI's 401,
follows a rotation of the Secret within 10 s without a restart, and no key appears in its log, its
metrics, the namespace's Events or the graph's status.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .conftest import Kubectl, OperatorProcess, token_kubeconfig, wait_for
from .test_dataplane import MODEL, Process

pytestmark = pytest.mark.integration

GRAPH = "keyed"
SECRET = "keyed-api-keys"
FIRST = "sk-fleet-first-3c8e21f0a9b4"
SECOND = "sk-fleet-second-7d04b6e15c2a"
ROTATION_DEADLINE_S = 10.0


def keyed_graph() -> dict[str, Any]:
    return {
        "apiVersion": "fleetpilot.dev/v1alpha1",
        "kind": "DynamoGraph",
        "metadata": {"name": GRAPH},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": MODEL},
            "engine": {"framework": "simulator"},
            "components": {
                "frontend": {"auth": {"apiKeySecretRef": {"name": SECRET}, "maxInFlightPerKey": 8}},
                "aggregated": {"replicas": 1},
            },
        },
    }


def key_secret(**keys: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET}, "type": "Opaque",
            "data": {name: base64.b64encode(key.encode()).decode() for name, key in keys.items()}}


def rendered_auth_args(kubectl: Kubectl, namespace: str) -> list[str]:
    """The API-key flags of the frontend Deployment the operator rendered."""
    deployment = kubectl.json("get", "deployment", f"{GRAPH}-frontend", "-n", namespace)
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    start = args.index("--api-key-secret")
    return args[start:]


def client(frontend: Process, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.url + "/v1", api_key=key, max_retries=0, timeout=30)


def served(frontend: Process, key: str) -> bool:
    try:
        client(frontend, key).completions.create(model=MODEL, prompt="the fleet", max_tokens=2)
        return True
    except openai.AuthenticationError:
        return False


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Process]:
    process = Process("worker", ["sim", "worker", "--model", MODEL, "--role", "aggregated", "--speedup", "10"],
                      tmp_path)
    process.wait_healthy()
    yield process
    process.stop()


def test_api_keys_from_a_watched_secret_with_the_openai_sdk(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, worker: Process, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kubectl.apply(keyed_graph(), namespace)
    account = f"{GRAPH}-frontend"

    def role_rules() -> list[dict[str, Any]]:
        rules: list[dict[str, Any]] = kubectl.json("get", "role", account, "-n", namespace)["rules"]
        return rules

    wait_for(lambda: kubectl.run("get", "rolebinding", account, "-n", namespace, check=False).returncode == 0
             and kubectl.run("get", "deployment", account, "-n", namespace, check=False).returncode == 0,
             what="the frontend's RBAC and Deployment")
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET],
            "verbs": ["list", "watch"]} in role_rules()
    assert rendered_auth_args(kubectl, namespace) == ["--api-key-secret", SECRET, "--max-in-flight-per-key", "8"]
    user = f"system:serviceaccount:{namespace}:{account}"
    # Its key Secret by name, and no other Secret.
    assert kubectl.run("auth", "can-i", "watch", f"secrets/{SECRET}", "-n", namespace, "--as", user,
                       check=False).stdout.strip() == "yes"
    assert kubectl.run("auth", "can-i", "list", "secrets", "-n", namespace, "--as", user,
                       check=False).stdout.strip() == "no"
    assert kubectl.run("auth", "can-i", "get", f"secrets/{SECRET}", "-n", namespace, "--as", user,
                       check=False).stdout.strip() == "no"

    # The frontend as its pod would run it: its ServiceAccount's token, the flags the operator rendered.
    kubeconfig = token_kubeconfig(kubectl, namespace=namespace, service_account=account,
                                  path=tmp_path / "frontend.kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    frontend = Process("frontend", ["frontend", "--model", MODEL, "--mode", "aggregated", "--worker-url", worker.url,
                                    "--namespace", namespace, *rendered_auth_args(kubectl, namespace)], tmp_path)
    try:
        frontend.wait_healthy()  # probes need no key
        # Fail closed: no Secret yet, so no key is valid.
        wait_for(lambda: "is missing" in frontend.log_path.read_text(), timeout=30,
                 what=lambda: f"the missing Secret logged; the frontend's log:\n{frontend.log_path.read_text()[-3000:]}")
        with pytest.raises(openai.AuthenticationError) as before:
            client(frontend, FIRST).completions.create(model=MODEL, prompt="the fleet", max_tokens=2)
        assert before.value.status_code == 401 and before.value.code == "invalid_api_key"

        kubectl.apply(key_secret(**{"team-a": FIRST}), namespace)
        wait_for(lambda: served(frontend, FIRST), timeout=ROTATION_DEADLINE_S, what="the first key accepted")

        answer = client(frontend, FIRST).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
        assert answer.choices[0].message.content and answer.usage is not None
        # A wrong key, a key cut short, and no key at all (the SDK's Authorization header left out).
        for wrong, headers in ((SECOND, {}), (FIRST[:-1], {}), (FIRST, {"Authorization": openai.omit})):
            with pytest.raises(openai.AuthenticationError) as refused:
                client(frontend, wrong).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True,
                    extra_headers=headers)
            assert refused.value.status_code == 401
            body = refused.value.body
            assert isinstance(body, dict) and body["type"] == "invalid_request_error" and body["param"] is None
            assert body["code"] == "invalid_api_key" and FIRST not in refused.value.message
            assert ("no API key given" if headers else "not valid") in refused.value.message
        missing = httpx.post(frontend.url + "/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 1},
                             timeout=10)
        assert missing.status_code == 401 and "Authorization" in missing.json()["error"]["message"]

        # Rotate: the Secret now holds only the second key. No restart, within the deadline.
        pid = frontend.popen.pid
        rotated = time.monotonic()
        kubectl.apply(key_secret(**{"team-b": SECOND}), namespace)
        wait_for(lambda: served(frontend, SECOND) and not served(frontend, FIRST), timeout=ROTATION_DEADLINE_S,
                 interval=0.1, what="the rotation to take effect")
        took = time.monotonic() - rotated
        assert took < ROTATION_DEADLINE_S and frontend.popen.poll() is None and frontend.popen.pid == pid

        metrics = httpx.get(frontend.url + "/metrics", timeout=5).text
        assert 'fleetpilot_frontend_auth_refusals_total{model="llama-8b",reason="invalid_key"}' in metrics
        events = kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout
        status = kubectl.run("get", "dg", GRAPH, "-n", namespace, "-o", "json").stdout
        log = frontend.log_path.read_text()
        assert "API keys: 1 from Secret" in log
        for key in (FIRST, SECOND):
            encoded = base64.b64encode(key.encode()).decode()
            for where, text in (("log", log), ("metrics", metrics), ("events", events), ("graph", status),
                                ("operator log", operator.log())):
                assert key not in text and encoded not in text, f"a key is in the frontend's {where}"
    finally:
        frontend.stop()
