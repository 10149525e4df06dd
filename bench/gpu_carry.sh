#!/usr/bin/env bash
# For a GPU machine without network access: run this on a machine with one, beside the test data, and copy the
# two git-ignored folders it writes into the checkout on the GPU machine before `bash bench/gpu.sh` (CONTRIBUTING.md).
#   .whl/       lm-eval 0.4.13's wheel (pure Python; HFLM needs nothing else beyond torch, transformers,
#               accelerate, numpy, jinja2, pyyaml and tqdm; neither Ray nor datasets is needed)
#   .gpu-data/  HellaSwag's 1,000 offline validation rows (the packaged demo has 300; the full set is 10,042)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .gpu-data/hellaswag
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl lm-eval==0.4.13
xz -dc tests/data/hellaswag/validation.jsonl.xz > .gpu-data/hellaswag/validation.jsonl
du -sh .whl .gpu-data
