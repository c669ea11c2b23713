"""The recommender: layouts sized as the planner sizes them, ranked by GPUs, each loser with its reason."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from fleetpilot import cli, perfmodel
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import recommend, sizing

H100, H200 = perfmodel.GPUS["h100-sxm"], perfmodel.GPUS["h200-sxm"]
SLA = api.SlaTarget(ttft_ms=500, itl_ms=50, percentile=90)
LOAD = sizing.Load(rate_rps=20, isl=2048, osl=256)


def result_for(model: str, gpu: perfmodel.GpuSpec, load: sizing.Load = LOAD, sla: api.SlaTarget = SLA,
               **kwargs: object) -> recommend.Recommendation:
    candidates, excluded = recommend.modelled_candidates(perfmodel.MODELS[model], gpu, isl=load.isl, osl=load.osl)
    return recommend.recommend(candidates, load, sla, excluded=excluded, **kwargs)  # type: ignore[arg-type]


def test_disaggregated_layouts_are_what_the_planner_sizes() -> None:
    """The emitted replicas start the graph where the planner's own sizing keeps it."""
    candidates, _ = recommend.modelled_candidates(perfmodel.MODELS["llama-3.1-8b"], H200, isl=LOAD.isl, osl=LOAD.osl)
    result = recommend.recommend(candidates, LOAD, SLA, modes=("disaggregated",))
    for entry in result.ranked:
        split = entry.layout.pools["prefill"].parallelism
        capacity = next(c.capacity for c in candidates if c.parallelism == split)
        desired = sizing.size(LOAD, capacity, SLA)
        assert entry.layout.pools["prefill"].replicas == desired.prefill
        assert entry.layout.pools["decode"].replicas == desired.decode
        assert entry.layout.gpus == split.gpus * (desired.prefill + desired.decode)


def test_ranking_is_by_gpus_and_every_loser_says_why() -> None:
    result = result_for("llama-3.1-70b", H100)
    feasible = [e.layout for e in result.ranked if e.layout.meets_sla]
    assert [layout.gpus for layout in feasible] == sorted(layout.gpus for layout in feasible)
    assert result.best is feasible[0]
    assert result.ranked[0].loses == ""
    assert all(entry.loses for entry in result.ranked[1:])
    worse = next(e for e in result.ranked if e.layout.meets_sla and e.layout.gpus > feasible[0].gpus)
    more = worse.layout.gpus - feasible[0].gpus
    assert f"more GPU{'s' if more > 1 else ''} ({worse.layout.gpus} vs {feasible[0].gpus})" in worse.loses


def test_a_model_too_big_for_one_gpu_leaves_that_parallelism_out_with_the_reason() -> None:
    result = result_for("llama-3.1-70b-bf16", H100)
    assert any(line.startswith("TP1: does not fit") for line in result.excluded), result.excluded
    assert all(entry.layout.pools[next(iter(entry.layout.pools))].parallelism != recommend.Parallelism(1)
               for entry in result.ranked)


def test_an_itl_target_one_gpu_cannot_reach_needs_tensor_parallelism() -> None:
    """70B on one H200 steps in ~25 ms even alone: a 20 ms ITL target needs TP > 1."""
    tight = api.SlaTarget(ttft_ms=2000, itl_ms=20, percentile=90)
    result = result_for("llama-3.1-70b", H200, sla=tight)
    tp1 = [e for e in result.ranked if all(p.parallelism == recommend.Parallelism(1) for p in e.layout.pools.values())]
    assert tp1 and not any(e.layout.meets_sla for e in tp1)
    assert all("cannot hold the SLA" in e.loses and ("ITL" in e.loses or "TPOT" in e.loses) for e in tp1)
    assert result.best is not None and max(p.parallelism.tensor for p in result.best.pools.values()) > 1


def test_more_load_never_needs_fewer_gpus() -> None:
    costs = [result_for("llama-3.1-8b", H100, sizing.Load(rate_rps=rate, isl=1024, osl=256)).best.gpus  # type: ignore[union-attr]
             for rate in (2, 10, 40, 160)]
    assert costs == sorted(costs) and costs[-1] > costs[0]


def test_mixed_parallelism_only_when_asked() -> None:
    uniform = result_for("llama-3.1-70b", H200, modes=("disaggregated",))
    assert not any(e.layout.mixed for e in uniform.ranked)
    mixed = result_for("llama-3.1-70b", H200, modes=("disaggregated",), mixed=True)
    assert any(e.layout.mixed for e in mixed.ranked)
    assert mixed.best is not None and uniform.best is not None and mixed.best.gpus <= uniform.best.gpus


def test_a_moe_model_streams_only_the_experts_its_tokens_route_to() -> None:
    """Qwen3-30B-A3B: 30.5B parameters, 3.3B active. A lone decode step reads a few of the experts'
    weights, a large batch nearly all of them, and its compute is that of the active parameters."""
    moe = perfmodel.MODELS["qwen3-30b-a3b"]
    assert moe.active_gemm_params == pytest.approx(3.3e9, rel=0.1)
    engine = perfmodel.PerformanceModel(moe, H100)
    dense_like = perfmodel.PerformanceModel(dataclasses.replace(moe, experts=0, experts_per_token=0, expert_params=0),
                                            H100)
    assert engine.decode_step_time(1, 1000) < 0.5 * dense_like.decode_step_time(1, 1000)
    assert engine.decode_step_time(512, 512_000) == pytest.approx(dense_like.decode_step_time(512, 512_000), rel=0.35)
    assert engine.prefill_time(4096) < 0.3 * dense_like.prefill_time(4096)


def test_emitted_manifests_carry_the_layout_and_the_profile_the_planner_reads() -> None:
    result = result_for("llama-3.1-70b", H100, modes=("disaggregated",))
    best = result.best
    assert best is not None
    split = best.pools["prefill"].parallelism
    profile = recommend.model_profile(perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-70b"], H100, split.tensor),
                                      isl=LOAD.isl, osl=LOAD.osl, engine="vllm")
    config_map, graph = recommend.manifests(best, name="llama-70b", model="nvidia/Llama-3.1-70B-Instruct-FP8",
                                            served_name="llama-70b", framework="vllm", image="vllm/vllm-openai:v0.11.0",
                                            sla=SLA, profile=profile)
    parsed = api.DynamoGraph.model_validate(graph)
    assert parsed.spec.components.prefill is not None and parsed.spec.components.decode is not None
    assert parsed.spec.components.decode.replicas == best.pools["decode"].replicas
    assert parsed.spec.components.decode.gpus == split.gpus
    assert parsed.spec.planner.profile_ref is not None and parsed.spec.planner.profile_ref.config_map == "llama-70b-profile"
    assert config_map["metadata"]["name"] == "llama-70b-profile"
    assert profiles.Profile.model_validate_json(config_map["data"]["profile.json"]) == profile


def test_a_mixed_layout_is_emitted_without_a_planner() -> None:
    mixed = recommend.Layout("disaggregated", {"prefill": recommend.Pool(recommend.Parallelism(1), 2),
                                               "decode": recommend.Pool(recommend.Parallelism(2), 1)},
                             meets_sla=True, sizing="")
    (graph,) = recommend.manifests(mixed, name="g", model="m", served_name="m", framework="vllm", image="i", sla=SLA,
                                   profile=None)
    assert graph["spec"]["planner"] == {"mode": "off"}


def test_the_command_prints_the_ranking_and_emits_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "graph.yaml"
    code = cli.main(["recommend", "--model", "nvidia/Llama-3.1-8B-Instruct-FP8", "--gpu", "H100",
                     "--sla", "ttft=500ms,itl=50ms,p=90", "--load", "20,1024,256", "--emit", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "best" in printed and "layouts in" in printed
    documents = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in documents] == ["ConfigMap", "DynamoGraph"]
    assert documents[1]["spec"]["model"]["name"] == "nvidia/Llama-3.1-8B-Instruct-FP8"
    assert documents[1]["spec"]["engine"]["image"]

    assert cli.main(["recommend", "--model", "llama-3.1-8b", "--gpu", "h200", "--sla", "ttft=500ms,itl=50ms",
                     "--load", "5", "--json", "--top", "2"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert len(ranked) == 2 and ranked[0]["meetsSla"] and ranked[0]["gpus"] <= ranked[1]["gpus"]


def test_the_command_refuses_bad_flags_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    for flags, words in ((["--model", "gpt-5"], "--model 'gpt-5'"), (["--gpu", "A100"], "--gpu 'A100'"),
                         (["--load", "0"], "--load '0'")):
        argv = ["recommend", "--model", "llama-3.1-8b", "--gpu", "H100", "--sla", "ttft=500ms,itl=50ms", "--load", "5"]
        for flag, value in zip(flags[::2], flags[1::2], strict=True):
            argv[argv.index(flag) + 1] = value
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert words in capsys.readouterr().err
