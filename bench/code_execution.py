"""What running code tasks' programs costs: programs per second, side by side in one run, for a process per
program without a sandbox (what lm-eval's code_eval does), raylm's bubblewrap sandbox one program at a time, and
raylm's Ray CPU tasks (the sandbox on every core of a local Ray).

    PYTHONPATH=$PWD python bench/code_execution.py --programs 200

The programs are HumanEval-shaped: a function, then its `check` with three assertions; half pass, half fail an
assertion (every one of them is also checked to get the same outcome under all three).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

from raylm.sandbox.programs import Limits, run_program  # noqa: E402

PROGRAM = '''def running_max(xs):
    out, best = [], None
    for x in xs:
        best = x if best is None else max(best, x)
        out.append(best)
    return out{wrong}


def check(candidate):
    assert candidate([1, 3, 2]) == [1, 3, 3]
    assert candidate([]) == []
    assert candidate([5, 4, 6, {n}]) == [5, 5, 6, 6]


check(running_max)
'''


def programs(n: int) -> list[str]:
    return [PROGRAM.format(n=i % 5, wrong="[:-1]" if i % 2 else "") for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=200)
    args = parser.parse_args()
    sources, limits = programs(args.programs), Limits()
    timed, outcomes = {}, {}
    for name, sandboxed in (("a process each, no sandbox", False), ("bubblewrap sandbox, one at a time", True)):
        start = time.perf_counter()
        outcomes[name] = [run_program(s, limits, sandboxed=sandboxed).status for s in sources]
        timed[name] = time.perf_counter() - start
    import ray

    from raylm.cluster.programs import run_programs

    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        name = f"bubblewrap sandbox, Ray CPU tasks ({int(ray.cluster_resources()['CPU'])} CPUs)"
        run_programs([(s, limits) for s in sources[:4]], False)  # Ray's workers started, as a run's are by then
        start = time.perf_counter()
        outcomes[name] = [o.status for o in run_programs([(s, limits) for s in sources], False)]
        timed[name] = time.perf_counter() - start
    finally:
        ray.shutdown()
    first = next(iter(outcomes.values()))
    assert all(o == first for o in outcomes.values()), "the outcomes differ between the ways of running"
    assert first.count("passed") == (args.programs + 1) // 2
    base = args.programs / timed["a process each, no sandbox"]
    rows = [[name, args.programs, round(s, 2), round(args.programs / s, 1), round(args.programs / s / base, 2)]
            for name, s in timed.items()]
    print_table("generated programs run", ["how", "programs", "s", "programs/s", "vs a process each"], rows)


if __name__ == "__main__":
    main()
