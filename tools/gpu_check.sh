#!/usr/bin/env bash
# The GPU checks of issue 7, as one script for a lent GPU machine (transformers engine on CUDA):
#   1. the lossless greedy test (tests/e2e/test_lossless_greedy.py), tiny models built there,
#      both services and the reference on CUDA (SPECDEC_DEVICE=cuda);
#   2. the verify-cost curve t(k)/t(1), k = 1..16, random-initialised Llama-8B shape, bf16.
# The machine has torch and transformers but not our gRPC/OTel pins: those travel as wheels in .whl/
# (see docs/gpu.md). Results land in $OUT (default bench/results/gpu).
set -u
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, grpc, google.protobuf as pb; print('torch', torch.__version__, 'transformers', transformers.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
echo "==> 1. lossless greedy test on CUDA"
SPECDEC_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/e2e/test_lossless_greedy.py 2>&1 \
  | tee "$OUT/lossless_greedy_cuda.log" | tail -15
echo "==> 2. verify-cost curve, Llama-8B shape, bf16"
timeout 240 python3 -m bench verify-cost --config llama-8b --device cuda --dtype bfloat16 --max-k 16 \
  --contexts 200,1500 --repeats 30 --out "$OUT/verify_cost_llama8b_bf16" 2>&1 | grep -v "verify cost:"
