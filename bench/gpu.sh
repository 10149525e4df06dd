#!/usr/bin/env bash
# One prepared run for a lent accelerator (an H200): scorer throughput and MFU for GPT-2-small, a 1B and an 8B
# Llama shape (random init, bf16) on HellaSwag rows repeated to DOCS documents. Run from the repository root:
#   bash bench/gpu.sh            # DOCS=10000 by default; each shape capped at SHAPE_TIMEOUT seconds
set -u
DOCS=${DOCS:-10000}
SHAPE_TIMEOUT=${SHAPE_TIMEOUT:-150}
PYTHON=${PYTHON:-python3}  # the lent H200 image: python3 is the interpreter that holds PyTorch
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "| shape | dtype | docs | requests | tokenise s | score s | docs/s | tokens/s | TFLOP/s | MFU (790) | final budget |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for shape in gpt2-small llama-1b llama-8b; do
  timeout "$SHAPE_TIMEOUT" "$PYTHON" bench/gpu_driver.py --shape "$shape" --docs "$DOCS" --device cuda \
    || echo "| $shape | failed or timed out (exit $?) |"
done
