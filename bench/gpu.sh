#!/usr/bin/env bash
# bench/gpu.sh: a benchmark series on one GPU (made for an H200) in under 8 minutes; prints the results table.
#
# Usage:
#   bash bench/gpu.sh fetch   # where PyPI is reachable: download into .whl/ the wheels the GPU machine lacks
#   bash bench/gpu.sh [demo]  # on the GPU machine, from the repository root: install .whl/ if present, run
#   bash bench/gpu.sh heads   # the same for the heads series (below)
#   bash bench/gpu.sh packing # the same for the packing series (below)
#   bash bench/gpu.sh fsdp    # the memory series, ddp against fsdp, one rank a GPU (below)
#   bash bench/gpu.sh mfu     # one BERT-base run; its records' MFU against the GPU's peak, pass or fail (below)
#   bash bench/gpu.sh hang    # a hung rank on 2+ GPUs: our watchdog against NCCL's own, pass or fail (below)
#
# On this workplace's device tool: run(command="bash bench/gpu.sh", carry=[".whl"], timeout_s=540), and the
# same with "bash bench/gpu.sh heads" or "bash bench/gpu.sh packing".
# The GPU image has torch and transformers but not datasets, and an older transformers: fetch carries the pinned
# ones (requirements.lock) as wheels; nothing is downloaded there (that machine reaches no network).
#
# What it runs (python -m bench.run --device cuda, see bench/demo.py): the full-size DistilBERT built from its
# config (scratch:distilbert, 66 M parameters, the real 30,522-token vocabulary; the hub is unreachable there) on
# the seed workload (the 50,000 demo samples, 32 per step, 128 tokens): the seed recipe (fp16, every sample padded
# to 128) and ours (dynamic padding, masked-only head, bf16 + tf32), alternating, 2 pairs of 400 steps; then
# single runs: packed 128-token blocks x 256 for MFU, ours with 256 samples per step, and packed + torch_compile.
# Results are written after the pairs and after each single run, so the time limit keeps what was measured.
#
# heads (python -m bench.run --device cuda --series heads, see bench/heads.py): bert-base, roberta-base and
# modernbert-base (ModernBERT-base's own 22 layers) built from their configs, the real series' 30,522-token
# WordPiece on real text from the machine, bf16 + tf32, 256 packed 128-token blocks per step: the dense head and
# the masked-only head alternating, 2 pairs of 60 steps, each run's MFU logged (bench/flops.py: 6 x parameters +
# attention, less the head work the masked-only head skips). The runs go pair after pair across the three
# models, and the results are written after each complete pair, so the time limit keeps whole pairs.
#
# packing (python -m bench.run --device cuda --series packing, see bench/packing.py): bert-base from its config on
# the same text and tokenizer, bf16 + tf32, attention as the job picks it (flash_attention_2 where the flash-attn
# package is installed, which the preflight says; else SDPA, with a per-document mask); 256 blocks of 128 tokens a
# step for packed and packed_crossing, and as many real tokens (about 1,600 lines) a step for dynamic and
# padding_free: each mode's efficiency, 2 repeats of 30 steps of the four modes alternating, then packed and
# packed_crossing from 3 seeds for 100 steps each, every model scored on held-out documents, each alone. Results
# are written after every run, so the time limit keeps what was measured.
#
# fsdp (python -m bench.run --device cuda --series memory, see bench/memory.py): BERT small, medium and base built
# from their configs, 20 steps of 32 x 128 tokens a rank, whole runs through ./entrypoint.sh with
# MLM_SHARDING=ddp then fsdp on every visible GPU (bf16 as the launcher picks it: FSDP2's mixed precision under
# fsdp); each rank's measured training state and the CUDA allocator's peak. On one GPU fsdp shards nothing and the
# figures check its code path; 2 or more GPUs give the saving. Not yet run on a GPU.
#
# mfu (bench/mfu.py): BERT-base from its config, 300 steps of 256 packed 128-token blocks, bf16 + tf32 as the
# launcher picks them, through ./entrypoint.sh; the training records' median MFU (train/run/diagnostics.py) against
# the GPU's dense bf16 peak (train/machine/peaks.py): PASS at 25 % or more with the steps waiting for data 5 % of the
# time or less. Not yet run on a GPU.
#
# hang (2 or more GPUs; NCCL will not put two ranks on one): the demo model on two GPUs, world rank 1 stopped at
# step 20 by the drill (MLM_INJECT_FAULT=hang@20:1), twice: with our watchdog at MLM_HANG_TIMEOUT=60 (ddp_timeout
# 1,800 s), then with it out of the way (MLM_HANG_TIMEOUT=100000) and MLM_DDP_TIMEOUT=120, which leaves it to NCCL's
# own watchdog. PASS when ours ends the run with exit 76 within 300 s of its launch (start-up and 20 steps, the
# 60 s bound, 120 s), rank 1 named and both stacks in logs/; NCCL's time and exit code are printed beside it. Not
# yet run on a GPU.
set -Eeuo pipefail

readonly BUDGET_S=${BENCH_BUDGET_S:-450}   # bench.run's share of the 8 minutes (start-up and copying aside)
readonly WHEELS=${BENCH_WHEELS:-.whl}
readonly WORKDIR=${BENCH_WORKDIR:-/tmp/mlm-bench}
readonly PYTHON=${PYTHON:-python3}
# The versions requirements.lock pins; the GPU image's torch, tokenizers, accelerate, pyarrow and pandas serve.
readonly PINNED=(transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0)

log() { printf '[gpu.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Download the pinned pure-Python wheels for the GPU machine's Python 3.12 (x86-64).
fetch() {
  mkdir -p "$WHEELS"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "${PINNED[@]}"
  ls -l "$WHEELS"
}

# Put the carried wheels ahead of the image's packages, without touching the image's site-packages.
install_wheels() {
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    log "no wheels in $WHEELS: using the image's packages (run 'bash bench/gpu.sh fetch' where PyPI is reachable)"
  fi
}

# Fail in seconds, not minutes, when the machine lacks a GPU or a package.
preflight() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  "$PYTHON" - <<'EOF'
import importlib, importlib.util, torch
assert torch.cuda.is_available(), "no CUDA device visible"
versions = {name: importlib.import_module(name).__version__ for name in ("torch", "transformers", "datasets", "pyarrow")}
# The job's attention (auto) is flash_attention_2 only where flash-attn is installed: say which the runs will get.
flash = "flash-attn installed" if importlib.util.find_spec("flash_attn") else "no flash-attn: SDPA"
print("versions:", versions, "| device:", torch.cuda.get_device_name(), "|", flash)
EOF
}

# One BERT-base run through the entrypoint; bench.mfu reads its records and says PASS or FAIL.
mfu_run() {
  local output=$WORKDIR/mfu
  rm -rf "$output"
  MLM_PYTHON=$PYTHON MLM_CONFIG=configs/demo.yaml MLM_MODEL_NAME_OR_PATH=scratch:bert MLM_DEMO_SAMPLES=80000 \
    MLM_PADDING=packed MLM_MAX_SEQ_LENGTH=128 MLM_PER_DEVICE_TRAIN_BATCH_SIZE=256 MLM_MAX_STEPS=300 \
    MLM_LOGGING_STEPS=25 MLM_EVAL_STRATEGY=no MLM_SAVE_STRATEGY=no MLM_LOG_FORMAT=json MLM_OUTPUT_DIR="$output" \
    timeout --signal=TERM --kill-after=15 "$BUDGET_S" ./entrypoint.sh >"$WORKDIR/mfu.log" 2>&1 ||
    { log "the run failed; its log:"; tail -40 "$WORKDIR/mfu.log"; return 1; }
  "$PYTHON" -m bench.mfu "$output"
}

# One hung run: its seconds from the drill's line to the launcher's exit, and its exit code, on stdout.
hang_run() {
  local output=$WORKDIR/hang-$1 started code=0
  shift
  rm -rf "$output"
  started=$SECONDS
  env MLM_PYTHON="$PYTHON" MLM_CONFIG=configs/demo.yaml MLM_NPROC_PER_NODE=2 MLM_INJECT_FAULT=hang@20:1 \
    MLM_SAVE_STRATEGY=steps MLM_SAVE_STEPS=10 MLM_LOG_FORMAT=text MLM_OUTPUT_DIR="$output" "$@" \
    timeout --signal=TERM --kill-after=15 "$BUDGET_S" ./entrypoint.sh >"$output.log" 2>&1 || code=$?
  echo "$((SECONDS - started)) $code"
}

hang_compare() {
  if (($(nvidia-smi --list-gpus | wc -l) < 2)); then
    log "hang needs 2 or more GPUs (NCCL puts one rank on each): nothing measured"
    return 2
  fi
  local ours ours_s ours_code nccl_s nccl_code
  read -r ours_s ours_code < <(hang_run ours MLM_HANG_TIMEOUT=60)
  read -r nccl_s nccl_code < <(hang_run nccl MLM_HANG_TIMEOUT=100000 MLM_DDP_TIMEOUT=120)
  ours=$WORKDIR/hang-ours
  log "ours: exit $ours_code after $ours_s s from launch; NCCL's watchdog (ddp_timeout 120 s): exit $nccl_code after $nccl_s s"
  grep -m1 "hung: no progress" "$ours.log" || true
  if [[ $ours_code == 76 ]] && ((ours_s <= 300)) && grep -q "hung: no progress.*rank 1 (" "$ours.log" &&
    [[ -s $ours/logs/stacks-rank-0.txt && -s $ours/logs/stacks-rank-1.txt ]]; then
    log "PASS: exit 76 within 300 s of launch, rank 1 named, both stacks kept"
  else
    log "FAIL: expected exit 76 within 300 s of launch naming rank 1 with both stacks; the log's end:"
    tail -20 "$ours.log"
    return 1
  fi
}

main() {
  local series=${1:-demo} latest
  case $series in
    fetch)
      fetch
      return
      ;;
    demo) latest="latest.md" ;;
    heads) latest="latest-heads.md" ;;
    packing) latest="latest-packing.md" ;;
    fsdp) latest="latest-memory.md" ;;
    mfu)
      install_wheels
      preflight
      mfu_run
      return
      ;;
    hang)
      install_wheels
      preflight
      hang_compare
      return
      ;;
    *)
      log "unknown argument '$series': expected fetch, demo, heads, packing, fsdp, mfu or hang"
      return 2
      ;;
  esac
  local started=$SECONDS results=${OUT:-bench/results}
  install_wheels
  preflight
  export PYTHONUNBUFFERED=1
  # timeout keeps the whole script inside its budget; what was written by then is kept.
  local code=0 options=(--series "$series" --no-entrypoint)
  if [[ $series == fsdp ]]; then  # whole runs through ./entrypoint.sh, one rank a GPU
    options=(--series memory --memory-ranks "$(nvidia-smi --list-gpus | wc -l)")
    export MLM_PYTHON=$PYTHON
  fi
  timeout --signal=TERM --kill-after=15 "$BUDGET_S" \
    "$PYTHON" -m bench.run --device cuda "${options[@]}" --workdir "$WORKDIR" --results-dir "$results" || code=$?
  if [[ -n ${OUT:-} ]]; then
    # The runs' logs (not the models) come back with the results, for a failure or a closer look.
    tar czf "$OUT/logs.tgz" -C "$WORKDIR" --exclude=output runs 2>/dev/null || true
  fi
  if ((code != 0)); then
    log "bench.run ended with exit $code after $((SECONDS - started)) s; partial results, if any:"
    cat "$results/$latest" 2>/dev/null || true
  fi
  log "done in $((SECONDS - started)) s"
  return "$code"
}

main "$@"
