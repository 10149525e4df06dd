#!/usr/bin/env bash
# Run HERE (a machine with the package registry), before bench/gpu.sh runs on a GPU machine without it:
# puts into git-ignored folders what the GPU machine's image lacks, for the device run to carry.
#   .whl/       lm-eval 0.4.13's wheel (pure Python; HFLM needs nothing else the image lacks: torch, transformers,
#               accelerate, numpy, jinja2, pyyaml, tqdm are there; Ray and datasets are not, and are not needed)
#   .gpu-data/  HellaSwag's 1,000 offline validation rows (the packaged demo has 300; the full set is 10,042)
# Then, on the device: `run` with carry [".whl", ".gpu-data"] and the command `bash bench/gpu.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .gpu-data/hellaswag
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl lm-eval==0.4.13
xz -dc tests/data/hellaswag/validation.jsonl.xz > .gpu-data/hellaswag/validation.jsonl
du -sh .whl .gpu-data
