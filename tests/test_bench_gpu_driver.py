"""bench/gpu_driver.py and bench/gpu_numerics.py only ever run for real on a GPU machine, with minutes of device
time and no chance to debug: their CPU smoke modes here keep them from rotting between those rare runs. The GPU
machine's image has torch and transformers but neither Ray nor datasets (and Ray's wheel is too big to carry there),
so the smoke runs make those two unimportable, as they are there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_as_on_the_device(script: str, *args: str) -> subprocess.CompletedProcess:
    path = ROOT / "bench" / script
    as_on_the_device = ("import runpy, sys; sys.modules.update(ray=None, datasets=None); "
                        f"sys.argv = [{str(path)!r}, *{list(args)!r}]; "
                        "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", as_on_the_device], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_the_gpu_benchmark_driver_scores_and_prints_its_table_row_on_cpu():
    proc = run_as_on_the_device("gpu_driver.py", "--device", "cpu", "--tiny", "--dtype", "float32", "--docs", "12")
    row = [c.strip() for c in proc.stdout.strip().splitlines()[-1].strip("|").split("|")]
    shape, dtype, docs, requests = row[:4]
    assert (shape, dtype, docs, requests) == ("tiny", "float32", "12", "48")
    docs_per_s, tokens_per_s, tflops = (float(x) for x in row[6:9])  # a tiny model's TFLOP/s rounds to 0.0
    assert docs_per_s > 0 and tokens_per_s > docs_per_s and tflops >= 0
    assert row[9].endswith("%") and int(row[10]) > 0


def test_the_gpu_benchmark_driver_runs_mmlu_5shot_as_a_tree_on_cpu():
    proc = run_as_on_the_device("gpu_driver.py", "--device", "cpu", "--tiny", "--dtype", "float32", "--docs", "40",
                                "--task", "mmlu-5shot")
    row = [c.strip() for c in proc.stdout.strip().splitlines()[-1].strip("|").split("|")]
    assert row[:4] == ["tiny mmlu-5shot", "float32", "40", "160"]
    assert 0 < float(row[11]) < 0.3  # each subject's head and each question computed once


def test_every_numerics_check_runs_end_to_end_on_cpu_at_bfloat16():
    """hellaswag (raylm vs lm-eval HFLM on one model object; packed vs unpacked), load (load_model, then the model
    spread over two devices: on CPU, the CPU and a disk offload folder), max-length (one long document per
    --max-length), in one process."""
    out = run_as_on_the_device("gpu_numerics.py", "all", "--device", "cpu", "--tiny", "--docs", "12").stdout
    assert "HellaSwag: 12 documents (300 rows in" in out and "the full validation set has 10,042)" in out
    assert re.search(r"packed vs unpacked: max \|Δ\| \S+ nats, .* \(within\)", out), out
    lmeval_row = out.split("## raylm vs lm-eval bfloat16 HFLM on the same model")[1].splitlines()[4]
    requests, _, _, differ = (c.strip() for c in lmeval_row.strip("|").split("|")[:4])
    assert requests == "48" and differ.endswith("/12")
    assert re.search(r"spread over the CPU and disk: cpu: \d+ modules, disk: \d+ modules; 12 docs in .* max \|Δ\| vs "
                     r"one device 0 nats \(within the bfloat16 noise bound\)", out), out
    lengths = re.findall(r"^\| ([\d,]+) \| (\d+) \| [\d.]+ \| n/a \(CPU\) \|$", out, re.MULTILINE)
    assert lengths == [("128", "12"), ("512", "3"), ("1,536", "1")]


def test_gpu_sh_names_only_checks_that_exist():
    """gpu.sh is run, not tested, on CPU (its steps are the two scripts above): its syntax and every check it asks
    for must still be right when the day comes."""
    script = (ROOT / "bench" / "gpu.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu.sh")]).returncode == 0
    # Asked of another process: importing bench/ modules here would put bench/ on this one's sys.path, where its
    # masked_models.py shadows the tests' own.
    checks = subprocess.run([sys.executable, "-c", "import gpu_numerics; print(' '.join(gpu_numerics.CHECKS))"],
                            cwd=ROOT / "bench", capture_output=True, text=True, check=True).stdout.split()
    asked = set(re.findall(r"bench/gpu_numerics\.py ([\w-]+)", script))
    assert asked and asked <= set(checks)
    for name in re.findall(r"bench/(\w+\.py)", script):
        assert (ROOT / "bench" / name).is_file(), name
