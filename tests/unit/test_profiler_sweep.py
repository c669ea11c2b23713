"""The profiler's pure part: decode windows, readings into Profile points, the KV capacity."""

from __future__ import annotations

import pytest

from fleetpilot.api import profile as profiles
from fleetpilot.profiler import sweep


def stream(first: float, gap: float, tokens: int) -> sweep.Stream:
    return sweep.Stream(tuple(first + i * gap for i in range(tokens)))


def test_the_decode_window_is_where_every_stream_decodes() -> None:
    """Three streams whose first tokens are staggered by prefill: the window opens at the last first token and
    closes at the first last token, and the ITL inside it is the steps' length, not the stagger."""
    streams = [stream(0.1, 0.01, 50), stream(0.2, 0.01, 50), stream(0.3, 0.01, 50)]
    window = sweep.decode_window(streams)
    assert window is not None
    assert window.start == pytest.approx(0.3) and window.end == pytest.approx(0.1 + 49 * 0.01)
    assert sweep.window_itl(streams, window) == pytest.approx(0.01)
    assert window.tokens / window.seconds == pytest.approx(3 / 0.01, rel=0.1)
    # The send offsets shift each stream's clock: sent 0.1 s later, the second stream starts with the first.
    shifted = sweep.decode_window([stream(0.1, 0.01, 50), stream(0.0, 0.01, 50)], offsets=[0.0, 0.1])
    assert shifted is not None and shifted.start == pytest.approx(0.1)


def test_a_window_too_short_is_no_measurement() -> None:
    staggered = [stream(0.0, 0.01, 10), stream(0.05, 0.01, 10)]
    window = sweep.decode_window(staggered)
    assert window is not None and not sweep.enough(window, 2)
    assert sweep.decode_window([stream(0.0, 0.01, 5), stream(1.0, 0.01, 5)]) is None
    assert sweep.decode_window([sweep.Stream((0.1,))]) is None


def test_the_output_grows_with_the_prefill_stagger_but_leaves_room_for_a_prompt() -> None:
    assert sweep.decode_osl(osl=64, concurrency=1, lone_ttft_s=0.02, itl_guess_s=0.01, context=2048) == 64
    long = sweep.decode_osl(osl=64, concurrency=64, lone_ttft_s=0.05, itl_guess_s=0.01, context=8192)
    assert long == 64 * 5 + 2 * sweep.MIN_WINDOW_GAPS
    assert sweep.decode_osl(osl=64, concurrency=256, lone_ttft_s=0.2, itl_guess_s=0.01, context=512) == 512


def test_readings_become_profile_points_in_the_engines_own_time() -> None:
    """At --speedup 0.1 the endpoint runs ten times slower than the GPU it models: times × 0.1."""
    prefill = [sweep.PrefillSample(1000, 1, (0.21, 0.2, 0.5)), sweep.PrefillSample(4000, 1, (0.8, 0.8, 0.8)),
               sweep.PrefillSample(1000, 4, (0.6, 0.6, 0.6))]
    decode = [sweep.DecodeSample(1024, 1, 0.05, 20.0), sweep.DecodeSample(1024, 8, 0.06, 133.0),
              sweep.DecodeSample(4096, 1, 0.055, 18.0)]
    profile = sweep.build(model="m", engine="simulator", gpu="h200-sxm", tensor_parallel=2, gpus_per_replica=2,
                          kv_capacity_tokens=100_000, prefill=prefill, decode=decode, speedup=0.1, source="test")
    lone = {p.isl: p for p in profile.prefill}
    assert lone[1000].ttft_ms == pytest.approx(21.0)  # the median, × 0.1
    assert lone[1000].tokens_per_s_per_gpu == pytest.approx(1000 / 0.021 / 2)
    (batched,) = profile.prefill_batched
    assert batched.batch == 4 and batched.tokens_per_s_per_gpu == pytest.approx(4000 / 0.06 / 2)
    # The 4096 row had one concurrency: the Profile interpolates along concurrency, so it is left out.
    assert {p.context_length for p in profile.decode} == {1024}
    point = next(p for p in profile.decode if p.concurrency == 8)
    assert point.itl_ms == pytest.approx(6.0) and point.tokens_per_s_per_gpu == pytest.approx(133.0 / 0.1 / 2)
    assert profiles.Profile.model_validate_json(profile.model_dump_json()) == profile


def test_the_kv_capacity_comes_from_vllms_cache_info_or_its_usage() -> None:
    assert sweep.cache_config_tokens({"block_size": "16", "num_gpu_blocks": "59063"}) == 945_008
    assert sweep.cache_config_tokens({"block_size": "16"}) is None
    readings = [sweep.DecodeSample(1000, 100, 0.02, 1.0, kv_usage=0.1), sweep.DecodeSample(2000, 100, 0.02, 1.0,
                                                                                              kv_usage=0.2)]
    assert sweep.kv_capacity(readings) == 1_000_000
    assert sweep.kv_capacity([sweep.DecodeSample(1000, 1, 0.02, 1.0)]) is None
