#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (transformers engine on CUDA).
#
#   tools/gpu_check.sh [--device cuda|cpu] [--out DIR] [--steps efficiency|lossless,verify-cost,efficiency|all]
#
# Steps (default: efficiency, sized to finish within 8 minutes on an H200):
#   efficiency   issue 36: the efficiency surface on the GPU. Random weights in two real shapes, built in code
#                (Qwen2.5-Coder-1.5B, Llama-3.1-8B), bf16; the three services as real processes (two verifiers on
#                CUDA: serial and pipelined, a gateway each), the replay draft on the CPU (a set acceptance:
#                draft_service/replay.py); off, serial and pipelined at alpha 0.5, 0.7, 0.9, k from the policy and
#                fixed at 4, 1 and 8 streams; per round the forward, the draft wait and the transport; and HF
#                transformers' assisted generation in-process with the same replayed drafts (the anchor).
#   lossless     issue 7: the lossless greedy test (tests/e2e/test_lossless_greedy.py) on CUDA.
#   verify-cost  issue 7: the verify-cost curve t(k)/t(1), k = 1..16, Llama-8B shape, bf16.
# --device cpu is the dry run, which tests/tools/test_gpu_check.py runs: the efficiency step in float32 on two tiny
# shapes, both built and run end to end: llama-tiny over the whole grid at 1 and 2 streams, qwen2-tiny in one cell
# (serial, 1 stream, alpha 0.7, k = 4), each with the anchor, one torch thread a verifier.
#
# The GPU machine has torch and transformers but not our gRPC/OTel pins: those travel as wheels in .whl/
# (see docs/gpu.md). Results land in --out, else $OUT, else $SPECDEC_GPU_OUT, else bench/results/gpu; keep them
# under bench/results/gpu/. PYTHON picks the interpreter (default python3); EFFICIENCY_DTYPE the GPU dtype
# (default bfloat16; float32 where the rows show many rounds without a draft, see docs/gpu.md).
set -u
DEVICE=cuda
STEPS=efficiency
OUT=${OUT:-${SPECDEC_GPU_OUT:-bench/results/gpu}}
PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_check.sh: --device cuda or cpu, not $DEVICE" >&2; exit 2 ;; esac
[ "$STEPS" = all ] && STEPS=lossless,verify-cost,efficiency
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
{
  [ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, transformers, grpc, google.protobuf as pb; print('torch', torch.__version__, 'transformers', transformers.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
status=0
step() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

if step lossless; then
  echo "==> lossless greedy test on CUDA"
  SPECDEC_DEVICE=cuda timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/e2e/test_lossless_greedy.py 2>&1 \
    | tee "$OUT/lossless_greedy_cuda.log" | tail -15
fi
if step verify-cost; then
  echo "==> verify-cost curve, Llama-8B shape, bf16"
  timeout 240 "$PY" -m bench verify-cost --config llama-8b --device cuda --dtype bfloat16 --max-k 16 \
    --contexts 200,1500 --repeats 30 --out "$OUT/verify_cost_llama8b_bf16" 2>&1 | grep -v "verify cost:"
fi
if step efficiency; then
  # shape, time limit (s), prompts, max tokens, then the grid (alphas, ks, modes, streams): on CUDA, what fits 8
  # minutes for both shapes on an H200; the CPU dry run covers the whole grid once, on the first tiny shape
  if [ "$DEVICE" = cuda ]; then
    grid="0.5,0.7,0.9:policy,4:serial,pipelined:1,8"
    shapes="qwen2.5-coder-1.5b:200:2:32:$grid llama-8b:260:2:32:$grid"; dtype=${EFFICIENCY_DTYPE:-bfloat16}
    cpu_args=()
  else
    shapes="llama-tiny:150:1:12:0.5,0.7,0.9:policy,4:serial,pipelined:1,2 qwen2-tiny:150:1:12:0.7:4:serial:1"
    dtype=float32
    cpu_args=(--threads 1)  # two CPU verifiers and this process share the cores: one torch thread each
  fi
  for spec in $shapes; do
    IFS=: read -r shape limit prompts tokens alphas ks modes streams <<<"$spec"
    echo "==> efficiency surface, $shape shape (random init), $dtype on $DEVICE"
    timeout "$limit" "$PY" -m bench efficiency --config "$shape" --device "$DEVICE" --dtype "$dtype" \
      --alphas "$alphas" --ks "$ks" --modes "$modes" --concurrency "$streams" --prompts "$prompts" \
      --prompt-tokens 128 --max-tokens "$tokens" --repeats 1 --anchor ${cpu_args[@]+"${cpu_args[@]}"} \
      --out "$OUT/efficiency_$shape" > "$OUT/efficiency_$shape.log" 2>&1
    rc=$?
    grep -v "it/s\]\|run/s\]\|s/run\]" "$OUT/efficiency_$shape.log" | tail -40
    if [ $rc -ne 0 ]; then
      echo "efficiency $shape: exit $rc (124: past its ${limit} s; the rows done so far are in $OUT/efficiency_$shape/)"
      status=1
    fi
  done
fi
exit $status
