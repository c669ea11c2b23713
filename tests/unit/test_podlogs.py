"""The pod runner's kubelet log endpoint (e2e/podlogs.py): what `kubectl logs` shows, and who may ask."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import httpx
import pytest
import source_files

from fleetpilot.devcluster import pki as pki_mod

podlogs = source_files.load("podlogs", Path("e2e/podlogs.py"))

TWO_RUNS = (podlogs.run_header("2026-12-07T10:00:00Z", ["fleetpilot", "sim", "serve"]) + b"one\ntwo\ncrash\n"
            + podlogs.run_header("2026-12-07T10:00:05Z", ["fleetpilot", "sim", "serve"]) + b"a\nb\nc\n")


def test_the_current_run_is_shown_without_the_runners_headers() -> None:
    assert podlogs.select(TWO_RUNS) == b"a\nb\nc\n"
    assert podlogs.select(TWO_RUNS, previous=True) == b"one\ntwo\ncrash\n"
    assert podlogs.select(TWO_RUNS, tail_lines=2) == b"b\nc\n"
    assert podlogs.select(TWO_RUNS, tail_lines=0) == b""
    assert podlogs.select(TWO_RUNS, limit_bytes=3) == b"a\nb"
    assert podlogs.select(b"") == b""


def test_previous_of_a_container_that_never_restarted_is_an_error() -> None:
    assert podlogs.select(TWO_RUNS[: TWO_RUNS.index(b"a\nb")]) == b""  # restarted, printed nothing yet
    first_only = podlogs.run_header("2026-12-07T10:00:00Z", ["x"]) + b"only\n"
    assert podlogs.select(first_only, previous=True) is None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_the_endpoint_answers_the_apiservers_certificate_and_refuses_others(tmp_path: Path) -> None:
    pki = pki_mod.ensure(tmp_path / "pki", service_ip="10.0.0.1")
    log = tmp_path / "ns_web-0.log"
    log.write_bytes(TWO_RUNS)
    source = podlogs.LogSource(container="engine", path=log, alive=lambda: False)
    port = free_port()

    async def scenario() -> tuple[list[tuple[int, str]], str]:
        server = await podlogs.serve(lambda ns, pod: source if (ns, pod) == ("ns", "web-0") else None,
                                     port=port, pki_folder=pki.folder)
        apiserver = ssl.create_default_context(cafile=str(pki.ca))
        apiserver.load_cert_chain(str(pki.crt(pki_mod.KUBELET_CLIENT)), str(pki.key(pki_mod.KUBELET_CLIENT)))
        answers = []
        try:
            async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=apiserver) as client:
                for path in ["/containerLogs/ns/web-0/engine?tailLines=1", "/containerLogs/ns/web-0/engine?previous=true",
                             "/containerLogs/ns/web-0/engine?follow=true", "/containerLogs/ns/web-0/sidecar",
                             "/containerLogs/ns/other/engine", "/containerLogs/ns/web-0/engine?tailLines=x"]:
                    response = await client.get(path)
                    answers.append((response.status_code, response.text))
            anonymous = ssl.create_default_context(cafile=str(pki.ca))  # trusts the server, presents nothing
            async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=anonymous) as client:
                try:
                    await client.get("/containerLogs/ns/web-0/engine")
                    refused = "served"
                except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError) as error:
                    refused = type(error).__name__
        finally:
            await server.cleanup()
        return answers, refused

    answers, refused = asyncio.run(scenario())
    assert answers[0] == (200, "c\n")
    assert answers[1] == (200, "one\ntwo\ncrash\n")
    assert answers[2] == (200, "a\nb\nc\n")  # follow ends with the pod (not alive here)
    assert answers[3][0] == 400 and "container sidecar is not valid for pod web-0" in answers[3][1]
    assert answers[4][0] == 404
    assert answers[5][0] == 400 and "tailLines" in answers[5][1]
    assert refused != "served"


@pytest.mark.parametrize("restart", [True, False])
def test_follow_streams_what_the_run_appends_and_stops_when_it_ends(tmp_path: Path, restart: bool) -> None:
    log = tmp_path / "ns_web-0.log"
    log.write_bytes(podlogs.run_header("2026-12-07T10:00:00Z", ["x"]) + b"first\n")
    alive = [True]
    source = podlogs.LogSource(container="engine", path=log, alive=lambda: alive[0])

    async def scenario() -> str:
        from aiohttp.test_utils import TestClient, TestServer

        async with TestClient(TestServer(podlogs.app(lambda ns, pod: source))) as client:
            response = await client.get("/containerLogs/ns/web-0/engine?follow=true")
            assert (await response.content.readline()) == b"first\n"
            with log.open("ab") as out:
                out.write(b"second\n")
                if restart:
                    out.write(podlogs.run_header("2026-12-07T10:00:09Z", ["x"]) + b"next run\n")
            if not restart:
                await asyncio.sleep(3 * podlogs.FOLLOW_POLL_S)
                alive[0] = False
            return (await asyncio.wait_for(response.content.read(), 10)).decode()

    assert asyncio.run(scenario()) == "second\n"
