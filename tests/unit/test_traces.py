"""Reading and shaping traces, and the prompts built from them (fleetpilot.traces, fleetpilot.replay.prompts).

The readers run on slices of the real files in ../shared/traces; the expected values were read from
those files independently (pandas and the JSON rows by eye), not from the readers.
"""

from __future__ import annotations

import collections
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from fleetpilot import traces
from fleetpilot.replay import prompts

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
AZURE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
SERVEGEN = TRACES / "servegen_alibaba" / "aggregate_rate_10min.csv"

needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no shared traces at {TRACES}")


def request(arrival: float, tokens: int = 100, hash_ids: tuple[int, ...] | None = None) -> traces.Request:
    return traces.Request(arrival_s=arrival, input_tokens=tokens, output_tokens=10, hash_ids=hash_ids)


def evenly(count: int, *, gap: float = 1.0) -> list[traces.Request]:
    """`count` requests one `gap` apart, each with its own prefix block."""
    return [request(i * gap, hash_ids=(i,)) for i in range(count)]


# -- readers on the real files ---------------------------------------------------------------------


@needs_traces
def test_azure_first_rows() -> None:
    got = traces.load(AZURE, max_rows=5)
    assert [(r.input_tokens, r.output_tokens) for r in got] == [
        (4808, 10),
        (3180, 8),
        (110, 27),
        (7433, 14),
        (34, 12),
    ]
    # 18:17:03.9799600, 04.0319600, 04.0781490, 04.1206440, 04.4249540: all 7 digits count
    assert [r.arrival_s for r in got] == pytest.approx([0.0, 0.052, 0.098189, 0.140684, 0.444994], abs=1e-9)
    assert all(r.hash_ids is None for r in got)


@needs_traces
def test_azure_whole_file() -> None:
    got = traces.load(AZURE)
    assert len(got) == 8819
    assert got[-1].arrival_s == pytest.approx(3435.948056, abs=1e-6)
    assert sum(r.input_tokens for r in got) == 18_059_974
    assert sum(r.output_tokens for r in got) == 245_896
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(got))


@needs_traces
def test_mooncake_first_rows() -> None:
    got = traces.load(MOONCAKE, max_rows=100)
    assert len(got) == 100
    assert (got[0].input_tokens, got[0].output_tokens) == (6758, 500)
    assert got[0].hash_ids == tuple(range(14))
    assert got[1].hash_ids == (0, *range(14, 28))
    assert sum(r.input_tokens for r in got) == 1_524_742
    assert sum(r.output_tokens for r in got) == 36_758
    assert got[-1].arrival_s == pytest.approx(33.0)  # timestamps are in ms
    # one 512-token block per hash id, the last one partial
    assert all(r.hash_ids is not None and len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in got)


@needs_traces
def test_mooncake_whole_file() -> None:
    got = traces.load(MOONCAKE)
    assert len(got) == 12_031
    assert got[-1].arrival_s == pytest.approx(3536.999)


@needs_traces
def test_servegen_series() -> None:
    windows = traces.parse_servegen(SERVEGEN.read_text().splitlines())
    assert len(windows) == 2 * 2016
    assert windows[0] == traces.RateWindow(model="m-large", t_start_s=0.0, rate_rps=212.78, active_clients=43)
    assert {w.model for w in windows} == {"m-large", "m-mid"}


@needs_traces
@pytest.mark.parametrize(
    ("path", "expected"), [(AZURE, "azure"), (MOONCAKE, "mooncake"), (SERVEGEN, "servegen")]
)
def test_format_detected_from_the_file(path: Path, expected: str) -> None:
    with path.open() as file:
        assert traces.detect_format(path.name, file.readline()) == expected
    assert traces.file_format(path) == expected


def test_a_rate_series_is_read_as_stated_one_model_in_time_order(tmp_path: Path) -> None:
    series = tmp_path / "rates.csv"
    # A BOM, rows out of order and two models: what the file says, for one model, by start time.
    series.write_text("\ufeffmodel,t_start_s,total_rate_rps,active_clients\n"
                      "a,600,2.5,1\nb,0,9,1\na,0,1.5,2\n", encoding="utf-8")
    assert traces.file_format(series) == "servegen"
    assert traces.load_rate_series(series, model="a") == [
        traces.RateWindow(model="a", t_start_s=0.0, rate_rps=1.5, active_clients=2),
        traces.RateWindow(model="a", t_start_s=600.0, rate_rps=2.5, active_clients=1),
    ]
    assert traces.load_rate_series(series, model="c") == []


def test_format_detection_and_override() -> None:
    assert traces.detect_format("x.txt", '{"timestamp": 0}') == "mooncake"
    assert traces.detect_format("x.csv", "model,t_start_s,total_rate_rps,active_clients") == "servegen"
    with pytest.raises(traces.TraceError, match="--format"):
        traces.detect_format("x.csv", "a,b,c")


@needs_traces
def test_wrong_format_is_refused() -> None:
    with pytest.raises(traces.TraceError, match="Azure"):
        traces.load(SERVEGEN, trace_format="azure", max_rows=3)


def test_azure_fraction_and_order() -> None:
    lines = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:15:47.0000001,3,4",
        "2023-11-16 18:15:46.6805900,1,2",
        "",
    ]
    got = traces.parse_azure(lines)
    assert [(r.input_tokens, r.arrival_s) for r in got] == [(1, 0.0), (3, pytest.approx(0.3194101, abs=1e-9))]


# -- transformations -------------------------------------------------------------------------------


def test_window_keeps_trace_time_and_shifts_to_its_start() -> None:
    got = traces.window(evenly(10), start_s=2.5, duration_s=4)
    assert [r.arrival_s for r in got] == [0.5, 1.5, 2.5, 3.5]  # 3, 4, 5, 6 from 2.5; 7 is outside
    assert [r.hash_ids for r in got] == [(3,), (4,), (5,), (6,)]


def test_time_scale_divides_arrivals() -> None:
    got = traces.time_scale(evenly(5), 4.0)
    assert [r.arrival_s for r in got] == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="time-scale"):
        traces.time_scale(evenly(5), 0)


def test_thinning_keeps_about_the_fraction_and_repeats() -> None:
    requests = evenly(10_000)
    kept = traces.rate_scale(requests, 0.3, seed=7)
    assert abs(len(kept) - 3000) < 150  # 3 sigma is about 138
    assert kept == traces.rate_scale(requests, 0.3, seed=7)
    assert kept != traces.rate_scale(requests, 0.3, seed=8)
    assert set(kept) <= set(requests)  # thinning drops, never moves


def test_replication_scales_the_rate_with_jitter_and_own_prefixes() -> None:
    requests = evenly(2000)
    scaled = traces.rate_scale(requests, 2.5, seed=1)
    assert abs(len(scaled) - 5000) < 150
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(scaled))
    assert scaled[-1].arrival_s < requests[-1].arrival_s + 1.0  # jitter stays within one mean gap
    copies = [r for r in scaled if r.hash_ids is not None and r.hash_ids[0] >= 2000]
    assert len(copies) == len(scaled) - 2000
    assert {r.hash_ids[0] % 2000 for r in copies if r.hash_ids} <= set(range(2000))


def bursts(count: int, *, size: int, every_s: float) -> list[traces.Request]:
    """`count` bursts of `size` requests, all of a burst at one instant, `every_s` apart."""
    return [request(b * every_s, hash_ids=(b * size + i,)) for b in range(count) for i in range(size)]


def busiest_second(requests: list[traces.Request]) -> int:
    return max(collections.Counter(int(r.arrival_s) for r in requests).values())


def test_tenant_copies_keep_their_bursts_but_not_each_others() -> None:
    """×8 as copies repeats each burst eight times over at once; as tenants each copy keeps the trace's
    bursts whole at its own shift, so the copies' bursts fall apart, and the time line holds to
    within the shift."""
    trace = bursts(100, size=10, every_s=100.0)  # 1,000 requests over 9,900 s
    together = traces.rate_scale(trace, 8, seed=3, jitter_s=0.0)
    tenants = traces.rate_scale(trace, 8, seed=3, tenant_shift_s=60.0)
    assert len(together) == len(tenants) == 8000
    assert busiest_second(together) == 80
    assert busiest_second(tenants) <= 30  # eight shifts within 60 s: a few may share a second
    first, last = trace[0].arrival_s, trace[-1].arrival_s
    assert all(first <= r.arrival_s <= last for r in tenants)  # wrapped, not run over
    phases = set()
    for copy in range(8):  # copy k's prefix ids are offset by k × 1,000
        own = [r.arrival_s for r in tenants if r.hash_ids and r.hash_ids[0] // 1000 == copy]
        at_once = collections.Counter(own)
        assert len(own) == 1000 and set(at_once.values()) == {10}  # every burst whole
        phase = {round(t % 100.0, 6) for t in at_once}
        assert len(phase) == 1  # still 100 s apart: one shift for the whole copy
        phases |= phase
    assert len(phases) == 8  # each copy its own shift
    per_1000_s = collections.Counter(int(r.arrival_s // 1000) for r in tenants)
    assert all(abs(per_1000_s[k] - 800) <= 80 for k in range(9))  # a shift moves at most one burst a copy
    with pytest.raises(ValueError, match="tenant shift"):
        traces.rate_scale(trace, 2, tenant_shift_s=-1.0)


def test_prepare_orders_the_steps_and_caps() -> None:
    shape = traces.Shape(start_s=100, duration_s=100, time_factor=10, max_requests=5)
    got = traces.prepare(evenly(1000), shape)
    assert [r.arrival_s for r in got] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert got[0].hash_ids == (100,)
    assert traces.prepare(evenly(10), traces.Shape()) == evenly(10)


@needs_traces
def test_load_applies_the_shape() -> None:
    got = traces.load(AZURE, shape=traces.Shape(start_s=600, duration_s=60, time_factor=2, max_requests=50))
    assert len(got) == 50
    assert all(0 <= r.arrival_s < 30 for r in got)


# -- ServeGen synthesis ----------------------------------------------------------------------------


@needs_traces
def test_servegen_synthesis_matches_the_scaled_rate() -> None:
    windows = traces.parse_servegen(SERVEGEN.read_text().splitlines())
    hours = 6
    shape = traces.Shape(duration_s=hours * 3600, rate_factor=0.01, seed=3)
    got = traces.synthesise(windows, synthesis=traces.Synthesis(model="m-large"), shape=shape)
    large = [w for w in windows if w.model == "m-large"][: hours * 6]
    expected = sum(w.rate_rps for w in large) * 600 * 0.01  # 45,332 requests
    assert abs(len(got) - expected) / expected < 0.02
    assert all(0 <= r.arrival_s < hours * 3600 for r in got)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(got))
    mean_input = sum(r.input_tokens for r in got) / len(got)
    mean_output = sum(r.output_tokens for r in got) / len(got)
    assert abs(mean_input - 2048) / 2048 < 0.05
    assert abs(mean_output - 256) / 256 < 0.05
    assert got == traces.synthesise(windows, synthesis=traces.Synthesis(model="m-large"), shape=shape)


def test_synthesis_window_inside_the_series() -> None:
    windows = [traces.RateWindow("m", 600.0 * i, rate, 1) for i, rate in enumerate([10.0, 100.0, 10.0])]
    shape = traces.Shape(start_s=900, duration_s=600, seed=0)  # the second half of 100 rps, then 10 rps
    got = traces.synthesise(windows, synthesis=traces.Synthesis(model="m"), shape=shape)
    first_half = [r for r in got if r.arrival_s < 300]
    assert abs(len(first_half) - 30_000) < 700
    assert abs(len(got) - len(first_half) - 3000) < 250
    capped = traces.synthesise(
        windows, synthesis=traces.Synthesis(model="m"), shape=traces.Shape(max_requests=7)
    )
    assert len(capped) == 7


def test_synthesis_refuses_an_unbounded_flood_and_unknown_models() -> None:
    windows = [traces.RateWindow("m", 600.0 * i, 2000.0, 1) for i in range(2016)]
    with pytest.raises(ValueError, match="--duration"):
        traces.synthesise(windows, synthesis=traces.Synthesis(model="m"), shape=traces.Shape())
    with pytest.raises(traces.TraceError, match="m-large"):
        traces.synthesise(windows, synthesis=traces.Synthesis(model="m-large"), shape=traces.Shape())


@pytest.mark.parametrize("kind", traces.LENGTH_KINDS)
def test_length_distributions_have_the_asked_mean(kind: traces.LengthKind) -> None:
    draws = traces.draw_lengths(
        np.random.default_rng(0), traces.LengthDistribution(mean=500, kind=kind), 50_000
    )
    assert abs(float(draws.mean()) - 500) / 500 < 0.03
    assert int(draws.min()) >= 1


# -- prompts ---------------------------------------------------------------------------------------


def test_shared_leading_hash_ids_share_leading_text() -> None:
    a = prompts.build_prompt(request(0, tokens=2000, hash_ids=(7, 8, 9, 10)), salt=0)
    b = prompts.build_prompt(request(0, tokens=1800, hash_ids=(7, 8, 11, 12)), salt=1)
    words_a, words_b = a.split(" "), b.split(" ")
    assert words_a[:1024] == words_b[:1024]  # blocks 7 and 8
    assert words_a[1024:1536] != words_b[1024:1536]  # 9 against 11
    assert a[: len(" ".join(words_a[:1024]))] == b[: len(" ".join(words_b[:1024]))]


@needs_traces
def test_real_mooncake_prefixes_are_shared_as_recorded() -> None:
    first, second = traces.load(MOONCAKE, max_rows=2)  # both open with block 0, then differ
    a = prompts.build_prompt(first, salt=0).split(" ")
    b = prompts.build_prompt(second, salt=1).split(" ")
    assert a[:512] == b[:512]
    assert a[512:1024] != b[512:1024]


def test_prompt_length_follows_input_tokens() -> None:
    for tokens in (1, 7, 511, 512, 513, 3000):
        assert len(prompts.build_prompt(request(0, tokens=tokens), salt=tokens).split(" ")) == tokens
    short = prompts.build_prompt(request(0, tokens=600, hash_ids=(1, 2)), salt=0)
    long = prompts.build_prompt(request(0, tokens=1500, hash_ids=(1, 2)), salt=0)
    assert long.startswith(short)  # a shorter request on the same blocks is a prefix of a longer one


def test_prompts_without_hash_ids_are_unique_and_deterministic() -> None:
    one = prompts.build_prompt(request(0, tokens=64), salt=1)
    assert one == prompts.build_prompt(request(5, tokens=64), salt=1)
    assert one.split(" ")[:8] != prompts.build_prompt(request(0, tokens=64), salt=2).split(" ")[:8]
    assert one != prompts.build_prompt(request(0, tokens=64), salt=1, seed=9)
    assert set(one.split(" ")) <= set(prompts.VOCABULARY)
