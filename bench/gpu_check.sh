#!/usr/bin/env bash
# GPU check for an NVIDIA machine (never run in CI): at most 8 minutes, prints what it found.
#
# usage: bash bench/gpu_check.sh            # from the repository root (or the image's working directory)
#        PYTHON=/opt/venv/bin/python bash bench/gpu_check.sh
#
# 1. entrypoint.sh gpus and plan on this machine
# 2. NVML's GPU count (after CUDA_VISIBLE_DEVICES) == torch.cuda.device_count()
# 3. a short real training run through the launcher with the precision it picks (the demo, from scratch, offline)
# 4. with 2+ GPUs: the same run without torchrun (the Trainer then uses nn.DataParallel), for docs/performance.md's numbers
set -Eeuo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
PYTHON="${PYTHON:-python3}"
# entrypoint.sh runs python3: make it this one.
PATH="$(dirname "$(command -v "$PYTHON")"):$PATH"
export PATH HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
WORK="$(mktemp -d)"
export HF_HOME="$WORK/hf"
trap 'rm -rf "$WORK"' EXIT
STEP_TIMEOUT="${STEP_TIMEOUT:-180}"
# The demo sized for seconds on one GPU: 20,000 samples, one epoch, no dataloader workers to keep /dev/shm out of it.
DEMO=(MLM_CONFIG=configs/demo.yaml MLM_DEMO_SAMPLES=20000 MLM_NUM_TRAIN_EPOCHS=1 MLM_DATALOADER_NUM_WORKERS=0
	MLM_LOG_FORMAT=text MLM_REQUIRE_GPU=true)

section() { printf '\n===== %s\n' "$*"; }
fail() {
	printf 'gpu_check: FAIL: %s\n' "$*" >&2
	exit 1
}

section "nvidia-smi"
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,compute_cap --format=csv || echo "(no nvidia-smi)"

section "entrypoint.sh gpus"
timeout 60 ./entrypoint.sh gpus

section "entrypoint.sh plan"
env "${DEMO[@]}" MLM_OUTPUT_DIR="$WORK/plan" timeout 120 ./entrypoint.sh plan >"$WORK/plan.json"
"$PYTHON" - "$WORK/plan.json" <<'EOF'
import json, sys
plan = json.load(open(sys.argv[1]))
for key in ("nproc_per_node", "nnodes", "backend", "precision", "tf32", "batch", "warnings", "env"):
    print(f"{key:>16}: {plan[key]}")
print(f"{'command':>16}: {' '.join(plan['command'])}")
EOF

section "NVML count == torch.cuda.device_count()"
CUDA_DEVICE_ORDER=PCI_BUS_ID timeout 120 "$PYTHON" - <<'EOF' || fail "NVML and torch disagree"
import sys, torch
from train.machine.gpus import detect
inventory = detect()
nvml, cuda = len(inventory.gpus), torch.cuda.device_count()
print(f"NVML (after CUDA_VISIBLE_DEVICES): {nvml}   torch.cuda.device_count(): {cuda}   torch CUDA {torch.version.cuda}")
for i, gpu in enumerate(inventory.gpus):
    props = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i}  NVML {gpu.name} cc {gpu.compute_capability}   torch {props.name} cc {(props.major, props.minor)}")
    assert gpu.compute_capability == (props.major, props.minor), "device order differs between NVML and CUDA"
sys.exit(0 if nvml == cuda and nvml > 0 else 1)
EOF

run_demo() { # run_demo NAME COMMAND...: train the demo, print time and results
	local name="$1"
	shift
	local out="$WORK/$name"
	local start end
	start=$(date +%s)
	env "${DEMO[@]}" MLM_OUTPUT_DIR="$out" timeout "$STEP_TIMEOUT" "$@" >"$WORK/$name.log" 2>&1 ||
		{
			tail -40 "$WORK/$name.log"
			fail "$name: exit $?"
		}
	end=$(date +%s)
	grep -E "^mlm-trainer: (CPU|[0-9]+ GPU|batch|warning)" "$WORK/$name.log" || true
	[[ -d "$out/final" ]] || fail "$name: no final/ written"
	"$PYTHON" - "$out" "$((end - start))" "$name" <<'EOF'
import json, sys
out, wall, name = sys.argv[1], sys.argv[2], sys.argv[3]
results = json.load(open(f"{out}/all_results.json"))
run = json.load(open(f"{out}/run.json"))
config = run["config"]
precision = "bf16" if config["bf16"] else "fp16" if config["fp16"] else "fp32"
print(f"{name}: wall {wall}s  world_size {run['world_size']}  precision {precision} tf32 {config['tf32']}")
for key in ("train_runtime", "train_samples_per_second", "train_tokens_per_second", "eval_loss", "perplexity"):
    print(f"  {key:>26}: {results.get(key)}")
EOF
}

section "training through the launcher (torchrun, one rank per GPU, default precision)"
run_demo torchrun ./entrypoint.sh train

GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
if ((GPUS >= 2)); then
	section "the same without torchrun: one process, nn.DataParallel over $GPUS GPUs"
	# The launcher's decisions (precision, backend) passed by hand; no torchrun, so no LOCAL_RANK and no DDP.
	FLAGS=$("$PYTHON" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["decision_flags"]))' "$WORK/plan.json")
	# shellcheck disable=SC2086 # the flags are words
	run_demo dataparallel "$PYTHON" -m train.run.job $FLAGS
fi

section "gpu_check: OK"
