#!/usr/bin/env bash
# The GPU checks sized for one 15-minute lease of a lent GPU machine (benchmarks/gpu.sh is the full
# set: hours). Three phases, one call each; a warm machine keeps .gpu-models/ between calls. Sizes
# come from the first lease (docs/results/gpu-lease-h100.md, 2026-11-27, H100): a machine starts in
# ~35 s; the eight families' parity took ~45 s; compiling the CUDA-graph engine took ~100 s for a
# 2-layer model and more than 150 s (timed out) for engine_checks at 4 and 28 layers.
#
#   bash benchmarks/gpu_lease.sh parity   # exactness on CUDA, eager (~2-3 min)
#     benchmarks/cuda_parity.py --sections law,families: the sampled law (chi-square, n rollouts per
#     drafter) on the CUDA generator; float32 parity with transformers for every supported family and
#     greedy speculative == plain for every drafter (fp32 asserted, bf16 reported).
#   bash benchmarks/gpu_lease.sh engine   # the CUDA-graph engine (compile-bound: give it ~9 min)
#     cuda_parity.py --sections graphs (compiled with CUDA graphs == eager), then
#     benchmarks/engine_checks.py on a Qwen3-0.6B-shaped random checkpoint (bf16, 151936 ids,
#     CHECK_LAYERS layers, default 28) at batch 8: one host sync per step, no weight copies per graph
#     replay, no graph skipped, with the warm-up (compile) seconds and tokens/s it printed.
#   bash benchmarks/gpu_lease.sh bench    # `wb bench` on that checkpoint (not yet run: compile-bound too)
#     ours (CUDA graphs) vs transformers generate() (plain, static cache + compile) at batch 1 and
#     64; draft_model at k = 1, 3 (random weights: read speedups beside the acceptance).
#
# The device machine has no network: pydantic, datasets and platformdirs travel as wheels in .whl/
# (docs/testing.md, "On a lent GPU"); the script installs them first when .whl/ is there.
# Environment: OUT (results folder, default benchmarks), PYTHON (default python3); GPU_LEASE_SMOKE=1
# runs the same commands on the CPU at toy sizes (checks the script, proves nothing: a tensor left
# on the CPU passes there, which is how the first lease lost its law checks).
set -euo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:?usage: gpu_lease.sh parity|engine|bench}
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
  parity)
    timeout ${PARITY_TIMEOUT:-300} $PYTHON benchmarks/cuda_parity.py --device $DEV --n $N --sections law,families \
      --cases ${PARITY_CASES:-llama,llama3,llama-linear,qwen2,qwen2-window,qwen3,qwen3-yarn,mistral} --out "$OUT/cuda-parity.json" \
      || echo "cuda_parity: exit $?"
    ;;
  engine)
    timeout ${GRAPHS_TIMEOUT:-200} $PYTHON benchmarks/cuda_parity.py --device $DEV --sections graphs --out "$OUT/cuda-parity-graphs.json" \
      || echo "cuda_parity graphs: exit $?"
    t0=$(date +%s)
    init_qwen3 qwen3-0.6b --layers ${CHECK_LAYERS:-$LAYERS} --seed 0
    init_qwen3 qwen3-0.6b-draft --layers 2 --seed 1
    echo "checkpoints: $(( $(date +%s) - t0 )) s"
    TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 timeout ${CHECK_TIMEOUT:-330} $PYTHON benchmarks/engine_checks.py --target "$T" --draft "$D" \
      --device $DEV --dtype bfloat16 --batch 8 --max-new-tokens 32 --out "$OUT/engine-checks.json" || echo "engine_checks: exit $?"
    ;;
  bench)
    init_qwen3 qwen3-0.6b --layers $LAYERS --seed 0
    init_qwen3 qwen3-0.6b-draft --layers 2 --seed 1
    TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 timeout ${BENCH_TIMEOUT:-500} $WB bench quickstart drafter.draft_vocab_size=${SHAPE[-1]} --device $DEV \
      --dtype bfloat16 --target "$T" --draft "$D" --drafters draft_model --batch-sizes 1,64 --k 1,3 --max-new-tokens 64 --repeats 3 \
      --model-batch 64 "${GRAPHS[@]}" --out "$OUT" --name gpu-lease-qwen3-0.6b || echo "bench: exit $?"
    ;;
  *) echo "gpu_lease.sh: unknown phase $PHASE (allowed: parity, engine, bench)" >&2; exit 2 ;;
esac
