"""Generated programs run on Ray CPU tasks, beside (never inside) the actors that hold the model.

Programs are cut into chunks, each a Ray task of one CPU that runs its programs in turn in that node's sandbox
(raylm.sandbox): a GPU actor never waits on a test run, and a cluster's CPUs run them side by side. A chunk's
outcomes come back in order; a program's own failure, timeout or limit is its outcome, never the task's. A node
that cannot sandbox fails its chunk with one line (or runs it unsandboxed under --confirm_run_unsafe_code).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import ray

from raylm.cluster.waiting import progressed, wait
from raylm.sandbox.policy import run_checked
from raylm.sandbox.programs import Limits, Outcome

log = logging.getLogger(__name__)

CHUNKS_PER_CPU = 4  # enough chunks that a slow one (a program that times out) does not leave CPUs idle
MAX_CHUNK = 32


@ray.remote(num_cpus=1)
def _run_chunk(programs: Sequence[tuple[str, Limits]], unsafe_allowed: bool) -> list[Outcome]:
    return [run_checked(source, limits, unsafe_allowed) for source, limits in programs]


def run_programs(programs: Sequence[tuple[str, Limits]], unsafe_allowed: bool) -> list[Outcome]:
    """Each program's outcome, in order, from Ray CPU tasks on the connected cluster."""
    if not programs:
        return []
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = max(1, min(MAX_CHUNK, -(-len(programs) // (cpus * CHUNKS_PER_CPU))))
    chunks = [list(programs[i:i + size]) for i in range(0, len(programs), size)]
    start = time.monotonic()
    refs = [_run_chunk.remote(chunk, unsafe_allowed) for chunk in chunks]
    pending = list(refs)
    while pending:
        done, pending = wait(pending, num_returns=1)
        ray.get(done)  # a chunk that failed (a node that cannot sandbox) raises here, before the others finish
        progressed()
    outcomes = [outcome for chunk in ray.get(refs) for outcome in chunk]
    elapsed = time.monotonic() - start
    log.info("ran %d generated programs in %.1f s on Ray CPU tasks (%.1f programs/s); %d passed", len(programs),
             elapsed, len(programs) / max(elapsed, 1e-9), sum(o.passed for o in outcomes))
    return outcomes
