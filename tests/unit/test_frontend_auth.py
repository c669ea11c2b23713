"""API keys at the frontend: the right key is served, a wrong or missing one gets OpenAI's 401, no key in force
refuses everything, a key set replaced whole rotates the keys, a key at its in-flight limit gets 429 with
Retry-After, and no key ever reaches the log or the metrics.

The frontend runs on an ASGI transport in the test's event loop, over a real simulator worker
(test_sim_server's); the key sources are driven by hand (`auth.Keys.replace`), by a scripted API (the
Secret's watch) and by a file.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from test_frontend_app import FakeDiscovery, metric
from test_sim_server import worker

from fleetpilot.frontend import app as app_mod
from fleetpilot.frontend import auth, cli, routing

MODEL = "llama-8b"
RIGHT = "sk-right-5b1e0c9a7d"
OTHER = "sk-other-c04f19e2b8"
WRONG = "sk-wrong-9911aa0b3c"
EVERY_KEY = (RIGHT, OTHER, WRONG)


def keys_of(*texts: str) -> auth.Keys:
    keys = auth.Keys("test keys")
    keys.replace(auth.KeySet.of(texts))
    return keys


def frontend(url: str, keys: auth.Keys, **kwargs: Any) -> tuple[app_mod.Frontend, httpx.AsyncClient]:
    discovery = FakeDiscovery()
    discovery.set("aggregated", [routing.Worker(url, "aggregated", "agg-0")])
    fe = app_mod.Frontend(model=MODEL, mode="aggregated", discovery=discovery, policy=routing.RoundRobin(),
                          api_keys=keys, **kwargs)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=fe.app()), base_url="http://frontend", timeout=30)
    return fe, client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def complete(client: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    return await client.post("/v1/completions", headers=headers,
                             json={"model": MODEL, "prompt": "a b c d", "max_tokens": 3})


def assert_openai_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key" and error["param"] is None
    assert response.headers["www-authenticate"].startswith("Bearer")


# -- the key set -----------------------------------------------------------------------------------


def test_a_key_set_keeps_digests_strips_whitespace_and_matches_only_whole_keys() -> None:
    keys = auth.KeySet.of([f"{RIGHT}\n", "  ", OTHER, OTHER])
    assert len(keys) == 2  # the blank one left out, the duplicate counted once
    assert RIGHT.encode() not in b"".join(keys.digests)  # digests only, never the text
    assert keys.match(RIGHT.encode()) == auth.digest(RIGHT.encode())
    assert keys.match(OTHER.encode()) == auth.digest(OTHER.encode())
    assert keys.match(WRONG.encode()) is None
    assert keys.match(RIGHT[:-1].encode()) is None and keys.match(f"{RIGHT}x".encode()) is None
    assert auth.KeySet().match(b"") is None


@pytest.mark.parametrize(("header", "found"), [
    (f"Bearer {RIGHT}", RIGHT.encode()),
    (f"bearer   {RIGHT} ", RIGHT.encode()),
    ("Bearer", None),
    ("Bearer   ", None),
    (f"Basic {RIGHT}", None),
    (RIGHT, None),
])
def test_the_key_comes_from_a_bearer_authorization_header(header: str, found: bytes | None) -> None:
    assert auth.bearer(Headers(headers={"authorization": header})) == found
    assert auth.bearer(Headers(headers={})) is None


# -- the frontend with keys ------------------------------------------------------------------------


def test_the_right_key_is_served_and_a_wrong_or_missing_one_gets_openais_401() -> None:
    with worker(role="aggregated") as w:

        async def go() -> tuple[list[httpx.Response], str]:
            _, client = frontend(w.url, keys_of(RIGHT, OTHER))
            async with client:
                answers = [await complete(client, bearer(RIGHT)), await complete(client, bearer(OTHER)),
                           await complete(client, bearer(WRONG)), await complete(client, {}),
                           await complete(client, {"Authorization": f"Basic {RIGHT}"}),
                           await client.get("/v1/models", headers=bearer(WRONG))]
                return answers, (await client.get("/metrics")).text

        (right, other, wrong, missing, basic, models), text = asyncio.run(go())
    assert right.status_code == other.status_code == 200 and right.json()["choices"][0]["text"]
    for refused in (wrong, missing, basic, models):
        assert_openai_401(refused)
    assert "Authorization" in missing.json()["error"]["message"]  # says how to send one
    refusals = {s[0]["reason"]: s[1] for s in metric(text, "fleetpilot_frontend_auth_refusals_total")}
    assert refusals == {"missing_key": 2.0, "invalid_key": 2.0, "no_keys": 0.0, "in_flight_limit": 0.0}
    # A refused request never reached the metric contract the planner reads: two requests were served.
    assert sum(s[1] for s in metric(text, "fleetpilot_frontend_requests_total")) == 2
    assert not any(key in text for key in EVERY_KEY)


def test_probes_and_metrics_need_no_key_and_an_unknown_route_does() -> None:
    async def go() -> list[httpx.Response]:
        _, client = frontend("http://127.0.0.1:9", keys_of(RIGHT))
        async with client:
            return [await client.get(path) for path in ("/health", "/ready", "/metrics", "/v1/embeddings")]

    health, ready, metrics_, unknown = asyncio.run(go())
    assert health.status_code == 200 and ready.status_code == 200 and metrics_.status_code == 200
    assert_openai_401(unknown)  # no route list for a client without a key


def test_until_keys_are_read_and_while_none_are_in_force_every_request_is_refused() -> None:
    keys = auth.Keys("test keys")  # not read yet

    async def go() -> list[httpx.Response]:
        _, client = frontend("http://127.0.0.1:9", keys)
        async with client:
            unread = await complete(client, bearer(RIGHT))
            keys.replace(auth.KeySet())  # read, and empty
            empty = await complete(client, bearer(RIGHT))
            keys.replace(auth.KeySet.of([""]))  # only blank values
            blank = await complete(client, {"Authorization": "Bearer  "})
            return [unread, empty, blank, await client.get("/metrics")]

    *refused, text = asyncio.run(go())
    for response in refused:
        assert_openai_401(response)
        assert "no API key in force" in response.json()["error"]["message"]
    assert metric(text.text, "fleetpilot_frontend_auth_refusals_total", reason="no_keys")[0][1] == 3


def test_replacing_the_key_set_rotates_the_keys_at_once() -> None:
    keys = keys_of(RIGHT)
    with worker(role="aggregated") as w:

        async def go() -> list[int]:
            _, client = frontend(w.url, keys)
            async with client:
                statuses = [(await complete(client, bearer(RIGHT))).status_code,
                            (await complete(client, bearer(OTHER))).status_code]
                keys.replace(auth.KeySet.of([RIGHT, OTHER]))  # the new key added: both work
                statuses += [(await complete(client, bearer(RIGHT))).status_code,
                             (await complete(client, bearer(OTHER))).status_code]
                keys.replace(auth.KeySet.of([OTHER]))  # the old one removed
                statuses += [(await complete(client, bearer(RIGHT))).status_code,
                             (await complete(client, bearer(OTHER))).status_code]
                return statuses

        assert asyncio.run(go()) == [200, 401, 200, 200, 401, 200]


# -- the per-key in-flight limit -------------------------------------------------------------------


def slow_app(release: asyncio.Event, started: asyncio.Queue[str]) -> Starlette:
    """A stream that sends its first chunk, then waits for `release`: in flight until it ends."""

    async def stream(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"first\n"
            await started.put(request.headers["authorization"][-4:])
            await release.wait()
            yield b"last\n"

        return StreamingResponse(body())

    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/v1/stream", stream), Route("/v1/ok", ok)])


def test_a_key_at_its_in_flight_limit_gets_429_with_retry_after_and_other_keys_do_not() -> None:
    refused: list[str] = []

    async def go() -> dict[str, Any]:
        release, started = asyncio.Event(), asyncio.Queue[str]()
        guard = auth.ApiKeyAuth(slow_app(release, started), keys=keys_of(RIGHT, OTHER), max_in_flight=2,
                                on_refused=refused.append)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://frontend", timeout=30)

        async def streamed(key: str) -> httpx.Response:
            return await client.get("/v1/stream", headers=bearer(key))

        async with client:
            first = [asyncio.create_task(streamed(RIGHT)) for _ in range(2)]
            for _ in first:
                await asyncio.wait_for(started.get(), 10)  # both streams are mid-body: in flight
            over = await client.get("/v1/ok", headers=bearer(RIGHT))
            other = await client.get("/v1/ok", headers=bearer(OTHER))
            in_flight = dict(guard.in_flight)
            release.set()
            streams = await asyncio.gather(*first)
            after = await client.get("/v1/ok", headers=bearer(RIGHT))
            return {"over": over, "other": other, "in_flight": in_flight, "streams": streams, "after": after,
                    "left": dict(guard.in_flight)}

    seen = asyncio.run(go())
    over = seen["over"]
    assert over.status_code == 429 and over.headers["retry-after"] == str(auth.IN_FLIGHT_RETRY_AFTER_S)
    assert over.json()["error"]["code"] == "rate_limit_exceeded" and "2 requests in flight" in over.json()["error"]["message"]
    assert seen["other"].status_code == 200  # another key has its own count
    assert seen["in_flight"] == {auth.digest(RIGHT.encode()): 2}  # counted by digest, never by key text
    assert [s.text for s in seen["streams"]] == ["first\nlast\n"] * 2
    assert seen["after"].status_code == 200 and seen["left"] == {}  # the slots freed as the streams ended
    assert refused == ["in_flight_limit"]


def test_the_openai_sdk_sees_the_429_as_a_rate_limit_error() -> None:
    import openai

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json=auth.over_limit(3).body(), headers={"retry-after": "1"})

    client = openai.OpenAI(api_key=RIGHT, base_url="http://frontend/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(answer)))
    with pytest.raises(openai.RateLimitError) as raised:
        client.completions.create(model=MODEL, prompt="a", max_tokens=1)
    assert raised.value.code == "rate_limit_exceeded" and "3 requests in flight" in raised.value.message


# -- sources: the Secret, a file -------------------------------------------------------------------


def secret(data: dict[str, str], version: str) -> dict[str, Any]:
    return {"kind": "Secret", "metadata": {
        "name": "keys", "namespace": "ns", "resourceVersion": version,
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": str(data)}},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


class SecretApi:
    """Answers the Secret's LIST from `listed` and its WATCH with `events` as the test puts them."""

    def __init__(self, listed: list[dict[str, Any]]) -> None:
        self.listed = listed
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.asked: list[tuple[str, str | None, str | None]] = []

    async def list_object(self, kind: str, namespace: str | None = None, *, field_selector: str | None = None,
                          **_: Any) -> dict[str, Any]:
        self.asked.append((kind, namespace, field_selector))
        return {"metadata": {"resourceVersion": "10"}, "items": self.listed}

    async def watch(self, kind: str, namespace: str | None, *, field_selector: str | None = None,
                    **_: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.asked.append((kind, namespace, field_selector))
        while True:
            yield await self.events.get()


async def changed(keys: auth.Keys, action: Any = None) -> None:
    waiting = keys.changed
    if action is not None:
        action()
    await asyncio.wait_for(waiting.wait(), 5)


def test_secret_keys_follow_the_watched_secret_and_fail_closed_when_it_goes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def go() -> list[int | None]:
        api = SecretApi([secret({"team-a": f"{RIGHT}\n"}, "5")])
        keys = auth.SecretKeys(api, namespace="ns", name="keys")  # type: ignore[arg-type]
        sizes: list[int | None] = [None if keys.current is None else len(keys.current)]
        waiting = keys.changed
        await keys.start()
        while keys.current is None:  # start() says "not read yet", then the List brings the Secret
            await asyncio.wait_for(waiting.wait(), 5)
            waiting = keys.changed
        assert keys.current.match(RIGHT.encode())
        sizes.append(len(keys.current))
        await changed(keys, lambda: api.events.put_nowait(
            ("MODIFIED", secret({"team-a": RIGHT, "team-b": OTHER}, "11"))))
        sizes.append(len(keys.current))
        await changed(keys, lambda: api.events.put_nowait(("MODIFIED", secret({"team-b": OTHER}, "12"))))
        assert keys.current.match(RIGHT.encode()) is None and keys.current.match(OTHER.encode())
        sizes.append(len(keys.current))
        await changed(keys, lambda: api.events.put_nowait(("DELETED", secret({"team-b": OTHER}, "13"))))
        sizes.append(len(keys.current))
        await keys.stop()
        assert api.asked[:2] == [("Secret", "ns", "metadata.name=keys")] * 2  # that Secret alone, by name
        stored = keys._informer.store.objects()
        assert not stored  # deleted
        return sizes

    assert asyncio.run(go()) == [None, 1, 2, 1, 0]
    # Each change said once, the rotation to another single key too.
    assert caplog.text.count("API keys: 1 from Secret ns/keys") == 2 and "API keys: 2 from Secret ns/keys" in caplog.text
    assert "Secret ns/keys is missing; every request is refused with 401" in caplog.text
    assert not any(key in caplog.text for key in EVERY_KEY)


def test_a_secret_missing_at_start_is_said_once_and_refuses_everything(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> auth.KeySet | None:
        keys = auth.SecretKeys(SecretApi([]), namespace="ns", name="keys")  # type: ignore[arg-type]
        await keys.start()
        while keys.current is None:
            await asyncio.sleep(0.01)
        await keys.stop()
        return keys.current

    with caplog.at_level(logging.INFO):
        found = asyncio.run(go())
    assert found is not None and not found
    assert caplog.text.count("Secret ns/keys is missing") == 1


def test_the_informer_keeps_no_annotation_of_the_secret() -> None:
    kept = auth._secret_without_extras(secret({"a": RIGHT}, "1"))
    assert kept["metadata"] == {"name": "keys", "namespace": "ns", "resourceVersion": "1"}
    assert RIGHT not in str(kept["metadata"])


def test_a_secret_value_that_is_not_base64_is_left_out_naming_its_data_key_only(
        caplog: pytest.LogCaptureFixture) -> None:
    body = secret({"good": RIGHT}, "1")
    body["data"]["broken"] = f"!{WRONG}!"
    with caplog.at_level(logging.WARNING):
        keys = auth.secret_keys(body)
    assert len(keys) == 1 and keys.match(RIGHT.encode())
    assert "'broken'" in caplog.text and WRONG not in caplog.text


def test_file_keys_are_read_again_when_the_file_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "keys"
    path.write_text(f"# clients of team a\n{RIGHT}\n\n")
    keys = auth.FileKeys(path)
    keys.read()
    assert keys.current is not None and len(keys.current) == 1 and keys.current.match(RIGHT.encode())
    path.write_text(f"{RIGHT}\n{OTHER}\n")
    keys.read()
    assert len(keys.current) == 2
    path.unlink()
    keys.read()
    assert keys.current is not None and not keys.current
    assert f"file {path} is missing" in caplog.text
    assert not any(key in caplog.text for key in EVERY_KEY)


def test_no_key_reaches_the_log_through_the_frontend(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    keys = keys_of(RIGHT)

    async def go() -> None:
        _, client = frontend("http://127.0.0.1:9", keys)  # no worker listens: a 503 after the key check
        async with client:
            await complete(client, bearer(RIGHT))
            await complete(client, bearer(WRONG))
            keys.replace(auth.KeySet.of([OTHER]))
            await complete(client, bearer(RIGHT))

    asyncio.run(go())
    assert "API keys: 1 from test keys" in caplog.text
    assert not any(key in caplog.text for key in EVERY_KEY)


# -- the command line ------------------------------------------------------------------------------


def parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["frontend", "--model", MODEL, "--mode", "aggregated",
                              "--worker-url", "http://127.0.0.1:9", *args])


def test_the_command_line_builds_the_key_source_it_names(tmp_path: Path) -> None:
    assert cli.build(parse()).api_keys is None
    built = cli.build(parse("--api-key-file", str(tmp_path / "keys"), "--max-in-flight-per-key", "4"))
    assert isinstance(built.api_keys, auth.FileKeys) and built.max_in_flight_per_key == 4
    with pytest.raises(SystemExit, match="needs --namespace"):
        cli.build(parse("--api-key-secret", "keys"))
    with pytest.raises(SystemExit, match="needs --api-key-secret or --api-key-file"):
        cli.build(parse("--max-in-flight-per-key", "4"))
    with pytest.raises(SystemExit, match="not both"):
        cli.build(parse("--api-key-secret", "keys", "--namespace", "ns", "--api-key-file", "f"))
    with pytest.raises(SystemExit):
        parse("--max-in-flight-per-key", "0")
