#!/usr/bin/env bash
# The GPU benchmark set of issue #7 in one go: `wb bench` on CUDA in bf16 for two models, then one
# summary page. Per model it measures (see `wb bench --help` and workbench/bench/):
#   - our autoregressive engine vs transformers generate(), plain and at its strongest settings
#     (static cache + torch.compile), at batch 1, 8, 64 and 256;
#   - speculative decoding with draft_model and eagle3 at k = 1..7 (performance-model table at the
#     GRPO batch of 64), and draft_model vs transformers assisted generation at batch 1;
#   - peak GPU memory per contender.
# Writes $OUT/gpu-<device>-<model>.json and .md per model and $OUT/gpu-<device>-summary.md, which
# checks the goals: ours >= 1.5x transformers' best at batch 64; eagle3's best k >= 1.5x ours AR.
#
# The two models:
#   small        the `small` preset (12 x 768 Llama, ~104 M) with `small-draft` (2 x 768). Built on
#                first use and cached; the build recipes (workbench/models/pretrain.py, distill.py)
#                train on the CPU today, so build them once beforehand (`wb models build small
#                small-draft`) or leave this set out (GPU_BENCH_SETS=qwen3-0.6b).
#   qwen3-0.6b   a random checkpoint of Qwen3-0.6B's shape (`wb models init qwen3`): 28 layers,
#                hidden 1024, 16 heads, 8 kv heads, head_dim 128, MLP 3072, tied embeddings, q/k norm,
#                rope_theta 1e6, and the real vocabulary of 151936 ids (`--vocab-size`: a ~155 M
#                parameter lm_head, float32 probabilities, top-p sorts and drafters' q tensors at
#                real size; issue #24). Unlike the real checkpoint: random weights (acceptance rates
#                are not those of a trained model: read speedups beside the acceptance length), the
#                workbench's own tokenizer (prompts use its 512 ids; the model samples all 151936),
#                512 positions instead of 40960. Its draft for draft_model: a random 2-layer qwen3 of
#                the same width and vocabulary. eagle3 drafts over the full vocabulary here
#                (drafter.draft_vocab_size=151936): a random target spreads its samples over the
#                whole vocabulary, so a reduced draft vocabulary would cap acceptance at what a
#                real model never shows.
#   qwen3-tiny   (smoke) the same code path on the CPU: 2 small layers, the full 151936-id vocabulary.
# The --cuda-graphs runs set TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1, so a graph torch would skip
# (workbench/rollout/graphs.py) fails the run loudly instead of running un-graphed.
# Per set, benchmarks/engine_checks.py proves or disproves the engine review's GPU claims (issue #24):
# one host sync per step (torch.cuda.set_sync_debug_mode), no weight copies per CUDA-graph replay
# (memcpy device-to-device time under torch.profiler), no graph skipped -> $OUT/<set>-engine-checks.json.
#
# Usage (from anywhere; runs from the checkout holding this script):
#   bash benchmarks/gpu.sh                  # the GPU set, on cuda
#   bash benchmarks/gpu.sh --smoke          # or GPU_SMOKE=1: CPU-sized smoke run (~1 minute on 2 cores)
# Environment:
#   GPU_BENCH_OUT     output folder (default benchmarks)
#   GPU_BENCH_DEVICE  device of the GPU set (default cuda)
#   GPU_BENCH_MODELS  folder kept for the random checkpoints (default: a temporary folder, removed)
#   GPU_BENCH_SETS    which models to run (default "small qwen3-0.6b"; smoke: "micro qwen3-tiny")
#   WB                the CLI (default "$PYTHON -m workbench.cli", PYTHON default python)
set -euo pipefail
cd "$(dirname "$0")/.."

SMOKE=${GPU_SMOKE:-0}
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    *) echo "gpu.sh: unknown argument $arg (allowed: --smoke)" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python}
WB=${WB:-"$PYTHON -m workbench.cli"}
OUT=${GPU_BENCH_OUT:-benchmarks}
DTYPE=bfloat16
QWEN3_VOCAB=151936  # Qwen3's vocabulary (config.json vocab_size), for both qwen3 sets

if [[ "$SMOKE" == 1 ]]; then
  DEVICE=cpu
  SETS=${GPU_BENCH_SETS:-"micro qwen3-tiny"}
  BENCH=(--batch-sizes 1,2 --k 1..2 --max-new-tokens 8 --repeats 1 --model-batch 2)
  OURS=()
  # eagle3's init (trained before its first use, cached): a few prompts and steps
  INIT=(drafter.init.num_prompts=16 drafter.init.steps=4 drafter.init.batch_size=4 rollout.max_new_tokens=16)
else
  DEVICE=${GPU_BENCH_DEVICE:-cuda}
  SETS=${GPU_BENCH_SETS:-"small qwen3-0.6b"}
  BENCH=(--batch-sizes 1,8,64,256 --k 1..7 --max-new-tokens 64 --repeats 3 --model-batch 64)
  # ours at its strongest: CUDA graphs (workbench/rollout/graphs.py; meta.cudagraph_skips in the
  # JSON counts graphs torch declined); if that path fails, the set is re-run with --compile only
  OURS=(--cuda-graphs)
  INIT=(drafter.init.num_prompts=256 drafter.init.steps=200 drafter.init.batch_size=32)
fi

if [[ -n "${GPU_BENCH_MODELS:-}" ]]; then
  MODELS=$GPU_BENCH_MODELS
  mkdir -p "$MODELS"
else
  MODELS=$(mktemp -d)
  trap 'rm -rf "$MODELS"' EXIT
fi

# init_qwen3 NAME ARGS...: a random qwen3 checkpoint in $MODELS/NAME (kept if already there)
init_qwen3() {
  local dir="$MODELS/$1"; shift
  [[ -f "$dir/config.json" ]] || $WB models init qwen3 "$dir" --dtype "$DTYPE" "$@" >/dev/null
}

if [[ "$DEVICE" == cpu ]]; then
  SLUG=cpu
else  # the GPU's name, e.g. nvidia-h100-80gb-hbm3
  SLUG=$($PYTHON -c "from workbench.bench import device_slug; print(device_slug('$DEVICE'))" 2>/dev/null || echo "${DEVICE//:/-}")
fi
mkdir -p "$OUT"
FILES=()
for set in $SETS; do
  case "$set" in
    small) MODEL=(--target small --draft small-draft); EXTRA=() ;;
    micro) MODEL=(--target micro --draft micro-draft); EXTRA=() ;;
    qwen3-0.6b)
      init_qwen3 qwen3-0.6b --layers 28 --hidden 1024 --heads 16 --kv-heads 8 --head-dim 128 --intermediate 3072 --vocab-size "$QWEN3_VOCAB" --seed 0
      init_qwen3 qwen3-0.6b-draft --layers 2 --hidden 1024 --heads 16 --kv-heads 8 --head-dim 128 --intermediate 3072 --vocab-size "$QWEN3_VOCAB" --seed 1
      MODEL=(--target "$MODELS/qwen3-0.6b" --draft "$MODELS/qwen3-0.6b-draft"); EXTRA=(drafter.draft_vocab_size="$QWEN3_VOCAB") ;;
    qwen3-tiny)
      init_qwen3 qwen3-tiny --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --intermediate 128 --vocab-size "$QWEN3_VOCAB" --seed 0
      init_qwen3 qwen3-tiny-draft --layers 1 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --intermediate 128 --vocab-size "$QWEN3_VOCAB" --seed 1
      # eagle3's head over 32000 ids (Qwen3 EAGLE3 heads' draft vocabulary) keeps the smoke run short;
      # its q tensors still span all 151936 ids
      MODEL=(--target "$MODELS/qwen3-tiny" --draft "$MODELS/qwen3-tiny-draft"); EXTRA=(drafter.draft_vocab_size=32000) ;;
    *) echo "gpu.sh: unknown set $set (allowed: small, qwen3-0.6b, micro, qwen3-tiny)" >&2; exit 2 ;;
  esac
  name="gpu-$SLUG-$set"
  echo "== $name"
  run_set() {
    $WB bench quickstart "${INIT[@]}" "${EXTRA[@]}" --device "$DEVICE" --dtype "$DTYPE" "${MODEL[@]}" \
      --drafters draft_model,eagle3 "${BENCH[@]}" "$@" --out "$OUT" --name "$name"
  }
  if [[ ${#OURS[@]} -gt 0 ]]; then
    # a cudagraph torch would skip (graphs.py) fails here instead of silently running un-graphed
    TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 run_set "${OURS[@]}" || { echo "gpu.sh: ${OURS[*]} failed for $set; re-running with --compile" >&2; run_set --compile; }
  else
    run_set
  fi
  FILES+=("$OUT/$name.json")
  # the engine review's proofs (issue #24): one host sync per step, no weight copies per graph
  # replay (profiled memcpy DtoD time), no graph skipped; on the CPU (smoke) the script runs, skipped
  TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 $PYTHON benchmarks/engine_checks.py "${MODEL[@]}" --device "$DEVICE" --dtype "$DTYPE" \
    $([[ "$SMOKE" == 1 ]] && echo "--batch 2 --max-new-tokens 8") --out "$OUT/$name-engine-checks.json" \
    || echo "gpu.sh: engine checks FAILED for $set (see $OUT/$name-engine-checks.json)" >&2
  # ours vs vLLM (rollout.backend=vllm's engine; docs/vllm.md) where vllm is installed:
  # plain and greedy speculative draft_model, paired with 95 % CIs (not in smoke mode)
  if [[ "$SMOKE" != 1 ]] && $PYTHON -c "import vllm" >/dev/null 2>&1; then
    $WB bench quickstart "${EXTRA[@]}" --device "$DEVICE" --dtype "$DTYPE" "${MODEL[@]}" rollout.vllm.enforce_eager=false \
      --vllm draft_model --only-vllm --batch-sizes 1,8,64 --max-new-tokens 64 --repeats 5 --out "$OUT" --name "$name-vllm" \
      || echo "gpu.sh: the vLLM comparison failed for $set" >&2
  fi
done

$WB bench-summary "${FILES[@]}" --out "$OUT/gpu-$SLUG-summary.md" \
  --title "GPU benchmark summary ($SLUG, $DTYPE$([[ "$SMOKE" == 1 ]] && echo ', smoke mode'))"
echo "results: ${FILES[*]} and $OUT/gpu-$SLUG-summary.md"
