#!/usr/bin/env bash
# The GPU checks that fit one 15-minute lease of a lent GPU machine (benchmarks/gpu.sh is the full
# set: hours). Two phases, each one call on the machine (a warm machine keeps .gpu-models/ between):
#
#   bash benchmarks/gpu_lease.sh checks   # exactness on CUDA + the engine review's GPU proofs (~4 min)
#     1. benchmarks/cuda_parity.py: float32 parity with transformers for every supported family,
#        greedy speculative == plain for every drafter (fp32 asserted, bf16 reported), CUDA graphs ==
#        eager, and the sampled law (chi-square, n rollouts per drafter) on the CUDA generator;
#     2. benchmarks/engine_checks.py on a Qwen3-0.6B-shaped random checkpoint (bf16, 151936 ids):
#        one host sync per step, no weight copies per graph replay, no graph skipped, at batch 64,
#        with compile (warm-up) seconds and tokens/s of plain and draft_model k = 3.
#   bash benchmarks/gpu_lease.sh bench    # `wb bench` on that checkpoint (~5 min)
#        ours (CUDA graphs) vs transformers generate() (plain, static cache + compile) at batch 1
#        and 64; draft_model at k = 1, 3 (random weights: read speedups beside the acceptance).
#
# The device machine has no network: pydantic, datasets and platformdirs travel as wheels in .whl/
# (see docs/gpu.md); the command installs them first when .whl/ is there.
# Environment: OUT (results folder, default benchmarks), PYTHON (default python3); GPU_LEASE_SMOKE=1
# runs the same commands on the CPU at toy sizes (checks the script, proves nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:?usage: gpu_lease.sh checks|bench}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-benchmarks}
MODELS=.gpu-models
SMOKE=${GPU_LEASE_SMOKE:-0}
if [[ -d .whl && "$SMOKE" != 1 ]]; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
WB="$PYTHON -m workbench.cli"
if [[ "$SMOKE" == 1 ]]; then
  DEV=cpu N=2000 SHAPE=(--heads 4 --kv-heads 2 --head-dim 16 --hidden 64 --intermediate 128 --vocab-size 4096) LAYERS=2 GRAPHS=() MODELS=$MODELS/smoke
else
  DEV=cuda N=100000 SHAPE=(--heads 16 --kv-heads 8 --head-dim 128 --hidden 1024 --intermediate 3072 --vocab-size 151936) LAYERS=28 GRAPHS=(--cuda-graphs)
fi
mkdir -p "$OUT" "$MODELS"
export WB_CACHE_DIR=$PWD/$MODELS/cache
[[ "$SMOKE" == 1 ]] || nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu-lease-device.csv"

init_qwen3() {  # a random Qwen3-0.6B-shaped checkpoint (gpu.sh's qwen3-0.6b set), kept between calls
  local dir="$MODELS/$1"; shift
  [[ -f "$dir/config.json" ]] || $WB models init qwen3 "$dir" --dtype bfloat16 "${SHAPE[@]}" "$@" >/dev/null
}
T=$MODELS/qwen3-0.6b D=$MODELS/qwen3-0.6b-draft

case "$PHASE" in
  checks)
    timeout 200 $PYTHON benchmarks/cuda_parity.py --device $DEV --n $N --out "$OUT/cuda-parity.json" 2>&1 | grep -v "^info" || echo "cuda_parity: exit $?"
    t0=$(date +%s)
    init_qwen3 qwen3-0.6b --layers $LAYERS --seed 0
    init_qwen3 qwen3-0.6b-draft --layers 2 --seed 1
    echo "checkpoints: $(( $(date +%s) - t0 )) s"
    TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 timeout 170 $PYTHON benchmarks/engine_checks.py --target "$T" --draft "$D" --device $DEV \
      --dtype bfloat16 --batch 64 --max-new-tokens 64 --out "$OUT/engine-checks.json" || echo "engine_checks: exit $?"
    ;;
  bench)
    init_qwen3 qwen3-0.6b --layers $LAYERS --seed 0
    init_qwen3 qwen3-0.6b-draft --layers 2 --seed 1
    TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 timeout 420 $WB bench quickstart drafter.draft_vocab_size=${SHAPE[-1]} --device $DEV --dtype bfloat16 \
      --target "$T" --draft "$D" --drafters draft_model --batch-sizes 1,64 --k 1,3 --max-new-tokens 64 --repeats 3 \
      --model-batch 64 "${GRAPHS[@]}" --out "$OUT" --name gpu-lease-qwen3-0.6b || echo "bench: exit $?"
    ;;
  *) echo "gpu_lease.sh: unknown phase $PHASE (allowed: checks, bench)" >&2; exit 2 ;;
esac
