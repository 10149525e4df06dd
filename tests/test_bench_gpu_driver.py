"""bench/gpu_driver.py only ever runs for real on a lent accelerator, with minutes of device time and no chance
to debug: its CPU smoke mode here keeps it from rotting between those rare runs. The lent machine's image has
torch and transformers but neither Ray nor datasets (and Ray's wheel is too big to carry there), so the smoke
run makes those two unimportable, as they are there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_benchmark_driver_scores_and_prints_its_table_row_on_cpu():
    driver = ROOT / "bench" / "gpu_driver.py"
    as_on_the_device = ("import runpy, sys; sys.modules.update(ray=None, datasets=None); "
                        f"sys.argv = [{str(driver)!r}, '--device', 'cpu', '--tiny', '--dtype', 'float32', "
                        "'--docs', '12']; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", as_on_the_device], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = [c.strip() for c in proc.stdout.strip().splitlines()[-1].strip("|").split("|")]
    shape, dtype, docs, requests = row[:4]
    assert (shape, dtype, docs, requests) == ("tiny", "float32", "12", "48")
    docs_per_s, tokens_per_s, tflops = (float(x) for x in row[6:9])  # a tiny model's TFLOP/s rounds to 0.0
    assert docs_per_s > 0 and tokens_per_s > docs_per_s and tflops >= 0
    assert row[9].endswith("%") and int(row[10]) > 0
