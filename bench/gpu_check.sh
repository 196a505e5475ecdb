#!/usr/bin/env bash
# The prepared GPU check of issue 30's first part, for one run on an NVIDIA GPU (H200/H100):
#   1. tests/test_gpu_attention.py: cuDNN, tokamax and the Triton flash / paged kernels against
#      the f32 reference on the card (values and gradients, every mask case);
#   2. tests/test_gpu_dequant_matmul.py: the dequantising int8/int4 matmul's Triton kernels
#      (forward and dx) compiled on the card against the f32 reference (issue 27);
#   3. python -m bench.attention: TFLOP/s forward and forward+backward of xla, pallas (the
#      Triton kernels), xla_chunked, cuDNN and tokamax at the README's shapes.
# Everything it prints is also written under $OUT (default ./gpu_check_out): env.txt,
# gpu_tests.log, dequant_tests.log, attention.txt.  Each step has its own time limit so that a
# hang in one still leaves the others' results.  Run from the repository root:
#   bash bench/gpu_check.sh            # full shapes (the step limits below sum to 14 minutes)
#   bash bench/gpu_check.sh --quick    # one small shape per table: a smoke test
set -uo pipefail

OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
QUICK=()
if [[ "${1:-}" == "--quick" ]]; then QUICK=(--quick); fi
export JAX_PLATFORMS=cuda

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
} 2>&1 | tee "$OUT/env.txt"

timeout 300 python -m pytest -q -p no:cacheprovider tests/test_gpu_attention.py 2>&1 \
  | tee "$OUT/gpu_tests.log"
echo "gpu tests exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/gpu_tests.log"

timeout 120 python -m pytest -q -p no:cacheprovider tests/test_gpu_dequant_matmul.py 2>&1 \
  | tee "$OUT/dequant_tests.log"
echo "dequant matmul gpu tests exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/dequant_tests.log"

timeout 420 python -m bench.attention "${QUICK[@]}" 2>&1 | tee "$OUT/attention.txt"
echo "bench.attention exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/attention.txt"
