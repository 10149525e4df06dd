"""Placement without a cluster: what the cluster has and can become (live nodes, the node types an autoscaler may
add) and what work is left -> how many actors asking for what, with the line that says why; an actor no node can
hold stopping the run with one line; and a rerun with nothing left to score starting no actor."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import pytest
import yaml
from ray.core.generated import autoscaler_pb2

import raylm.cluster.runtime as runtime
from raylm.cluster import scoring_actor
from raylm.cluster.scoring_actor import ScoringActor
from raylm.cluster.capacity import (HEAD_RESOURCE, UNBOUNDED, Capacity, NodeType, actors_that_fit, capacity_of,
                                    parse_node_types)
from raylm.cluster.devices import FAKE_GPUS_ENV, device_here, fake_gpus
from raylm.cluster.estimate import FLOPS_PER_PARAMETER_TOKEN, PLACEMENT_GPU_ACTOR_FLOPS
from raylm.cluster.placement import DEFAULT_MAX_ACTORS, TARGET_ACTOR_MINUTES, Ask, Work, plan, whole_cpu_share
from raylm.cluster.runtime import ActorRecipe, LaunchedActors, plan_actors
from raylm.config import EvalConfig
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.evaluate.startup import FirstActor
from raylm.models.checkpoint_size import stored_parameters
from raylm.models.loading import parameter_count
from raylm.models.spec import ModelSpec

REPO = Path(__file__).resolve().parents[1]
HEAD0 = {"CPU": 0.0, HEAD_RESOURCE: 1.0}  # cluster.yaml's head: no CPU for actors, no GPU


def gpu_worker(max_count: int, name: str = "gpu_worker", cpus: float = 4, gpus: float = 1) -> NodeType:
    return NodeType(name, {"CPU": cpus, "GPU": gpus}, max_count)


def fits(node_cpus: list[float], actors: int, share: int, reserve: float) -> bool:
    """Place actors one by one on any node with room left, the reserve taken first from the largest node."""
    free = sorted(node_cpus, reverse=True)
    free[0] -= reserve
    placed = 0
    for i, cpus in enumerate(free):
        while cpus - share >= -1e-9 and placed < actors:
            cpus -= share
            placed += 1
        free[i] = cpus
    return placed == actors


def slow_share(node_cpus: list[float], actors: int, reserve: float) -> int | None:
    """Every whole share, largest first, until all actors fit."""
    for share in range(int(max(node_cpus)), 0, -1):
        if fits(node_cpus, actors, share, reserve):
            return share
    return None


@pytest.mark.parametrize("nodes,actors,reserve,expected", [
    ([2], 1, 0, 2), ([2], 2, 0, 1), ([1, 1], 1, 0, 1), ([1, 1], 2, 0, 1), ([1, 1], 3, 0, None),
    ([3, 1], 2, 0, 1), ([4, 2], 1, 1, 3), ([2, 2], 3, 0, 1), ([3], 3, 0, 1), ([2], 3, 0, None), ([0], 1, 0, None),
    ([8, 4], 2, 0, 4), ([2], 1, 1, 1), ([2], 2, 1, None), ([0.5], 1, 0, None),
])
def test_whole_cpu_share_on_known_clusters(nodes, actors, reserve, expected):
    assert whole_cpu_share(nodes, actors, reserve) == expected


def test_whole_cpu_share_is_the_largest_that_fits_on_random_clusters():
    rnd = random.Random(7)
    for _ in range(60):
        nodes = [rnd.choice([1, 2, 3, 4, 6, 8, 0.5]) for _ in range(rnd.randint(1, 4))]
        actors, reserve = rnd.randint(1, 7), rnd.choice([0, 0, 1])
        if max(nodes) <= reserve:
            continue
        share = whole_cpu_share(nodes, actors, reserve)
        assert share == slow_share(nodes, actors, reserve), (nodes, actors, reserve)
        assert share is None or fits(nodes, actors, share, reserve)


def test_the_issues_cluster_asks_for_gpu_actors_before_any_gpu_node_is_up():
    """cluster.yaml's shape, nothing but the 0-CPU head up: it planned one actor of 0.0001 CPU; now one GPU actor
    per GPU the cluster can grow to, said in one line."""
    p = plan(Ask(), Capacity((HEAD0,), (gpu_worker(8),), "RAYLM_NODE_TYPES", 8))
    assert (p.actors, p.num_gpus, p.num_cpus, p.device, p.awaits_nodes) == (8, 1.0, 0.5, "cuda", True)
    assert p.reason == ("8 actors x 1 GPU (0.5 CPU each): one per GPU the cluster can grow to (8); --device auto: no "
                        "GPU up yet; the autoscaler may add gpu_worker nodes (from RAYLM_NODE_TYPES)")


def test_default_gpu_actors_are_capped_and_never_fewer_than_are_up():
    big = Capacity((HEAD0,), (gpu_worker(100),), "RAYLM_NODE_TYPES")
    p = plan(Ask(), big)
    assert p.actors == DEFAULT_MAX_ACTORS and f"(100, capped at {DEFAULT_MAX_ACTORS}; --actors for more)" in p.reason
    assert plan(Ask(actors=40), big).actors == 40
    with pytest.raises(RaylmError, match=r"^--actors 101 of 1 GPU each: this cluster holds at most 100 at once"):
        plan(Ask(actors=101), big)
    # Three GPU nodes up on a config that says two: what is up counts.
    up = (HEAD0, *({"CPU": 4.0, "GPU": 1.0},) * 3)
    assert plan(Ask(), Capacity(up, (gpu_worker(2),), "x")).actors == 3
    # The global max_workers bounds added nodes of all types together: the 2-GPU type first.
    two_types = Capacity((HEAD0,), (gpu_worker(8, "a"), gpu_worker(8, "b", gpus=2)), "x", max_added=5)
    assert plan(Ask(), two_types).actors == 10
    assert plan(Ask(num_gpus=2), two_types).actors == 5


def test_fractional_and_multi_gpu_actors():
    up = ({"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0})
    assert plan(Ask(num_gpus=0.4), Capacity(up, None, "")).actors == 4
    with pytest.raises(RaylmError, match="no node has 2 GPU"):
        plan(Ask(num_gpus=2), Capacity((HEAD0,), (gpu_worker(8),), "x"))


def test_gpus_where_there_are_none_fail_at_once():
    local = Capacity(({"CPU": 2.0, HEAD_RESOURCE: 1.0},), (), "the Ray raylm started on this machine")
    with pytest.raises(RaylmError, match=r"^--device cuda: no node has 1 GPU\(s\) and 0.5 CPU for a scoring actor"):
        plan(Ask(device="cuda"), local)
    cpu_only = Capacity((HEAD0,), (NodeType("cpu_worker", {"CPU": 8.0}, 4),), "x")
    with pytest.raises(RaylmError, match="may add cpu_worker x4 of 8 CPU/0 GPU"):
        plan(Ask(device="cuda"), cpu_only)
    # Growth unknown: a named GPU is waited for, as an autoscaler may add it.
    p = plan(Ask(device="cuda"), Capacity((HEAD0,), None, ""))
    assert (p.actors, p.device, p.awaits_nodes) == (1, "cuda", True) and "no GPU is up yet" in p.reason


def test_device_requests_no_cluster_can_meet_as_meant_are_refused():
    anywhere = Capacity(({"CPU": 4.0, "GPU": 2.0},), None, "")
    for ask, message in ((Ask(device="cuda:1"), "--device cuda:1 names one GPU of one machine"),
                         (Ask(device="cpu", num_gpus=1), "--device cpu contradicts --num-gpus 1"),
                         (Ask(device="cuda", num_gpus=0), "--device cuda contradicts --num-gpus 0")):
        with pytest.raises(RaylmError, match=f"^{message}"):
            plan(ask, anywhere)


def test_cpu_actors_ask_for_whole_cpus_and_run_that_many_threads():
    laptop = Capacity(({"CPU": 2.0, HEAD_RESOURCE: 1.0},), (), "here")
    p = plan(Ask(), laptop)
    assert (p.actors, p.num_cpus, p.threads, p.device) == (1, 2.0, 2, "cpu")
    assert p.reason.startswith("1 actor x 2 CPU (2 torch threads each), sized to the nodes up now; --device auto: no "
                               "GPU up now and none the cluster can add")
    assert (plan(Ask(actors=2), laptop).num_cpus, plan(Ask(reserve_cpus=1), laptop).num_cpus) == (1.0, 1.0)
    with pytest.raises(RaylmError, match=r"^3 CPU actor\(s\) of a whole CPU each do not fit this cluster"):
        plan(Ask(actors=3), laptop)
    # cluster.yaml's 0-CPU head with CPU workers to add: the actor is sized to a worker, not to the head's 0 CPUs.
    grows = Capacity((HEAD0,), (NodeType("cpu_worker", {"CPU": 8.0}, 2),), "x")
    p = plan(Ask(device="cpu", actors=2), grows)
    assert (p.num_cpus, p.threads, p.awaits_nodes) == (8.0, 8, True) and "cpu_worker" in p.reason
    with pytest.raises(RaylmError, match="do not fit this cluster"):
        plan(Ask(device="cpu"), Capacity((HEAD0,), (), "x"))


def test_unknown_growth_is_said_and_never_guessed():
    with pytest.raises(RaylmError, match=r"cannot tell which nodes its autoscaler may add: set RAYLM_NODE_TYPES"):
        plan(Ask(), Capacity((HEAD0,), None, ""))
    p = plan(Ask(), Capacity(({"CPU": 4.0, HEAD_RESOURCE: 1.0},), None, ""))
    assert p.device == "cpu" and "the nodes an autoscaler may add are unknown (RAYLM_NODE_TYPES unset)" in p.reason
    with pytest.raises(RaylmError, match="cannot tell which nodes the autoscaler may add"):
        plan(Ask(actors=3), Capacity(({"CPU": 1.0}, {"CPU": 1.0}), None, ""))


def test_node_types_from_the_hint_inline_or_as_a_cluster_config_file():
    types, cap = parse_node_types(json.dumps({"max_workers": 4, "available_node_types": {
        "gpu-group": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 6}}}))
    assert (types, cap) == ((NodeType("gpu-group", {"CPU": 4.0, "GPU": 1.0}, 4),), 4)
    # cluster.yaml itself, as `ray up` leaves it on the head: the head type is not one the autoscaler adds.
    types, cap = parse_node_types(str(REPO / "cluster.yaml"))
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    workers = {name: t for name, t in config["available_node_types"].items() if name != config["head_node_type"]}
    assert len(workers) >= 2  # one GPU per node, and several for a model that spans GPUs
    assert types == tuple(NodeType(name, {k: float(v) for k, v in t["resources"].items()}, t["max_workers"])
                          for name, t in workers.items()) and cap == config["max_workers"]


@pytest.mark.parametrize("hint,message", [
    ("{not json", "RAYLM_NODE_TYPES is not valid JSON"),
    ('{"gpu": {"resources": {"GPU": 1}}}', "must be a mapping with available_node_types"),
    ('{"available_node_types": {"g": {"resources": {"GPU": 1}}}, "maxworkers": 2}', r"unknown key\(s\) maxworkers"),
    ('{"available_node_types": {"g": {"resources": {"GPU": -1}}}}', "resource GPU must be a number 0 or more"),
    ('{"available_node_types": {"g": {"resources": {"GPU": 1}, "max_workers": 1.5}}}', "max_workers must be a whole"),
    ('{"available_node_types": {"g": {"GPU": 1}}}', "node type 'g' needs a resources mapping"),
    ("/nonexistent/ray_bootstrap_config.yaml", "cannot read the cluster config"),
])
def test_a_malformed_hint_stops_the_run_in_one_line(hint, message):
    with pytest.raises(RaylmError, match=message) as err:
        parse_node_types(hint)
    assert "\n" not in str(err.value)


def test_rays_own_cluster_config_comes_before_the_hint():
    """Ray's ClusterConfig (autoscaler.proto) as an autoscaler reports it to the GCS; -1 is unbounded."""
    config = autoscaler_pb2.ClusterConfig()
    group = config.node_group_configs.add()
    group.name, group.max_count = "a100", -1
    group.resources["GPU"], group.resources["CPU"] = 8, 96
    capacity = capacity_of([HEAD0], config, '{"available_node_types": {}}', False)
    assert capacity.addable == (NodeType("a100", {"GPU": 8.0, "CPU": 96.0}, UNBOUNDED),)
    assert capacity.source == "the autoscaler's config in Ray"
    assert capacity_of([HEAD0], autoscaler_pb2.ClusterConfig(), None, False).addable is None
    assert capacity_of([HEAD0], None, None, True).addable == ()


def test_plan_actors_gives_actors_the_placements_device(monkeypatch):
    """A CPU actor loads onto the CPU even where torch could see a GPU it did not ask Ray for."""
    monkeypatch.setattr(runtime, "cluster_capacity", lambda: Capacity(({"CPU": 1.0}, {"CPU": 1.0}), None, ""))
    recipe, n = plan_actors(ModelSpec("unused"), None, None)
    assert (n, recipe.num_cpus, recipe.threads, recipe.spec.device) == (1, 1.0, 1, "cpu")
    assert actors_that_fit([{"CPU": 1.0}, {"CPU": 1.0}], recipe.num_cpus, 0) == 2
    monkeypatch.setattr(runtime, "cluster_capacity", lambda: Capacity((HEAD0,), (gpu_worker(2),), "x"))
    recipe, n = plan_actors(ModelSpec("unused"), None, None)
    assert (n, recipe.num_gpus, recipe.spec.device, recipe.awaits_nodes) == (2, 1.0, "cuda", True)


def test_an_actor_with_a_fraction_of_a_gpu_is_started_with_that_share(monkeypatch):
    """--num-gpus 0.5 packs two actors on a GPU: each is told it may fill half of it (its KV budget is half the
    card's, not half the card's free memory twice over); an actor with one or more GPUs fills each of them."""
    started = []

    class Remote:
        def options(self, **options):
            return self

        def remote(self, *args):
            started.append(args)

    monkeypatch.setattr(scoring_actor, "RemoteScoringActor", Remote())
    for num_gpus, share in ((0.5, 0.5), (0.25, 0.25), (1.0, 1.0), (2.0, 1.0), (0.0, 1.0)):
        ActorRecipe(ModelSpec("unused", device="cuda" if num_gpus else "cpu"), None, 1.0, num_gpus, 1).start()
        assert started.pop()[-1] == share


def test_a_gpu_actor_that_finds_no_cuda_device_stops_with_one_line(tiny_llama, monkeypatch):
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    actor = ScoringActor(ModelSpec(str(tiny_llama), "float32", "cuda"), 1, None)
    with pytest.raises(RaylmError, match=r"^a GPU scoring actor \(Ray's GPU ids: none, CUDA_VISIBLE_DEVICES=") as err:
        actor.ready()
    assert "finds no CUDA device" in str(err.value) and "\n" not in str(err.value)
    assert device_here(ModelSpec("unused", device="cpu")).device == "cpu"


def test_the_fake_gpu_drill_switch_is_checked(monkeypatch):
    for value, expected in (("", False), ("0", False), ("1", True)):
        monkeypatch.setenv(FAKE_GPUS_ENV, value)
        assert fake_gpus() is expected
    monkeypatch.setenv(FAKE_GPUS_ENV, "yes")
    with pytest.raises(RaylmError, match="RAYLM_FAKE_GPUS must be 1"):
        fake_gpus()


def test_an_actor_no_node_can_hold_stops_the_run_with_one_line(ray_session, tiny_llama, monkeypatch):
    """On the session's 2-CPU Ray, an actor asking for 3 CPUs would wait for ever."""
    monkeypatch.setattr(runtime, "READY_POLL_S", 0.2)
    launched = LaunchedActors(ActorRecipe(ModelSpec(str(tiny_llama), "float32", "cpu"), None, 3.0, 0.0, 1), 1)
    try:
        with pytest.raises(RaylmError) as err:
            launched.wait_ready(placement_wait_s=1.0)
    finally:
        launched.release()
    message = str(err.value)
    assert message.startswith("cannot place 1 of 1 scoring actor(s) asking for 3 CPU and 0 GPU each: the cluster's "
                              "nodes (2 CPU/0 GPU) hold 0 at once; waited 1 s")
    assert "\n" not in message


def gpu_minutes_of_tokens(minutes: float, parameters: int) -> int:
    """The tokens one GPU actor scores in `minutes` by the estimate's own constants."""
    return int(minutes * 60 * PLACEMENT_GPU_ACTOR_FLOPS / (FLOPS_PER_PARAMETER_TOKEN * parameters))


def test_the_work_estimate_is_tokens_times_parameters_over_an_actors_throughput():
    seven_b = 7_000_000_000
    hour = Work(1000, gpu_minutes_of_tokens(60, seven_b), seven_b)
    assert hour.actor_minutes("cuda") == pytest.approx(60)
    assert hour.actors_needed("cuda") == 6  # at TARGET_ACTOR_MINUTES each
    assert TARGET_ACTOR_MINUTES == 10
    assert Work(1000, gpu_minutes_of_tokens(3, seven_b), seven_b).actors_needed("cuda") == 1  # a few minutes: one
    assert Work(2, gpu_minutes_of_tokens(60, seven_b), seven_b).actors_needed("cuda") == 2  # never more than shards
    assert Work(0, 0, seven_b).actors_needed("cuda") == 0
    # A CPU actor's throughput grows with its threads.
    small = Work(1000, 1_000_000, 124_000_000)
    assert small.actor_minutes("cpu", 4) == pytest.approx(small.actor_minutes("cpu", 1) / 4)
    assert small.actors_needed("cpu", 1) > small.actors_needed("cpu", 4) >= 1


def test_the_default_count_is_the_smaller_of_what_the_cluster_can_grow_to_and_what_the_work_needs():
    """The issue's fake-autoscaler run: `--demo --limit 2` on a cluster that can grow to 4 GPU nodes asked for 4
    GPU actors; its work needs one."""
    grows_to_4 = Capacity((HEAD0,), (gpu_worker(4),), "RAYLM_NODE_TYPES", 4)
    demo = Work(3, 17_888, 260_032)
    p = plan(Ask(work=demo), grows_to_4)
    assert (p.actors, p.num_gpus, p.awaits_nodes) == (1, 1.0, True)
    assert p.reason.startswith("1 actor x 1 GPU (0.5 CPU each): what the work needs (17,888 tokens left in 3 shards "
                               "x 260K parameters ~ <0.1 actor-minutes at 40 TFLOP/s per GPU actor, 10 min each), "
                               "fewer than one per GPU the cluster can grow to (4)")
    big = Work(1000, gpu_minutes_of_tokens(120, 7_000_000_000), 7_000_000_000)  # 12 actors' worth
    p = plan(Ask(work=big), grows_to_4)
    assert p.actors == 4 and p.reason.startswith("4 actors x 1 GPU (0.5 CPU each): one per GPU the cluster can grow "
                                                 "to (4), no more than the work needs (12: ")
    assert plan(Ask(work=big), Capacity((HEAD0,), (gpu_worker(100),), "x")).actors == 12
    # --actors still wins, and the line says what the work needed.
    p = plan(Ask(actors=3, work=demo), grows_to_4)
    assert p.actors == 3 and "--actors 3 (the work needs 1: 17,888 tokens left" in p.reason
    # Work that is not known up front (a streamed corpus) keeps the cluster's count.
    assert plan(Ask(), grows_to_4).actors == 4
    # One CPU actor by default whatever the work; the line says when more would help.
    laptop = Capacity(({"CPU": 2.0, HEAD_RESOURCE: 1.0},), (), "here")
    assert plan(Ask(work=big), laptop).actors == 1
    assert "one CPU actor by default (--actors for more)" in plan(Ask(work=big), laptop).reason


def test_no_work_left_means_no_actor_whatever_is_asked():
    nothing = Work(0, 0, 0)
    for ask in (Ask(work=nothing), Ask(actors=4, work=nothing), Ask(device="cuda", work=nothing)):
        p = plan(ask, Capacity((HEAD0,), (gpu_worker(4),), "x", 4))
        assert (p.actors, p.awaits_nodes) == (0, False)
        assert p.reason.startswith("no actor: nothing left to score (every shard is in the checkpoint)")
    # Not even on a cluster where an actor could not be placed at all.
    assert plan(Ask(work=nothing), Capacity((HEAD0,), None, "")).actors == 0
    with pytest.raises(RaylmError, match="--actors must be at least 1"):  # bad flags are still refused
        plan(Ask(actors=0, work=nothing), Capacity((HEAD0,), None, ""))


def test_the_parameter_count_is_the_models_from_its_headers_or_else_its_config(tiny_llama, truncated_weights_model,
                                                                                 tmp_path):
    """One safetensors file, a sharded checkpoint and a directory with no safetensors weights (counted from the
    config on the meta device) all give the loaded model's count; packed integer weights are not counted from the
    header; a header cut short stops the run in one line naming the file."""
    import numpy as np
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    count = sum(p.numel() for p in model.parameters())
    sharded, no_weights, packed = tmp_path / "sharded", tmp_path / "no-weights", tmp_path / "packed"
    model.save_pretrained(sharded, max_shard_size="40KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    for folder in (no_weights, packed):
        folder.mkdir()
        shutil.copy(tiny_llama / "config.json", folder)
    save_file({"embed": np.zeros((4, 8), np.float32), "qweight": np.zeros((4, 2), np.int32)},
              str(packed / "model.safetensors"))
    for folder in (tiny_llama, sharded):
        assert stored_parameters(ModelSpec(str(folder))) == parameter_count(ModelSpec(str(folder))) == count
    for folder in (no_weights, packed):
        assert stored_parameters(ModelSpec(str(folder))) is None
        assert parameter_count(ModelSpec(str(folder))) == count
    with pytest.raises(RaylmError, match=r"^model weights '.+/model\.safetensors' cannot be read: SafetensorError: "):
        parameter_count(ModelSpec(str(truncated_weights_model)))
    (sharded / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(RaylmError, match=r"^model weights index '.+' cannot be read: KeyError: 'weight_map'"):
        parameter_count(ModelSpec(str(sharded)))


def test_a_rerun_with_nothing_left_to_score_starts_no_actor(ray_session, tmp_path, monkeypatch, caplog):
    """The issue's rerun to add --decontaminate: every shard is in the checkpoint, so the checkpoint is read before
    any actor is asked for, and none is."""
    started = []
    real_start = ActorRecipe.start
    monkeypatch.setattr(ActorRecipe, "start", lambda recipe: started.append(recipe) or real_start(recipe))
    cfg = EvalConfig(ModelSpec(str(DEMO_MODEL), "float32", "cpu"), ("winogrande",), DEMO_DATA, limit=2,
                     shard_requests=2, progress=False, output=tmp_path)
    with caplog.at_level(logging.INFO, logger="raylm.cluster.runtime"):
        first = evaluate(cfg)
        assert len(started) == 1 and first.extra["shards_resumed"] == 0
        first_log = caplog.text
        caplog.clear()
        rerun = evaluate(cfg)
    assert first.extra["shards_scored_while_building"] == 0  # its actor's threads are both of the session's CPUs
    assert len(started) == 1, "the rerun asked Ray for an actor"
    assert rerun.extra["shards_resumed"] == rerun.extra["shards"] == first.extra["shards"]
    assert rerun.tasks["winogrande"].sums == first.tasks["winogrande"].sums
    assert "placement: 1 actor x 2 CPU (2 torch threads each), sized to the nodes up now; the work needs 1 (" \
        in first_log
    assert "placement: no actor: nothing left to score (every shard is in the checkpoint)" in caplog.text


@pytest.mark.parametrize(("cpus", "threads", "gpus", "beside"), [(2, 2, 0, False), (2, 1, 0, True), (8, 8, 0, False),
                                                                 (8, 4, 0, True), (4, 1, 1, True)])
def test_the_first_actor_scores_while_tasks_build_only_on_cores_the_build_does_not_need(cpus, threads, gpus, beside):
    """The local Ray of a small machine gives its one actor every core: scoring there while the driver tokenises
    would stall the actor's threads, so the build finishes first; a GPU actor, or a CPU to spare, scores beside it."""
    recipe = ActorRecipe(ModelSpec(str(DEMO_MODEL)), None, threads, gpus, threads)
    first = FirstActor(Capacity(({"CPU": float(cpus), "GPU": float(gpus)},), (), ""), recipe, None)
    assert first.scores_beside_the_build() is beside
