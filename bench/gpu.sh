#!/usr/bin/env bash
# The one GPU check, for a machine with a GPU (an H200 or H100): random weights of real shapes throughout, every
# step capped so that the whole run ends within GPU_CHECK_S seconds (default 450: under 8 minutes with start-up).
# From the repository root, with lm-eval installed (or its wheel in .whl/) and HellaSwag rows in .gpu-data/
# (bench/gpu_carry.sh puts both there; without them the packaged demo's 300 rows are used):
#   bash bench/gpu.sh
# Steps, most important first (a step that runs out of time or fails says so and the next one starts):
#   1. bench/gpu_numerics.py hellaswag: an 8B shape in bf16, raylm vs lm-eval HFLM on the same GPU and model,
#      every HellaSwag row carried (1,000 offline of 10,042); packed vs unpacked bf16 deltas; docs/s and MFU.
#   2. bench/gpu_numerics.py load: load_model straight onto the GPU (host memory against checkpoint size); the
#      2-GPU device map, scored against one GPU, when the machine has two.
#   3. bench/gpu_numerics.py max-length: peak GPU memory of one long document per --max-length (128k vocabulary).
#   4. bench/gpu_driver.py: scorer throughput and MFU for GPT-2-small and a 1B Llama on DOCS documents, then the
#      1B Llama on MMLU 5-shot's shape (57 subjects x 20 questions: each subject's head cached once per call).
set -u
DOCS=${DOCS:-10000}
GPU_CHECK_S=${GPU_CHECK_S:-450}
PYTHON=${PYTHON:-python3}  # the GPU machine's image: python3 is the interpreter that holds PyTorch
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
DATA=${DATA:-$([ -f .gpu-data/hellaswag/validation.jsonl ] && echo .gpu-data || echo raylm/demo/data)}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
"$PYTHON" -c "import lm_eval; print('lm-eval', lm_eval.__version__)" 2>/dev/null || echo "lm-eval: not carried"

step() {  # step CAP_S COMMAND...: run within min(CAP_S, what is left of GPU_CHECK_S)
  local cap=$1; shift
  local left=$((GPU_CHECK_S - SECONDS))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -le 10 ]; then echo "skipped (time is up): $*"; return; fi
  timeout "$cap" "$@" || echo "failed or timed out after ${cap} s (exit $?): $*"
}

step 200 "$PYTHON" bench/gpu_numerics.py hellaswag --data "$DATA"
step 90 "$PYTHON" bench/gpu_numerics.py load --data "$DATA"
step 70 "$PYTHON" bench/gpu_numerics.py max-length
printf '%s\n' "| shape | dtype | docs | requests | tokenise s | score s | docs/s | tokens/s | TFLOP/s | MFU (790) |"\
" final budget | computed / held tokens |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for shape in gpt2-small llama-1b; do
  step 60 "$PYTHON" bench/gpu_driver.py --shape "$shape" --docs "$DOCS" --device cuda
done
step 60 "$PYTHON" bench/gpu_driver.py --shape llama-1b --task mmlu-5shot --docs 1140 --device cuda
echo "gpu.sh: ${SECONDS} s"
