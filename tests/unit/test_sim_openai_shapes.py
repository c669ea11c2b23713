"""The simulator's OpenAI answers against OpenAI's documented shapes: stop strings held back across
tokens and chunks, sampling that honours temperature / top_p / seed, and logprobs (chat's
`logprobs.content`, the legacy completions' `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`).

The pure pieces (`StopFilter`, `TokenSampler`, `Sampling`) are tested directly; the HTTP answers through
an in-process worker (test_sim_server.py's `worker`). The greedy text is FILLER_WORDS in order:
" the fleet sails on a quiet sea while pilots watch every signal and ...".
"""

from __future__ import annotations

import collections
import math
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_server import MODEL, stream_all, words, worker

from fleetpilot.sim import server

GREEDY = [server.filler_token(i) for i in range(64)]


def complete(url: str, **body: Any) -> dict[str, Any]:
    response = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": words(10), **body}, timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def chat(url: str, **body: Any) -> dict[str, Any]:
    response = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": words(10)}], **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def content_chunks(events: list[Any]) -> list[dict[str, Any]]:
    """The chunks of a stream that carry a choice, without the usage chunk and [DONE]."""
    return [e for e in events if isinstance(e, dict) and e.get("choices")]


# -- stop strings: the filter ------------------------------------------------------------------------


def feed(stops: tuple[str, ...], tokens: list[str]) -> tuple[list[str], str | None]:
    """What a StopFilter releases token by token (the held text flushed after the last), and the stop."""
    f = server.StopFilter(stops)
    out = []
    for token in tokens:
        text, stop = f.push(token)
        out.append(text)
        if stop is not None:
            return out, stop
    out.append(f.flush())
    return out, None


def test_a_stop_string_over_several_tokens_leaks_none_of_itself() -> None:
    released, stop = feed(("fleet sails on a",), GREEDY[:8])
    assert stop == "fleet sails on a"
    assert released == [" the", " ", "", "", ""]  # " fleet" could begin the stop: held from its first letter
    assert "".join(released) == " the "


def test_held_text_is_released_once_it_cannot_begin_the_stop_string() -> None:
    released, stop = feed(("fleet sails on board",), GREEDY[:6])
    assert stop is None
    assert released == [" the", " ", "", "", "fleet sails on a", " quiet", ""]
    assert "".join(released) == "".join(GREEDY[:6])


def test_a_stop_string_inside_one_token_cuts_that_token() -> None:
    assert feed(("ails",), GREEDY[:5]) == ([" the", " fleet", " s"], "ails")


def test_the_earliest_stop_string_wins_and_the_held_tail_is_flushed_at_the_end() -> None:
    assert feed(("quiet", "sails"), GREEDY[:8]) == ([" the", " fleet", " "], "sails")
    released, stop = feed(("a quiet night",), GREEDY[:6])  # the output ends inside a possible match
    assert stop is None and released[-1] == "a quiet" and "".join(released) == "".join(GREEDY[:6])


@given(tokens=st.lists(st.text(alphabet="ab ", min_size=1, max_size=3), max_size=12),
       stops=st.lists(st.text(alphabet="ab ", min_size=1, max_size=4), min_size=1, max_size=3))
@settings(max_examples=500)
def test_the_filter_releases_exactly_the_text_before_the_first_stop_and_never_more(
        tokens: list[str], stops: list[str]) -> None:
    # Generation ends at the first token after which the text holds a stop string (the earliest of
    # those it holds); the answer is the text before it.
    expected = seen = ""
    for token in tokens:
        seen += token
        if hits := [at for s in stops if (at := seen.find(s)) >= 0]:
            expected = seen[:min(hits)]
            break
    else:
        expected = seen
    f = server.StopFilter(tuple(stops))
    sent, seen = "", ""
    for token in tokens:
        seen += token
        text, stop = f.push(token)
        sent += text
        assert expected.startswith(sent), "released text beyond the stop string"
        # The stop is reported on the token that completes the first occurrence, not later.
        assert (stop is not None) == any(s in seen for s in stops)
        if stop is not None:
            assert seen.find(stop) == min(seen.find(s) for s in stops if s in seen)
            break
    else:
        sent += f.flush()
    assert sent == expected


# -- stop strings: over HTTP ---------------------------------------------------------------------------


def test_a_stop_string_split_over_tokens_is_not_sent_streaming_or_not() -> None:
    body = {"max_tokens": 64, "temperature": 0, "stop": ["fleet sails on a"]}
    with worker() as w:
        answer = complete(w.url, **body)
        (choice,) = answer["choices"]
        assert choice["text"] == " the " and choice["finish_reason"] == "stop"
        assert choice["stop_reason"] == "fleet sails on a"
        assert answer["usage"]["completion_tokens"] == 5  # the tokens generated, the stop's included

        events = stream_all(w.url + "/v1/completions", {
            "model": MODEL, "prompt": words(10), **body, "stream": True, "stream_options": {"include_usage": True}})
        chunks = content_chunks(events)
        texts = [c["choices"][0]["text"] for c in chunks]
        assert "".join(texts) == " the "
        assert not any(word in t for t in texts for word in ("fleet", "sails", " on", " a"))
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
        assert events[-2]["usage"]["completion_tokens"] == 5 and events[-1] == "[DONE]"

        streamed = stream_all(w.url + "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body, "stream": True})
        deltas = [c["choices"][0]["delta"].get("content", "") for c in content_chunks(streamed)]
        assert "".join(deltas) == " the " and content_chunks(streamed)[-1]["choices"][0]["finish_reason"] == "stop"
        assert chat(w.url, **body)["choices"][0]["message"]["content"] == " the "


def test_text_held_for_a_stop_that_never_comes_is_streamed_once_it_cannot_match() -> None:
    body = {"model": MODEL, "prompt": words(10), "max_tokens": 8, "temperature": 0,
            "stop": ["fleet sails on board"], "stream": True}
    with worker() as w:
        chunks = content_chunks(stream_all(w.url + "/v1/completions", body))
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == "".join(GREEDY[:8])
    assert "fleet sails on a" in texts[2]  # the three held tokens go out together with " a"
    assert len(chunks) == 6 and chunks[-1]["choices"][0]["finish_reason"] == "length"


# -- sampling -------------------------------------------------------------------------------------------


def test_sampling_at_temperature_one_differs_between_requests_unless_seeded() -> None:
    def text(w: Any, **sampling: Any) -> str:
        return str(complete(w.url, max_tokens=32, **sampling)["choices"][0]["text"])

    with worker() as w:
        unseeded = [text(w, temperature=1.0) for _ in range(3)]
        assert len(set(unseeded)) == 3
        assert all(len(t.split()) == 32 and set(t.split()) <= set(server.FILLER_WORDS) for t in unseeded)
        assert text(w) != text(w)  # temperature defaults to 1, as in OpenAI's API and vLLM
        assert text(w, temperature=1.0, seed=7) == text(w, temperature=1.0, seed=7) != text(w, temperature=1.0, seed=8)
        assert text(w, temperature=0.7, top_p=0.9, seed=7) == text(w, temperature=0.7, top_p=0.9, seed=7)
        assert text(w, temperature=0) == text(w, temperature=0, seed=3) == "".join(GREEDY[:32])
        assert text(w, temperature=1.5, top_p=0.0) == "".join(GREEDY[:32])  # the nucleus keeps only the likeliest


def test_sampled_words_follow_the_distribution_that_logprobs_report() -> None:
    """At temperature 1 the draws at a position come from exp(logprob); at another temperature from the
    scaled softmax; top_p keeps only the nucleus. 6,000 draws: 4-sigma bounds."""
    n = 6000
    for temperature, top_p in ((1.0, 1.0), (0.5, 1.0), (1.0, 0.6)):
        sampler = server.TokenSampler(server.Sampling(temperature=temperature, top_p=top_p, seed=11))
        counts = collections.Counter(sampler.next(0).word for _ in range(n))
        words, cumulative = server.nucleus(0, temperature, top_p)
        assert set(counts) <= set(words)
        probabilities = [b - a for a, b in zip((0.0, *cumulative), cumulative, strict=False)]
        for word, p in zip(words, probabilities, strict=True):
            assert abs(counts[word] / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (temperature, top_p, word)
    leader = server.RANKED[0][0]
    words, cumulative = server.nucleus(0, 1.0, 1.0)
    assert words[0] == leader and cumulative[0] == pytest.approx(math.exp(server.LOGPROBS[0][leader]))


def test_sampling_fields_out_of_range_are_refused_naming_the_field() -> None:
    cases: list[tuple[dict[str, Any], bool, str]] = [
        ({"temperature": -0.1}, False, "temperature"),
        ({"temperature": "hot"}, True, "temperature"),
        ({"top_p": 1.5}, False, "top_p"),
        ({"seed": "x"}, False, "seed"),
        ({"seed": True}, True, "seed"),
        ({"logprobs": 21}, False, "logprobs"),
        ({"logprobs": -1}, False, "logprobs"),
        ({"logprobs": True}, False, "logprobs"),  # completions take a count
        ({"logprobs": 2}, True, "logprobs"),  # chat takes true/false
        ({"logprobs": True, "top_logprobs": 21}, True, "top_logprobs"),
        ({"top_logprobs": 3}, True, "top_logprobs"),  # without logprobs: true
    ]
    for fields, is_chat, param in cases:
        with pytest.raises(server.BadRequest) as raised:
            server.Sampling.from_body(fields, chat=is_chat)
        assert raised.value.param == param and param in str(raised.value), fields
    assert server.Sampling.from_body({"logprobs": True, "top_logprobs": 20}, chat=True).logprobs == 20
    assert server.Sampling.from_body({"logprobs": False}, chat=True).logprobs is None
    assert server.Sampling.from_body({"logprobs": 0}, chat=False).logprobs == 0
    assert server.Sampling.from_body({}, chat=False) == server.Sampling(temperature=1.0, top_p=1.0)

    with worker() as w:
        refused = httpx.post(w.url + "/v1/chat/completions", timeout=10, json={
            "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 25})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "top_logprobs" and "top_logprobs" in error["message"]
        refused = httpx.post(w.url + "/v1/completions", json={"prompt": "hi", "logprobs": 21}, timeout=10)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "logprobs"
        assert w.metric("vllm:request_success_total", finished_reason="abort") == 0  # refused before the engine
        assert w.metric("vllm:generation_tokens_total") == 0


# -- logprobs --------------------------------------------------------------------------------------------


def assert_chat_entry(entry: dict[str, Any], top: int, *, greedy: bool) -> None:
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
    assert entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
    alternatives = entry["top_logprobs"]
    assert len(alternatives) == top
    assert all(set(a) == {"token", "logprob", "bytes"} and a["bytes"] == list(a["token"].encode())
               for a in alternatives)
    values = [a["logprob"] for a in alternatives]
    assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    assert len({a["token"] for a in alternatives}) == top
    if alternatives:
        assert entry["logprob"] <= values[0] + 1e-12
    if greedy:
        assert alternatives[0]["token"] == entry["token"] and alternatives[0]["logprob"] == entry["logprob"]


def test_chat_logprobs_have_openais_shape_streaming_or_not() -> None:
    with worker() as w:
        for temperature in (0.0, 1.0):
            answer = chat(w.url, max_tokens=12, temperature=temperature, logprobs=True, top_logprobs=5)
            (choice,) = answer["choices"]
            content = choice["logprobs"]["content"]
            assert len(content) == answer["usage"]["completion_tokens"] == 12
            assert "".join(e["token"] for e in content) == choice["message"]["content"]
            for entry in content:
                assert_chat_entry(entry, 5, greedy=temperature == 0)
        # The probabilities are the model's, whatever the sampling: equal at equal positions.
        plain = chat(w.url, max_tokens=3, temperature=0, logprobs=True)["choices"][0]["logprobs"]["content"]
        assert [e["top_logprobs"] for e in plain] == [[], [], []]
        assert [e["logprob"] for e in plain] == [server.LOGPROBS[i][i] for i in range(3)]
        assert chat(w.url, max_tokens=3)["choices"][0]["logprobs"] is None

        events = stream_all(w.url + "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0,
            "logprobs": True, "top_logprobs": 2, "stream": True})
    chunks = content_chunks(events)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:]
    assert len(tokens) == 6
    for chunk in tokens:
        (entry,) = chunk["choices"][0]["logprobs"]["content"]
        assert entry["token"] == chunk["choices"][0]["delta"]["content"]
        assert_chat_entry(entry, 2, greedy=True)


def test_completion_logprobs_have_the_legacy_shape_streaming_or_not() -> None:
    with worker() as w:
        answer = complete(w.url, max_tokens=10, temperature=0, logprobs=3)
        (choice,) = answer["choices"]
        logprobs = choice["logprobs"]
        assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        assert logprobs["tokens"] == GREEDY[:10] and "".join(logprobs["tokens"]) == choice["text"]
        assert all(lp <= 0 for lp in logprobs["token_logprobs"])
        assert logprobs["text_offset"] == [sum(len(t) for t in GREEDY[:i]) for i in range(10)]
        for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"],
                                       strict=True):
            assert len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True)
            assert next(iter(top)) == token and top[token] == logprob  # greedy: the chosen is the likeliest

        sampled = complete(w.url, max_tokens=10, temperature=1.0, logprobs=0)["choices"][0]["logprobs"]
        assert sampled["top_logprobs"] == [{}] * 10 and "".join(sampled["tokens"]).split()
        assert complete(w.url, max_tokens=2)["choices"][0]["logprobs"] is None

        # With a stop string: a logprob for every token generated (vLLM's count), the text cut before it.
        stopped = complete(w.url, max_tokens=64, temperature=0, logprobs=1, stop=["sails on"])
        assert stopped["choices"][0]["text"] == " the fleet "
        assert stopped["choices"][0]["logprobs"]["tokens"] == GREEDY[:4] == GREEDY[:stopped["usage"]["completion_tokens"]]

        chunks = content_chunks(stream_all(w.url + "/v1/completions", {
            "model": MODEL, "prompt": "hi", "max_tokens": 5, "temperature": 0, "logprobs": 2, "stream": True}))
    assert len(chunks) == 5
    offsets = []
    for chunk in chunks:
        c = chunk["choices"][0]
        assert c["logprobs"]["tokens"] == [c["text"]] and len(c["logprobs"]["top_logprobs"][0]) == 2
        offsets += c["logprobs"]["text_offset"]
    assert offsets == [sum(len(t) for t in GREEDY[:i]) for i in range(5)]


def test_while_text_is_held_for_a_stop_string_logprobs_still_come_one_token_a_chunk() -> None:
    with worker() as w:
        chunks = content_chunks(stream_all(w.url + "/v1/completions", {
            "model": MODEL, "prompt": "hi", "max_tokens": 64, "temperature": 0, "logprobs": 1,
            "stop": ["fleet sails on a"], "stream": True}))
    assert [c["choices"][0]["logprobs"]["tokens"] for c in chunks] == [[t] for t in GREEDY[:5]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == " the "
