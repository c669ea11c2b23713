"""The Profile format: it holds the Dynamo calibration files, survives JSON, rejects nonsense by name,
and a profile generated from the performance model says what the model says at its points."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

from fleetpilot import perfmodel
from fleetpilot.api import profile as profiles
from fleetpilot.planner import capacity as capacities

CALIBRATION = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "calibration"
PREFILL_CSV = CALIBRATION / "h200_llama31_8b_fp8_vllm_prefill.csv"
DECODE_CSV = CALIBRATION / "h200_llama31_8b_fp8_vllm_decode.csv"
needs_data = pytest.mark.skipif(not CALIBRATION.is_dir(), reason=f"no calibration data at {CALIBRATION}")

README_KV_CAPACITY = 945_029


def dynamo_profile(**overrides: Any) -> profiles.Profile:
    kwargs: dict[str, Any] = {"model": "llama-3.1-8b", "engine": "vllm", "gpu": "h200-sxm"} | overrides
    return profiles.from_dynamo_csv(PREFILL_CSV, DECODE_CSV, **kwargs)


def valid() -> dict[str, Any]:
    """A minimal valid profile as JSON-shaped data, for the rejection tests to spoil one field of."""
    return {
        "model": "m",
        "engine": "vllm",
        "gpu": "h200-sxm",
        "kv_capacity_tokens": 100_000,
        "prefill": [
            {"isl": 1000, "ttft_ms": 50.0, "tokens_per_s_per_gpu": 20_000.0},
            {"isl": 2000, "ttft_ms": 90.0, "tokens_per_s_per_gpu": 22_222.0},
        ],
        "decode": [
            {"context_length": 1000, "concurrency": 1, "itl_ms": 5.0, "tokens_per_s_per_gpu": 200.0},
            {"context_length": 1000, "concurrency": 10, "itl_ms": 10.0, "tokens_per_s_per_gpu": 1000.0},
        ],
    }


# -- the Dynamo calibration files ---------------------------------------------------------------------


@needs_data
def test_dynamo_csvs_load_every_point() -> None:
    profile = dynamo_profile()
    assert len(profile.prefill) == 17
    assert len(profile.decode) == 41
    assert sorted(profile.decode_rows()) == [350, 2997, 5644, 8291, 10938, 13585]
    first = profile.prefill[0]
    assert (first.isl, first.ttft_ms, first.tokens_per_s_per_gpu) == (100, 19.525, 5121.584)
    top = profile.decode_rows()[350][-1]
    assert (top.concurrency, top.itl_ms, top.tokens_per_s_per_gpu, top.kv_usage) == (1573.0, 42.579, 18968.9459, 0.5826)
    assert profile.tensor_parallel == profile.gpus_per_replica == 1
    assert "h200_llama31_8b_fp8_vllm_prefill.csv" in profile.source


@needs_data
def test_dynamo_kv_capacity_is_derived_from_kv_usage_within_rounding() -> None:
    """The files round kv_usage to 4 digits; the median of concurrency × context / kv_usage lands
    within 0.01 % of the README's 945,029 tokens. An explicit value wins."""
    derived = dynamo_profile().kv_capacity_tokens
    assert abs(derived / README_KV_CAPACITY - 1) < 1e-4
    assert dynamo_profile(kv_capacity_tokens=README_KV_CAPACITY).kv_capacity_tokens == README_KV_CAPACITY


@needs_data
def test_dynamo_profile_round_trips_through_json() -> None:
    profile = dynamo_profile(kv_capacity_tokens=README_KV_CAPACITY)
    text = profile.model_dump_json()
    again = profiles.Profile.model_validate_json(text)
    assert again == profile
    assert again.model_dump_json() == text
    # What a ConfigMap holds is plain JSON with the CSV's own words.
    data = json.loads(text)
    assert data["kv_capacity_tokens"] == README_KV_CAPACITY
    assert set(data["prefill"][0]) == {"isl", "ttft_ms", "tokens_per_s_per_gpu"}


def test_points_in_any_order_are_sorted() -> None:
    data = valid()
    data["prefill"].reverse()
    data["decode"].reverse()
    profile = profiles.Profile.model_validate(data)
    assert [p.isl for p in profile.prefill] == [1000, 2000]
    assert [p.concurrency for p in profile.decode] == [1.0, 10.0]


# -- rejected with the field named -------------------------------------------------------------------------


def spoil(path: str, value: Any) -> dict[str, Any]:
    """`valid()` with one field (dotted path, list indices as numbers) replaced."""
    data = valid()
    *parents, last = path.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (spoil("prefill", valid()["prefill"][:1]), "prefill"),
        (spoil("prefill.1.ttft_ms", 0.0), "prefill.1.ttft_ms"),
        (spoil("prefill.0.tokens_per_s_per_gpu", -5.0), "prefill.0.tokens_per_s_per_gpu"),
        (spoil("prefill.1.isl", 1000), "prefill"),
        (spoil("decode.1.itl_ms", -1.0), "decode.1.itl_ms"),
        (spoil("decode.1.concurrency", 1), "decode"),
        (spoil("decode.1.context_length", 2000), "decode"),
        (spoil("decode.0.kv_usage", 1.5), "decode.0.kv_usage"),
        (spoil("kv_capacity_tokens", 0), "kv_capacity_tokens"),
        (spoil("tensor_parallel", 0), "tensor_parallel"),
        (spoil("gpus_per_replica", 3) | {"tensor_parallel": 2}, "gpus_per_replica"),
        (spoil("model", ""), "model"),
        (valid() | {"ttft": 5}, "ttft"),
    ],
    ids=[
        "one-prefill-point",
        "zero-ttft",
        "negative-throughput",
        "duplicate-isl",
        "negative-itl",
        "duplicate-decode-point",
        "decode-row-with-one-point",
        "kv-usage-over-1",
        "no-kv-capacity",
        "zero-tp",
        "gpus-not-a-multiple-of-tp",
        "empty-model",
        "unknown-field",
    ],
)
def test_invalid_profiles_are_rejected_naming_the_field(data: dict[str, Any], named: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        profiles.Profile.model_validate(data)
    assert named in str(caught.value)


def test_rejection_messages_say_what_is_wrong() -> None:
    with pytest.raises(pydantic.ValidationError, match="two points have isl 1000"):
        profiles.Profile.model_validate(spoil("prefill.1.isl", 1000))
    with pytest.raises(pydantic.ValidationError, match=r"context_length \[1000, 2000\] has fewer than 2"):
        profiles.Profile.model_validate(spoil("decode.1.context_length", 2000))
    with pytest.raises(pydantic.ValidationError, match="multiple of tensor_parallel"):
        profiles.Profile.model_validate(valid() | {"tensor_parallel": 2, "gpus_per_replica": 3})


# -- from the performance model ----------------------------------------------------------------------------

ISLS = [128, 1024, 4096, 16384]
CONTEXTS = [512, 4096, 32768]
CONCURRENCIES = [1, 8, 64, 256, 1024]


@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_profile_from_the_performance_model_matches_it_at_every_point(tensor_parallel: int) -> None:
    model = perfmodel.PerformanceModel(
        perfmodel.MODELS["llama-3.1-8b"], perfmodel.GPUS["h100-sxm"], tensor_parallel=tensor_parallel
    )
    profile = profiles.from_performance_model(model, isls=ISLS, contexts=CONTEXTS, concurrencies=CONCURRENCIES)
    kv = model.kv_capacity_tokens()
    assert (profile.model, profile.engine, profile.gpu) == ("llama-3.1-8b", "vllm", "h100-sxm")
    assert profile.tensor_parallel == profile.gpus_per_replica == tensor_parallel
    assert profile.kv_capacity_tokens == kv
    for prefill in profile.prefill:
        assert prefill.ttft_ms == pytest.approx(model.ttft(prefill.isl) * 1e3)
        # per GPU: isl / ttft shared by the replica's GPUs, as the Dynamo column is defined
        assert prefill.tokens_per_s_per_gpu * tensor_parallel * prefill.ttft_ms / 1e3 == pytest.approx(prefill.isl)
    for point in profile.decode:
        c, context = int(point.concurrency), point.context_length
        assert c * context <= kv
        assert point.itl_ms == pytest.approx(model.itl(c, context) * 1e3)
    # Only points that fit the KV cache are kept, exactly those.
    expected = {(k, float(c)) for k in CONTEXTS for c in CONCURRENCIES if c * k <= kv}
    rows = {k for k, _ in expected if sum(1 for kk, _ in expected if kk == k) >= 2}
    assert {(p.context_length, p.concurrency) for p in profile.decode} == {e for e in expected if e[0] in rows}
    # and the capacity model reads the model's own numbers back at the grid points
    capacity = capacities.CapacityModel(profile)
    for point in profile.decode:
        read = capacity.itl_s(point.concurrency, point.context_length)
        assert not read.extrapolated
        assert read.value == pytest.approx(model.itl(int(point.concurrency), point.context_length))
    for isl in ISLS:
        assert capacity.lone_ttft_s(isl).value == pytest.approx(model.ttft(isl))
        assert capacity.prefill_service_s(isl).value == pytest.approx(model.ttft(isl))


def test_profile_from_the_performance_model_counts_only_running_sequences_in_throughput() -> None:
    """Beyond the engine's batch cap (max_num_seqs = 900 for vLLM) the rest wait: the throughput a
    measured engine reports is running / ITL, not offered / ITL."""
    model = perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-8b"], perfmodel.GPUS["h200-sxm"])
    profile = profiles.from_performance_model(model, isls=[100, 1000], contexts=[100], concurrencies=[512, 2048])
    low, high = profile.decode
    assert low.tokens_per_s_per_gpu == pytest.approx(512 / (low.itl_ms / 1e3))
    assert high.tokens_per_s_per_gpu == pytest.approx(900 / (high.itl_ms / 1e3))


def test_profile_from_the_performance_model_round_trips_and_names_its_source() -> None:
    model = perfmodel.PerformanceModel(
        perfmodel.MODELS["qwen3-32b"], perfmodel.GPUS["h200-sxm"], calibration=perfmodel.SGLANG_HOPPER
    )
    profile = profiles.from_performance_model(model, isls=ISLS, contexts=CONTEXTS, concurrencies=CONCURRENCIES)
    assert profile.engine == "sglang"
    assert "performance model" in profile.source
    assert profiles.Profile.model_validate_json(profile.model_dump_json()) == profile
