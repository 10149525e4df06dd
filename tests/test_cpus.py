"""CPUs the local Ray is sized to: the affinity mask, capped by a cgroup CPU quota (v2 and v1), not the machine's;
and the niceness its actors run at."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import raylm.cluster.cpus as cpus
from raylm.cluster.cpus import available_cpus, cgroup_cpu_quota


def tree(root, files: dict[str, str]) -> None:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)


@pytest.fixture
def four_cpus(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})


@pytest.mark.parametrize("files,proc,quota,expected", [
    ({"cpu.max": "max 100000\n", "a/b/cpu.max": "150000 100000\n"}, "0::/a/b\n", 1.5, 1),
    ({"a/cpu.max": "200000 100000\n", "a/b/cpu.max": "max 100000\n"}, "0::/a/b\n", 2.0, 2),
    ({"cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
     "2:cpu,cpuacct:/\n1:memory:/x\n", 3.0, 3),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n", None, 4),
    ({"cpu.max": "800000 100000\n"}, "0::/\n", 8.0, 4),
    ({}, "0::/\n", None, 4),
])
def test_cgroup_quota_caps_the_affinity_mask(tmp_path, four_cpus, files, proc, quota, expected):
    tree(tmp_path / "cg", files)
    (tmp_path / "cgroup").write_text(proc)
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "cgroup") == quota
    assert available_cpus(tmp_path / "cg", tmp_path / "cgroup") == expected


def test_the_affinity_mask_counts_not_the_machines_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {1})
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 64)
    assert available_cpus(tmp_path / "none", tmp_path / "none") == 1


PROBE = """
import os, sys, psutil, ray
from raylm.models.spec import ModelSpec
from raylm.cluster.runtime import connect, plan_actors
connect()
print(ray.cluster_resources()["CPU"])
recipe, _ = plan_actors(ModelSpec(sys.argv[1], "float32", "cpu"), 1, None, num_cpus=1)
print(psutil.Process(ray.get(recipe.start().ready.remote())).nice() - os.nice(0))
"""


@pytest.mark.slow  # a Ray of its own
def test_the_local_ray_has_the_cpus_the_process_is_pinned_to_and_runs_actors_at_its_niceness(tiny_llama):
    """raylm's own connect() starting the local Ray, in a fresh process pinned to one CPU, as the CLI runs: Ray
    counts that one CPU, and the actor runs at the driver's niceness (Ray's default would be +15, where every other
    runnable process preempts the actor's threads)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    cpu = min(os.sched_getaffinity(0))
    proc = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", PROBE, str(tiny_llama)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-2:] == ["1.0", "0"]
