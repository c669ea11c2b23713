"""The replay client against a small OpenAI-compatible server, and the report (fleetpilot.replay.client, .report).

The server runs in-process (starlette + uvicorn in a thread) on 127.0.0.1 with an ephemeral port.
The model name picks its behaviour, `<mode>/<tag>`: ok (first token after 50 ms, then one every
10 ms), slow (first token after 1 s), hang (nothing for 30 s), fail (HTTP 500), drop (the connection
closes after 3 tokens), garbage (a non-JSON event), nodone (neither `[DONE]` nor a finish_reason),
finished (a finish_reason, then no `[DONE]`), strict (422 for vLLM's fields); `mix:<mode>` applies the
mode only to requests for 13 tokens and answers the others as ok. Timing bounds are wide
on purpose: a loaded 2-core machine must not fail them; the lower bounds carry the meaning.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from io import StringIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from rich.console import Console
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fleetpilot import traces
from fleetpilot.replay import cli, client, report

AZURE = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "traces"
    / "azure_llm_2023"
    / "AzureLLMInferenceTrace_code.csv"
)
FIRST_TOKEN_S = {"slow": 1.0, "hang": 30.0}
DEFAULT_FIRST_TOKEN_S = 0.05
TOKEN_GAP_S = 0.01
FAILING_TOKENS = 13  # in a `mix:` mode, the requests that misbehave


# -- the test server -------------------------------------------------------------------------------


@dataclass
class Received:
    at: float  # time.perf_counter() when the server read the request
    body: dict[str, Any]


@dataclass
class FakeFrontend:
    url: str
    received: list[Received] = field(default_factory=list)

    def bodies(self, model: str) -> list[Received]:
        return [r for r in self.received if r.body.get("model") == model]


def _event(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _app(received: list[Received]) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        received.append(Received(at=time.perf_counter(), body=body))
        mode = str(body["model"]).split("/")[0]
        tokens = int(body["max_tokens"])
        if mode.startswith("mix:"):
            mode = mode.removeprefix("mix:") if tokens == FAILING_TOKENS else "ok"
        first = FIRST_TOKEN_S.get(mode, DEFAULT_FIRST_TOKEN_S)
        if mode == "fail":
            return JSONResponse({"error": {"message": "engine fell over"}}, status_code=500)
        if mode == "strict" and {"ignore_eos", "min_tokens"} & set(body):
            return JSONResponse({"detail": "Unexpected fields in the request"}, status_code=422)
        if not body.get("stream"):
            await asyncio.sleep(first + TOKEN_GAP_S * (tokens - 1))
            usage = {"prompt_tokens": 1, "completion_tokens": tokens}
            return JSONResponse({"choices": [{"index": 0, "text": " tok" * tokens, "finish_reason": "length"}],
                                 "usage": usage})

        async def events() -> AsyncIterator[str]:
            yield _event({"choices": [{"index": 0, "text": ""}]})  # an empty opener is no token
            await asyncio.sleep(first)
            for index in range(tokens):
                if index:
                    await asyncio.sleep(TOKEN_GAP_S)
                if mode == "drop" and index == 3:
                    raise ConnectionAbortedError("the engine went away")  # uvicorn cuts the stream
                if mode == "garbage" and index == 2:
                    yield _event("{not json")
                if mode == "truncated" and index == 3:
                    break  # ends politely ([DONE] below), but short and without a finish_reason
                last = index == tokens - 1 and mode != "nodone"
                yield _event({"choices": [{"index": 0, "text": " tok", "finish_reason": "length" if last else None}]})
            if mode in ("nodone", "finished"):
                return  # "finished": said why it ended, then closed without [DONE] (Hugging Face's serve does)
            yield _event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": tokens}})
            yield _event("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "ok/served", "object": "model"}]})

    return Starlette(
        routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/v1/models", models)]
    )


@pytest.fixture(scope="module")
def frontend() -> Iterator[FakeFrontend]:
    received: list[Received] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app(received), log_level="critical", lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the test server did not start"
    yield FakeFrontend(url=f"http://127.0.0.1:{port}", received=received)
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def requests_at(*arrivals: float, output_tokens: int = 20, input_tokens: int = 50) -> list[traces.Request]:
    return [
        traces.Request(arrival_s=a, input_tokens=input_tokens, output_tokens=output_tokens) for a in arrivals
    ]


def run(requests: list[traces.Request], **kwargs: Any) -> list[client.Result]:
    kwargs.setdefault("timeout_s", 20.0)
    return asyncio.run(client.replay(requests, **kwargs))


# -- the client against the server -----------------------------------------------------------------


def test_ttft_and_itl_are_measured_from_the_stream(frontend: FakeFrontend) -> None:
    results = run(requests_at(0.0, 0.05, 0.1, 0.15), url=frontend.url + "/v1/", model="ok/timing")
    assert [r.status for r in results] == ["ok"] * 4
    for result in results:
        assert result.ttft_s is not None and result.itl_s is not None
        assert 0.045 <= result.ttft_s <= 0.5
        assert 0.008 <= result.itl_s <= 0.1
        assert result.output_tokens == 20  # from the usage block
        assert len(result.token_times_s) == 20  # the empty opening chunk is not a token
        assert result.latency_s >= result.ttft_s + 19 * 0.009
    summary = report.summarise(results, report.Sla(ttft_ms=None, itl_ms=None))
    assert summary.ttft_ms is not None and 45 <= summary.ttft_ms.p50 <= 500
    assert summary.good == 4 and summary.output_tokens == 80


def test_request_body_asks_for_the_trace_lengths(frontend: FakeFrontend) -> None:
    run(requests_at(0.0, output_tokens=7, input_tokens=900), url=frontend.url, model="ok/body")
    (received,) = frontend.bodies("ok/body")
    body = received.body
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (7, 7, True)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert len(body["prompt"].split(" ")) == 900


def test_requests_go_out_on_schedule_even_when_the_server_is_slow(frontend: FakeFrontend) -> None:
    results = run(requests_at(0.0, 0.1, 0.2, output_tokens=2), url=frontend.url, model="slow/open")
    assert [r.status for r in results] == ["ok"] * 3
    arrivals = [r.at for r in frontend.bodies("slow/open")]
    assert len(arrivals) == 3
    # Not early: each went out no sooner than its schedule (server-side gaps shrink when one is late).
    assert all(r.start_s >= r.scheduled_s for r in results)
    assert [round(r.scheduled_s, 3) for r in results] == [0.0, 0.1, 0.2]
    # open loop: the last request was sent long before the first (1 s to its first token) was answered
    assert results[2].start_s < results[0].end_s
    assert arrivals[2] - arrivals[0] < 0.9
    for result in results:
        assert result.lateness_s >= -0.001
        assert result.start_s == pytest.approx(result.scheduled_s, abs=0.5)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("fail", "HTTP 500: .*engine fell over"),
        ("drop", "RemoteProtocolError|ReadError"),
        ("garbage", "not JSON"),
        ("nodone", r"without `data: \[DONE\]` or a finish_reason"),
        ("truncated", "truncated: .*without a finish_reason"),
    ],
)
def test_errors_are_recorded_and_do_not_stop_the_run(
    frontend: FakeFrontend, mode: str, expected: str
) -> None:
    requests = requests_at(0.0, 0.02, 0.04, 0.06, output_tokens=6)
    requests[1] = replace(requests[1], output_tokens=FAILING_TOKENS)
    seen: list[client.Result] = []
    results = run(requests, url=frontend.url, model=f"mix:{mode}/errors", on_result=seen.append)
    assert [r.status for r in results] == ["ok", "error", "ok", "ok"]
    assert results[1].error is not None and re.search(expected, results[1].error), results[1].error
    assert sorted(r.index for r in seen) == [0, 1, 2, 3]
    assert report.summarise(results).errors == 1


def test_connection_refused_is_an_error(frontend: FakeFrontend) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the request: nothing listens
    results = run(requests_at(0.0, 0.01), url=f"http://127.0.0.1:{port}", model="ok/refused", timeout_s=5)
    assert [r.status for r in results] == ["error", "error"]
    assert all("ConnectError" in (r.error or "") for r in results)


def test_timeout_bounds_a_request(frontend: FakeFrontend) -> None:
    started = time.monotonic()
    (result,) = run(requests_at(0.0), url=frontend.url, model="hang/timeout", timeout_s=0.3)
    assert result.status == "error" and "timeout" in (result.error or "")
    assert time.monotonic() - started < 20  # bounded by the timeout, not the server's 30 s


def test_no_stream_mode(frontend: FakeFrontend) -> None:
    (result,) = run(requests_at(0.0, output_tokens=5), url=frontend.url, model="ok/plain", stream=False)
    assert result.status == "ok" and result.output_tokens == 5
    assert result.ttft_s is None and result.latency_s >= 0.05
    assert frontend.bodies("ok/plain")[0].body["stream"] is False


def test_cancelling_the_replay_cancels_requests_in_flight(frontend: FakeFrontend) -> None:
    seen: list[client.Result] = []

    async def scenario() -> None:
        replaying = asyncio.create_task(
            client.replay(
                requests_at(0.0, 0.05, 60.0), url=frontend.url, model="hang/cancel", on_result=seen.append
            )
        )
        # Cancel once both early requests are in flight at the server: a fixed sleep lost that race on a
        # loaded machine (the client's warm-up alone can take longer).
        deadline = time.monotonic() + 20
        while len(frontend.bodies("hang/cancel")) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        replaying.cancel()
        with pytest.raises(asyncio.CancelledError):
            await replaying

    asyncio.run(scenario())
    assert sorted(r.index for r in seen) == [0, 1]  # the one due at 60 s was never sent
    assert all(r.status == "cancelled" for r in seen)


def test_served_models(frontend: FakeFrontend) -> None:
    assert asyncio.run(client.served_models(frontend.url + "/v1")) == ["ok/served"]


# -- the command line ------------------------------------------------------------------------------


@pytest.mark.skipif(not AZURE.is_file(), reason="no shared traces")
def test_cli_replays_a_slice_and_writes_json(frontend: FakeFrontend, tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    argv = ["--trace", str(AZURE), "--max-requests", "5", "--url", frontend.url, "--quiet"]
    argv += ["--json", str(out), "--per-request", "--sla", "ttft=10s,itl=1s"]
    assert cli.main(argv) == 0  # no --model: the first of /v1/models
    document = json.loads(out.read_text())
    assert document["model"] == "ok/served"
    assert document["summary"]["count"] == 5 and document["summary"]["good"] == 5
    assert [r["expected_output_tokens"] for r in document["requests"]] == [10, 8, 27, 14, 12]
    assert [r["output_tokens"] for r in document["requests"]] == [10, 8, 27, 14, 12]


@pytest.mark.skipif(not AZURE.is_file(), reason="no shared traces")
def test_cli_dry_run_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--trace", str(AZURE), "--duration", "60", "--dry-run"]) == 0
    assert "requests" in capsys.readouterr().out
    assert cli.main(["--trace", str(AZURE), "--dry-run", "--sla", "ttft=fast"]) == 2
    assert cli.main(["--trace", str(AZURE)]) == 2  # no --url


def test_a_tenant_shift_on_a_rate_series_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    series = tmp_path / "rates.csv"
    series.write_text("model,t_start_s,total_rate_rps,active_clients\nm-large,0,0.5,3\nm-large,600,0.7,3\n")
    assert cli.main(["--trace", str(series), "--rate-scale", "4", "--dry-run"]) == 0  # without it: fine
    capsys.readouterr()
    assert cli.main(["--trace", str(series), "--rate-scale", "4", "--tenant-shift", "60", "--dry-run"]) == 2
    assert "drop --tenant-shift" in capsys.readouterr().err


# -- the report (pure) -----------------------------------------------------------------------------


def test_percentiles_on_known_data() -> None:
    data = [float(v) for v in range(1, 11)]
    assert report.percentile(data, 50) == pytest.approx(5.5)
    assert report.percentile(data, 90) == pytest.approx(9.1)
    assert report.percentile(data, 0) == 1.0 and report.percentile(data, 100) == 10.0
    assert report.percentile([3.0], 99) == 3.0
    rng = np.random.default_rng(0)
    sample = rng.lognormal(0, 1, 1001).tolist()
    for q in (50, 90, 95, 99):
        assert report.percentile(sample, q) == pytest.approx(float(np.percentile(sample, q)))
    dist = report.distribution(reversed(data))
    assert dist is not None and (dist.count, dist.mean, dist.maximum) == (10, 5.5, 10.0)
    assert report.distribution([]) is None


def result(
    index: int,
    *,
    start: float,
    ttft: float | None = 0.1,
    itl: float = 0.02,
    tokens: int = 11,
    status: client.Status = "ok",
) -> client.Result:
    """A finished request: tokens `itl` apart after `ttft`, ending with the last one."""
    times = [] if ttft is None else [ttft + i * itl for i in range(tokens)]
    end = start + (times[-1] if times else 0.5)
    return client.Result(
        index=index,
        scheduled_s=start,
        input_tokens=100,
        expected_output_tokens=tokens,
        start_s=start,
        end_s=end,
        status=status,
        error=None if status == "ok" else "HTTP 503: busy",
        token_times_s=times,
        output_tokens=tokens if status == "ok" else 0,
    )


def test_goodput_counts_requests_meeting_every_bound() -> None:
    results = [
        result(0, start=0.0),  # good
        result(1, start=1.0, ttft=0.6),  # TTFT over 500 ms
        result(2, start=2.0, itl=0.08),  # ITL over 50 ms
        result(3, start=3.0, status="error"),
        result(4, start=4.0, ttft=0.4, itl=0.05, tokens=1),  # one token: no gaps to judge
        result(5, start=9.0, ttft=None),  # no TTFT (not streamed): cannot show it met the bound
    ]
    summary = report.summarise(results, report.parse_sla("ttft=500ms,itl=50ms"))
    assert (summary.count, summary.ok, summary.errors, summary.cancelled) == (6, 5, 1, 0)
    assert summary.good == 2
    assert summary.goodput_fraction == pytest.approx(2 / 6)
    assert summary.duration_s == pytest.approx(9.5)  # first start 0, last end 9.5
    assert summary.goodput_rps == pytest.approx(2 / 9.5)
    assert summary.request_rate_rps == pytest.approx(6 / 9.5)
    assert summary.output_tokens == 11 * 3 + 1 + 11
    assert summary.itl_ms is not None and summary.itl_ms.maximum == pytest.approx(80)
    assert summary.ttft_ms is not None and summary.ttft_ms.count == 4
    assert summary.error_kinds == {"HTTP 503: busy": 1}
    # without bounds every success is good; a latency bound judges end-to-end
    assert report.summarise(results, report.parse_sla("")).good == 5
    assert report.summarise(results, report.parse_sla("latency=0.4s")).good == 1


def test_sla_parsing() -> None:
    assert report.parse_sla("ttft=500ms,itl=50ms") == report.Sla(ttft_ms=500, itl_ms=50)
    assert report.parse_sla("ttft=0.5s, tpot=20, e2e=10s") == report.Sla(
        ttft_ms=500, itl_ms=20, latency_ms=10_000
    )
    for bad in ("ttft", "speed=5ms", "ttft=1.2.3ms", "ttft=-5ms"):
        with pytest.raises(ValueError, match="SLA"):
            report.parse_sla(bad)


def test_summary_and_records_are_json_and_render() -> None:
    results = [
        result(0, start=0.0),
        client.Result(index=1, scheduled_s=2.0, input_tokens=1, expected_output_tokens=1),
    ]
    summary = report.summarise(results)
    assert summary.count == 1  # the never-sent one is left out
    text = json.dumps(report.summary_dict(summary), allow_nan=False)
    assert json.loads(text)["sla"] == {"ttft_ms": 500.0, "itl_ms": 50.0}
    unsent = report.result_dict(results[1])
    assert unsent["start_ms"] is None and unsent["ttft_ms"] is None
    json.dumps([report.result_dict(r) for r in results], allow_nan=False)
    console = Console(file=StringIO(), width=120)
    console.print(report.render(summary))
    console.print(report.render(report.summarise([])))
    assert "goodput" in console.file.getvalue()  # type: ignore[attr-defined]
    assert math.isnan(results[1].latency_s)


def test_a_stream_that_says_why_it_ended_is_complete_without_done(frontend: FakeFrontend) -> None:
    """OpenAI ends a stream with `data: [DONE]`; a server that closes it right after the chunk carrying the
    finish_reason (Hugging Face's `transformers serve`) has answered in full all the same."""
    results = run(requests_at(0.0, output_tokens=5), url=frontend.url, model="finished/served")
    assert results[0].status == "ok", results[0].error
    assert results[0].output_tokens == 5 and results[0].finish_reason == "length"


def test_the_profiler_drops_vllms_length_fields_for_an_endpoint_that_refuses_them(frontend: FakeFrontend) -> None:
    """A server that refuses unknown fields (Hugging Face's `transformers serve`: 422) is measured without
    `min_tokens`/`ignore_eos`; one that takes them keeps them."""
    from fleetpilot.profiler import client as profiler

    async def probe(model: str) -> tuple[bool, int]:
        endpoint = profiler.Client(frontend.url, model=model)
        try:
            kept = await endpoint.probe_length_extensions()
            streams, _ = await endpoint.burst(8, 1, max_tokens=3)
            return kept, len(streams[0].token_times)
        finally:
            await endpoint.aclose()

    assert asyncio.run(probe("strict/probe")) == (False, 3)
    assert "ignore_eos" not in frontend.bodies("strict/probe")[-1].body
    assert asyncio.run(probe("ok/probe")) == (True, 3)
    assert frontend.bodies("ok/probe")[-1].body["ignore_eos"] is True
