"""The recommender: from a model, a GPU kind, an SLA and a load to the layouts that hold the SLA cheapest.

Where it sits: the planner's pure layer, beside `sizing`, which it calls. `fleetpilot recommend` (the
command, `planner/cli.py`) reads the flags, calls `recommend` and prints or emits what it returns; the
benchmark `benchmarks/recommend_validation.py` checks the ranking against measured sweeps.

The search: every parallelism that fits one node (tensor × pipeline GPUs, the model's weights and one
request's KV within the GPUs' memory), each with a capacity profile (the performance model's for that
parallelism, or a measured one), sized at the load by the planner's own sizing (`sizing.size` for a
prefill and a decode pool, `sizing.size_aggregated` for one aggregated pool) with no corrections: the
replicas the planner itself would decide on its first interval. So the graph the recommendation emits
starts at the size the planner keeps it at. Layouts are ranked by GPUs; each one below the first says
why it loses. Disaggregated layouts run one parallelism for both pools unless `mixed` is asked for:
the live planner sizes a graph from one profile (`spec.planner.profileRef`), so a graph whose pools
differ could not be planned from it.

What the sizing does not know, the recommendation does not either: pipeline stages add latency and no
throughput in the performance model (engines that interleave micro-batches get more), aggregated
workers are sized as time-sharing prefill and decode (chunked prefill does better), and a mixture of
experts is modelled from its active parameters without any calibration row (docs/perfmodel.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from fleetpilot import perfmodel
from fleetpilot.api import contract
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import sizing

Mode = Literal["aggregated", "disaggregated"]
MODES: tuple[Mode, ...] = ("aggregated", "disaggregated")
TENSOR_SIZES = (1, 2, 4, 8)
PIPELINE_SIZES = (1, 2, 4, 8)
GPUS_PER_NODE = 8  # one node: a component spanning nodes (multinode) is not in the API yet
# The grid a modelled profile is evaluated on (plus the load's own ISL and context).
PROFILE_ISLS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
PROFILE_CONTEXTS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
PROFILE_CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


@dataclasses.dataclass(frozen=True, order=True)
class Parallelism:
    """How one replica splits the model: tensor × pipeline GPUs."""

    tensor: int = 1
    pipeline: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline

    def words(self) -> str:
        return f"TP{self.tensor}" + (f"×PP{self.pipeline}" if self.pipeline > 1 else "")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One parallelism and what a replica of it sustains: its capacity profile, and the performance model
    behind it when the profile was modelled (None for a measured profile)."""

    parallelism: Parallelism
    capacity: capacities.CapacityModel
    engine: perfmodel.PerformanceModel | None = None


@dataclasses.dataclass(frozen=True)
class Pool:
    """One worker pool of a layout: its parallelism and replicas."""

    parallelism: Parallelism
    replicas: int

    @property
    def gpus(self) -> int:
        return self.parallelism.gpus * self.replicas

    def words(self) -> str:
        return f"{self.replicas}× {self.parallelism.words()}"


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to serve the load: aggregated, or prefill + decode pools, with the replicas the SLA needs."""

    mode: Mode
    pools: Mapping[sizing.Pool, Pool]
    meets_sla: bool
    sizing: str  # the planner's reason for the replicas (sizing.Desired.reason), or why the SLA is out of reach

    @property
    def gpus(self) -> int:
        return sum(pool.gpus for pool in self.pools.values())

    @property
    def replicas(self) -> int:
        return sum(pool.replicas for pool in self.pools.values())

    @property
    def mixed(self) -> bool:
        return len({pool.parallelism for pool in self.pools.values()}) > 1

    def words(self) -> str:
        """`aggregated 3× TP2`, or `prefill 2× TP1 + decode 1× TP2`."""
        return " + ".join(f"{name} {pool.words()}" for name, pool in self.pools.items())

    def sort_key(self) -> tuple[Any, ...]:
        """Cheapest first; at equal GPUs fewer pods, then the simpler mode, then smaller replicas."""
        largest = max(pool.parallelism.gpus for pool in self.pools.values())
        return (not self.meets_sla, self.gpus, self.replicas, MODES.index(self.mode), largest, self.words())


@dataclasses.dataclass(frozen=True)
class Ranked:
    """A layout in the ranking, with why it is not the first (empty for the first)."""

    layout: Layout
    loses: str


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """The ranking (layouts that meet the SLA first, by GPUs) and the parallelisms left out, with why."""

    load: sizing.Load
    sla: api.SlaTarget
    ranked: tuple[Ranked, ...]
    excluded: tuple[str, ...]

    @property
    def best(self) -> Layout | None:
        first = self.ranked[0].layout if self.ranked else None
        return first if first is not None and first.meets_sla else None


# -- candidates ---------------------------------------------------------------------------------------------


def parallelisms(*, gpus_per_node: int = GPUS_PER_NODE, tensor: Iterable[int] = TENSOR_SIZES,
                 pipeline: Iterable[int] = PIPELINE_SIZES) -> list[Parallelism]:
    """Every tensor × pipeline split within one node, smallest first."""
    return sorted(Parallelism(t, p) for t, p in itertools.product(tensor, pipeline) if t * p <= gpus_per_node)


def model_profile(model: perfmodel.PerformanceModel, *, isl: float, osl: float, engine: str | None = None,
                  ) -> profiles.Profile:
    """The performance model's profile of one parallelism, on a grid that covers the load's lengths."""
    context = round(isl + osl / 2.0)
    kv = model.kv_capacity_tokens()
    contexts = sorted({c for c in (*PROFILE_CONTEXTS, context) if c <= kv})
    isls = sorted({*PROFILE_ISLS, max(1, round(isl))})
    return profiles.from_performance_model(model, isls=isls, contexts=contexts,
                                           concurrencies=PROFILE_CONCURRENCIES, engine=engine)


def modelled_candidates(model: perfmodel.ModelSpec, gpu: perfmodel.GpuSpec, *, isl: float, osl: float,
                        calibration: perfmodel.Calibration = perfmodel.VLLM_HOPPER,
                        splits: Sequence[Parallelism] | None = None,
                        ) -> tuple[list[Candidate], list[str]]:
    """A candidate per parallelism the model fits (its weights and one request's KV), and why the others
    are left out."""
    fits: list[Candidate] = []
    excluded: list[str] = []
    for split in splits if splits is not None else parallelisms():
        engine = perfmodel.PerformanceModel(model, gpu, split.tensor, split.pipeline, calibration=calibration)
        kv = engine.kv_capacity_tokens()
        if kv < isl + osl:
            weights = model.weight_bytes / split.gpus / 1e9
            excluded.append(
                f"{split.words()}: does not fit: {weights:.1f} GB of weights per GPU leave KV for {kv} tokens, "
                f"one request needs {isl + osl:.0f}")
            continue
        try:
            profile = model_profile(engine, isl=isl, osl=osl)
        except ValueError as error:  # too little KV for two concurrencies of any context row
            excluded.append(f"{split.words()}: no profile: {error}")
            continue
        fits.append(Candidate(split, capacities.CapacityModel(profile), engine))
    return fits, excluded


def measured_candidate(profile: profiles.Profile) -> Candidate:
    """A measured profile as the one candidate: its parallelism is the one it was measured at."""
    split = Parallelism(profile.tensor_parallel, profile.gpus_per_replica // profile.tensor_parallel)
    return Candidate(split, capacities.CapacityModel(profile))


# -- sizing each layout ----------------------------------------------------------------------------------


def _reach(candidate: Candidate, load: sizing.Load, sla: api.SlaTarget, *, prefill: bool, decode: bool,
           ) -> str | None:
    """Why no replica count of this parallelism holds the SLA (None: some count does)."""
    why = []
    if prefill:
        ttft = candidate.capacity.check_ttft_target(load.isl, sla.ttft_ms / 1e3)
        if not ttft.met:
            why.append(ttft.reason)
    if decode:
        itl = candidate.capacity.check_itl_target(load.isl, load.osl, sla.itl_ms / 1e3)
        if not itl.met:
            why.append(itl.reason)
    return f"{candidate.parallelism.words()}: " + "; ".join(why) if why else None


STEADY_CONCURRENCIES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


@dataclasses.dataclass(frozen=True)
class SteadyCapacity:
    """What one aggregated replica serves within the SLA in the performance model's closed loop."""

    rate_rps: float  # 0: no concurrency holds the SLA
    concurrency: int
    ttft_s: float
    tpot_s: float


def steady_capacity(engine: perfmodel.PerformanceModel, load: sizing.Load, sla: api.SlaTarget) -> SteadyCapacity:
    """The highest request rate an aggregated replica sustains within the SLA in the model's closed loop
    (`aggregated_steady_state`: chunked prefill riding on decode steps, what the calibration sweeps
    measured), over the concurrencies it could run; at none, the figures of one request alone.

    The loop gives means. TPOT is a whole request's mean over steps every running request shares, so its
    percentile is close to its mean. TTFT's wait beyond a lone request's is taken as exponential, so its
    percentile p is lone + wait × ln(1 / (1 − p)), never below the mean (p ≤ 63).
    """
    isl, osl = max(1, round(load.isl)), max(1, round(load.osl))
    alone = engine.aggregated_steady_state(isl, osl, 1)
    stretch = max(1.0, math.log(1.0 / (1.0 - sla.percentile / 100.0)))
    best = SteadyCapacity(0.0, 1, alone.ttft, alone.tpot)
    for concurrency in STEADY_CONCURRENCIES:
        state = engine.aggregated_steady_state(isl, osl, concurrency)
        ttft = alone.ttft + max(0.0, state.ttft - alone.ttft) * stretch
        if ttft <= sla.ttft_ms / 1e3 and state.tpot <= sla.itl_ms / 1e3 and state.request_rate > best.rate_rps:
            best = SteadyCapacity(state.request_rate, concurrency, ttft, state.tpot)
    return best


def aggregated(candidate: Candidate, load: sizing.Load, sla: api.SlaTarget) -> Layout:
    """One aggregated pool of this parallelism.

    With the performance model behind the candidate, sized by its closed-loop steady state (chunked
    prefill rides on decode steps, as the calibration sweeps measured; `steady_capacity`): on those
    sweeps it picks the measured best parallelism about twice as often as the planner's own aggregated
    sizing, which time-shares a replica between a prefill queue and a decode batch
    (benchmarks/recommend_validation.py). With only a measured profile, the planner's sizing.
    """
    split = candidate.parallelism
    if candidate.engine is None:
        desired = sizing.size_aggregated(load, candidate.capacity, sla)
        out_of_reach = _reach(candidate, load, sla, prefill=True, decode=True)
        return Layout("aggregated", {"aggregated": Pool(split, max(1, desired.aggregated))},
                      meets_sla=out_of_reach is None, sizing=out_of_reach or desired.reason)
    steady = steady_capacity(candidate.engine, load, sla)
    if steady.rate_rps <= 0:
        why = (f"{split.words()}: even one request alone takes TTFT {steady.ttft_s * 1e3:.0f} ms, TPOT "
               f"{steady.tpot_s * 1e3:.1f} ms against {sla.ttft_ms:g} / {sla.itl_ms:g} ms")
        return Layout("aggregated", {"aggregated": Pool(split, 1)}, meets_sla=False, sizing=why)
    replicas = max(1, math.ceil(load.rate_rps / steady.rate_rps - 1e-9))
    how = (f"{load.words()}: aggregated {replicas} at {steady.rate_rps:.3g} req/s per replica (concurrency "
           f"{steady.concurrency}: p{sla.percentile:g} TTFT {steady.ttft_s * 1e3:.0f} ms, TPOT {steady.tpot_s * 1e3:.1f} ms "
           f"in the performance model's steady state; the planner sizes an aggregated pool by time-sharing at "
           f"p{sla.percentile:g} and may run more)")
    return Layout("aggregated", {"aggregated": Pool(split, replicas)}, meets_sla=True, sizing=how)


def disaggregated(prefill: Candidate, decode: Candidate, load: sizing.Load, sla: api.SlaTarget) -> Layout:
    """A prefill pool and a decode pool, each of its own parallelism, sized as the planner sizes them."""
    desired = sizing.size(load, prefill.capacity, sla, decode_capacity=decode.capacity)
    why = [w for w in (_reach(prefill, load, sla, prefill=True, decode=False),
                       _reach(decode, load, sla, prefill=False, decode=True)) if w]
    pools: dict[sizing.Pool, Pool] = {"prefill": Pool(prefill.parallelism, max(1, desired.prefill)),
                                      "decode": Pool(decode.parallelism, max(1, desired.decode))}
    return Layout("disaggregated", pools, meets_sla=not why, sizing="; ".join(why) or desired.reason)


def layouts(candidates: Sequence[Candidate], load: sizing.Load, sla: api.SlaTarget, *,
            modes: Iterable[Mode] = MODES, mixed: bool = False) -> list[Layout]:
    """Every layout of the candidates in the modes asked for: aggregated per parallelism; disaggregated
    per parallelism, or per pair of them with `mixed`."""
    found: list[Layout] = []
    for mode in modes:
        if mode == "aggregated":
            found += [aggregated(c, load, sla) for c in candidates]
        elif mixed:
            found += [disaggregated(p, d, load, sla) for p, d in itertools.product(candidates, candidates)]
        else:
            found += [disaggregated(c, c, load, sla) for c in candidates]
    return found


# -- ranking ------------------------------------------------------------------------------------------------


def _pool_words(layout: Layout, name: sizing.Pool) -> str:
    pool = layout.pools[name]
    return f"{name} {pool.words()} = {pool.gpus} GPUs"


def why_it_loses(layout: Layout, best: Layout) -> str:
    """Why `layout` ranks below `best`, in the terms the user chooses between."""
    if not layout.meets_sla:
        return f"cannot hold the SLA: {layout.sizing}"
    if layout.gpus > best.gpus:
        more = layout.gpus - best.gpus
        extra = f"{more} more GPU{'s' if more > 1 else ''} ({layout.gpus} vs {best.gpus})"
        if layout.mode == best.mode:
            costlier = [name for name, pool in layout.pools.items() if pool.gpus > best.pools[name].gpus]
            return extra + ": " + "; ".join(f"{_pool_words(layout, n)} where #1 needs {best.pools[n].gpus}"
                                            for n in costlier)
        splits = {pool.parallelism for pool in (*layout.pools.values(), *best.pools.values())}
        if len(splits) == 1:  # the same replicas, only arranged differently
            if layout.mode == "aggregated":
                return extra + ": each replica both prefills and decodes, so it carries less of either"
            return extra + ": the two pools round up separately, and each needs at least one replica"
        pools = ", ".join(_pool_words(layout, n) for n in layout.pools)
        return f"{extra}: {pools} against #1's {best.words()}"
    if layout.replicas > best.replicas:
        return f"as many GPUs, in more pods ({layout.replicas} vs {best.replicas})"
    if layout.mode != best.mode:
        return f"as many GPUs and pods; {best.mode} is ranked first at a tie"
    return "as many GPUs and pods, with larger replicas (a replica is the unit that fails and scales)"


def rank(found: Iterable[Layout]) -> tuple[Ranked, ...]:
    """Layouts that hold the SLA first, by GPUs (ties: fewer pods, aggregated, smaller replicas)."""
    ordered = sorted(found, key=Layout.sort_key)
    if not ordered:
        return ()
    best = ordered[0]
    return tuple(Ranked(layout, "" if index == 0 else why_it_loses(layout, best))
                 for index, layout in enumerate(ordered))


def recommend(candidates: Sequence[Candidate], load: sizing.Load, sla: api.SlaTarget, *,
              modes: Iterable[Mode] = MODES, mixed: bool = False, excluded: Sequence[str] = ()) -> Recommendation:
    """Size every layout of the candidates at the load and rank them (pure; see the module docstring)."""
    if load.idle:
        raise ValueError("the load is 0 requests/s: there is nothing to size for")
    return Recommendation(load=load, sla=sla, ranked=rank(layouts(candidates, load, sla, modes=modes, mixed=mixed)),
                          excluded=tuple(excluded))


# -- the graph a recommendation runs as ---------------------------------------------------------------------


def _scaling(replicas: int) -> dict[str, int]:
    """Bounds around the recommended replicas: down to 1, up to twice them (at least 4) for the planner."""
    return {"min": 1, "max": max(4, 2 * replicas)}


def manifests(layout: Layout, *, name: str, model: str, served_name: str, framework: api.Framework,
              image: str | None, sla: api.SlaTarget, profile: profiles.Profile | None,
              namespace: str | None = None, planner_mode: Literal["off", "advisory", "sla"] = "sla",
              ) -> list[dict[str, Any]]:
    """The DynamoGraph of a layout (and the ConfigMap of its capacity profile, which the graph's planner
    reads), as plain objects. A layout whose pools differ in parallelism gets no planner: the live
    planner sizes a graph from one profile."""
    metadata: dict[str, Any] = {"name": name} | ({"namespace": namespace} if namespace else {})
    components: dict[str, Any] = {"frontend": {"replicas": 1, "router": {"policy": "prefix-aware"}}}
    for pool_name, pool in layout.pools.items():
        split = pool.parallelism
        components[pool_name] = {"replicas": pool.replicas, "gpus": split.gpus,
                                 "parallelism": {"tensor": split.tensor, "pipeline": split.pipeline},
                                 "scaling": _scaling(pool.replicas)}
    engine: dict[str, Any] = {"framework": framework} | ({"image": image} if image else {})
    planned = profile is not None and not layout.mixed and planner_mode != "off"
    planner: dict[str, Any] = {"mode": "off"}
    if planned:
        planner = {"mode": planner_mode, "sla": {"ttftMs": sla.ttft_ms, "itlMs": sla.itl_ms,
                                                  "percentile": sla.percentile},
                   "profileRef": {"configMap": f"{name}-profile"}}
    graph = {"apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND, "metadata": metadata,
             "spec": {"model": {"name": model, "servedName": served_name}, "engine": engine,
                      "components": components, "planner": planner}}
    api.DynamoGraph.model_validate(graph)  # what the apiserver's schema would refuse, refused here first
    if not planned or profile is None:
        return [graph]
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {**metadata, "name": f"{name}-profile",
                               "labels": {contract.LABEL_PART_OF: contract.PART_OF}},
                  "data": {"profile.json": profile.model_dump_json()}}
    return [config_map, graph]
