#!/usr/bin/env bash
# Build docker/Dockerfile where there is no Docker engine and no registry (podman, a Debian 12 base made with
# debootstrap, the locked wheels from a wheelhouse) and run it as `docker run` would, checking what the image
# promises: the demo trains as an arbitrary --user on a read-only root filesystem, final/ loads back, files on the
# bind mount belong to the caller, `plan` reports CPU mode, the installed packages are exactly the lock and the
# SBOM build.sh wrote lists them, any other UID can write HOME/HF_HOME//output, `docker stop` mid-training ends
# in exit 75 with a checkpoint, and that a second build of the same commit with no layer cache has the same image
# ID.
#
# usage: bash docker/image-test.sh          (make image-test; as root, with .ci/system-deps.sh's packages)
#        bash docker/image-test.sh base     only make the Debian base, kept for the next run (make test does this
#                                           while it installs .venv: the base needs neither the venv nor its wheels)
#
# Settings (environment, optional):
#   IMAGE_TEST_DIR=DIR   podman storage, the cached base image, the wheelhouse, logs (default build/podman)
#   IMAGE_TEST_IMAGE=REF the tag built and tested (default localhost/mlm-trainer:image-test)
#   IMAGE_TEST_REPRODUCIBLE=0  skip the second build (about 3 minutes here) that compares the image IDs
# Only BASE_IMAGE differs from the real build (docker/build.sh does both).
set -Eeuo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${IMAGE_TEST_DIR:-$REPO/build/podman}"
IMAGE="${IMAGE_TEST_IMAGE:-localhost/mlm-trainer:image-test}"
BASE="localhost/mlm-trainer-base:bookworm"
RUN_AS="1234:1234"
PYTHON="$REPO/.venv/bin/python"
# Like `docker run --read-only --tmpfs /tmp`: podman would otherwise add tmpfs mounts of its own on /var/tmp, /run.
READ_ONLY=(--read-only --read-only-tmpfs=false --tmpfs /tmp)
# The demo needs no network, and a sandbox may not give containers one.
RUN=(podman run --rm --network none)

CHECKS=0
PHASE=""
REBUILD="" # the second build's process while it runs (check_reproducible)
PHASE_START=0
TIMINGS=()

_log() {
	printf '%s image-test: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2
}

# phase NAME: close the running phase (recording its duration) and start NAME.
phase() {
	local now
	now="$(date +%s)"
	[[ -n "$PHASE" ]] && TIMINGS+=("$(printf '%-10s %5ss' "$PHASE" "$((now - PHASE_START))")")
	PHASE="${1:-}"
	PHASE_START="$now"
	[[ -n "$PHASE" ]] && _log "== $PHASE"
	return 0
}

# On any exit: the time each phase took, and the verdict.
_finish() {
	local code=$?
	if [[ -n "${REBUILD:-}" ]]; then # failed before the second build was compared: it is of no use now
		kill "$REBUILD" 2>/dev/null || true
		wait "$REBUILD" 2>/dev/null || true
	fi
	phase ""
	_log "phase timings:"
	printf '  %s\n' "${TIMINGS[@]}" >&2
	if ((code == 0)); then
		_log "all $CHECKS checks passed"
	else
		_log "FAILED (exit $code); logs in $WORK/logs"
	fi
}

fail() {
	_log "FAIL: $*"
	exit 1
}

passed() {
	CHECKS=$((CHECKS + 1))
	_log "ok: $*"
}

# show_log FILE: its last lines, when a step that logs to a file fails.
show_log() {
	_log "last lines of $1:"
	tail -n 40 "$1" >&2
}

# Private podman settings (storage, cgroups/ulimits this sandbox allows), nothing written outside WORK.
setup_podman() {
	command -v podman >/dev/null || fail "podman is missing: run bash .ci/system-deps.sh (as root)"
	mkdir -p "$WORK/graph" "$WORK/run" "$WORK/tmp" "$WORK/logs"
	cat >"$WORK/storage.conf" <<-EOF
		[storage]
		driver = "overlay"
		graphroot = "$WORK/graph"
		runroot = "$WORK/run"
	EOF
	# runc: crun fails with cgroups in hybrid mode; ulimits: no CAP_SYS_RESOURCE to raise the defaults.
	cat >"$WORK/containers.conf" <<-EOF
		[containers]
		default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
		[engine]
		runtime = "runc"
		tmp_dir = "$WORK/tmp"
	EOF
	export CONTAINERS_STORAGE_CONF="$WORK/storage.conf" CONTAINERS_CONF="$WORK/containers.conf"
}

# The stand-in for the CUDA base: Debian 12 minbase from debootstrap, made once and kept in WORK's storage.
make_base() {
	if podman image exists "$BASE"; then
		_log "base $BASE already made"
		return
	fi
	command -v debootstrap >/dev/null || fail "debootstrap is missing: run bash .ci/system-deps.sh (as root)"
	local rootfs="$WORK/rootfs"
	rm -rf "$rootfs"
	debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$WORK/logs/debootstrap.log" 2>&1 ||
		{
			show_log "$WORK/logs/debootstrap.log"
			fail "debootstrap"
		}
	tar -C "$rootfs" --numeric-owner -c . | podman import --quiet --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
	rm -rf "$rootfs"
}

# Every wheel of the locks for this machine's Python (3.11, as Debian 12's), PyPI's torch among them: the build
# then installs with no index at all. pip skips the wheels already there.
make_wheelhouse() {
	mkdir -p "$WORK/wheelhouse"
	"$PYTHON" -m pip download --quiet --require-hashes --only-binary :all: -r "$REPO/requirements.lock" \
		-r "$REPO/requirements-cuda.lock" -d "$WORK/wheelhouse" >"$WORK/logs/wheelhouse.log" 2>&1 ||
		{
			show_log "$WORK/logs/wheelhouse.log"
			fail "pip download"
		}
	_log "wheelhouse: $(find "$WORK/wheelhouse" -name '*.whl' | wc -l) wheels, $(du -sh "$WORK/wheelhouse" | cut -f1)"
}

build_image() {
	rm -f "$WORK/sbom.cdx.json"
	ENGINE=podman BASE_IMAGE="$BASE" WHEELHOUSE="$WORK/wheelhouse" SBOM="$WORK/sbom.cdx.json" \
		bash "$REPO/docker/build.sh" "$IMAGE" >"$WORK/logs/build.log" 2>&1 ||
		{
			show_log "$WORK/logs/build.log"
			fail "the image build"
		}
	tail -n 3 "$WORK/logs/build.log" >&2
	local user
	user="$(podman image inspect --format '{{.Config.User}}' "$IMAGE")"
	[[ -n "$user" && "${user%%:*}" != 0 && "${user%%:*}" != root ]] || fail "the image's default USER is '$user'"
	passed "image built; default user $user (non-root)"
}

# The tiny demo, as `docker run --user 1234:1234 --read-only --tmpfs /tmp -v data:/data:ro -v out:/output`.
run_demo() {
	local data="$WORK/case/data" out="$WORK/case/out"
	rm -rf "$WORK/case"
	mkdir -p "$data"
	echo "A line of input that must stay read-only." >"$data/input.txt"
	# The caller's own output directory, as a user's bind mount would be.
	install -d -o "${RUN_AS%%:*}" -g "${RUN_AS#*:}" "$out"
	local code=0
	"${RUN[@]}" --user "$RUN_AS" "${READ_ONLY[@]}" -v "$data:/data:ro" -v "$out:/output" \
		-e MLM_DEMO_SAMPLES=400 -e MLM_NUM_TRAIN_EPOCHS=1 "$IMAGE" >"$WORK/logs/demo.log" 2>&1 || code=$?
	tail -n 25 "$WORK/logs/demo.log" >&2
	((code == 0)) || fail "the demo exited $code (log: $WORK/logs/demo.log)"
	passed "demo trained (exit 0) as $RUN_AS on a read-only root filesystem"

	"$PYTHON" - "$out/final" <<-'EOF' || fail "$out/final does not load back"
		import sys

		from transformers import AutoModelForMaskedLM, AutoTokenizer

		model = AutoModelForMaskedLM.from_pretrained(sys.argv[1])
		tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
		batch = tokenizer(f"This is a {tokenizer.mask_token} sample.", return_tensors="pt")
		logits = model(**batch).logits
		assert logits.shape[-1] == model.config.vocab_size, logits.shape
		print(f"final/: {type(model).__name__}, {model.num_parameters()} parameters, logits {tuple(logits.shape)}")
	EOF
	passed "out/final loads back with AutoModelForMaskedLM and AutoTokenizer"

	local foreign count
	count="$(find "$out" -mindepth 1 | wc -l)"
	foreign="$(find "$out" -mindepth 1 \( ! -uid "${RUN_AS%%:*}" -o ! -gid "${RUN_AS#*:}" \) -printf '%u:%g %p\n')"
	((count > 0)) || fail "nothing was written to the output bind mount"
	[[ -z "$foreign" ]] || fail "files in the output not owned by $RUN_AS:"$'\n'"$foreign"
	passed "all $count paths written to the bind mount belong to $RUN_AS"

	local label
	label="$(podman image inspect --format '{{index .Config.Labels "org.opencontainers.image.revision"}}' "$IMAGE")"
	"$PYTHON" - "$out/run.json" "$label" <<-'EOF' || fail "run.json does not record the image's revision"
		import json
		import sys

		recorded = json.load(open(sys.argv[1]))["image_revision"]
		assert recorded == sys.argv[2], f"run.json image_revision {recorded!r}, image label {sys.argv[2]!r}"
	EOF
	passed "run.json records the image revision ($label)"

	local source
	source="$(podman image inspect --format '{{index .Config.Labels "org.opencontainers.image.source"}}' "$IMAGE")"
	[[ "$source" =~ ^(https?|ssh):// || "$source" == git@* ]] ||
		fail "the image's org.opencontainers.image.source label is not a public URL: $source"
	passed "the image names its source: $source"
}

# `plan` inside the container: CPU mode, gloo, no GPUs (this machine has none).
check_plan() {
	"${RUN[@]}" --user "$RUN_AS" "${READ_ONLY[@]}" "$IMAGE" plan >"$WORK/logs/plan.json" 2>"$WORK/logs/plan.err" ||
		{
			show_log "$WORK/logs/plan.err"
			fail "plan"
		}
	"$PYTHON" - "$WORK/logs/plan.json" <<-'EOF' || fail "plan does not report CPU mode ($WORK/logs/plan.json)"
		import json
		import sys

		plan = json.load(open(sys.argv[1]))
		assert plan["cpu_mode"] is True, plan["cpu_mode"]
		assert plan["backend"] == "gloo", plan["backend"]
		assert plan["gpus"] == [], plan["gpus"]
		print(f"plan: cpu_mode, backend {plan['backend']}, {plan['nproc_per_node']} process(es), {plan['cpu_reason']}")
	EOF
	passed "plan reports CPU mode (backend gloo, no GPUs)"
}

# pip freeze in the image == requirements.lock (torch's +cpu local label aside; pip itself included: it is locked).
check_freeze() {
	"${RUN[@]}" --user "$RUN_AS" "${READ_ONLY[@]}" "$IMAGE" pip freeze --all >"$WORK/logs/freeze.txt" ||
		fail "pip freeze in the image"
	"$PYTHON" - "$REPO/requirements.lock" "$WORK/logs/freeze.txt" <<-'EOF' || fail "pip freeze differs from the lock"
		import re
		import sys

		def pins(path):
		    found = {}
		    for line in open(path):
		        if m := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;+]+)", line):
		            found[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
		    return found

		lock, image = pins(sys.argv[1]), pins(sys.argv[2])
		diff = sorted(set(lock.items()) ^ set(image.items()))
		for name, version in diff:
		    print(f"  {name}=={version}: {'only in the lock' if lock.get(name) == version else 'only in the image'}")
		assert not diff, "pip freeze != requirements.lock"
		print(f"pip freeze: the {len(image)} packages of requirements.lock")
	EOF
	passed "pip freeze == requirements.lock"
}

# The SBOM build.sh wrote: the packages pip freeze listed (check_freeze), torch at the lock's version, the base.
check_sbom() {
	local sbom="$WORK/sbom.cdx.json"
	local id
	id="$(podman image inspect --format '{{.Id}}' "$IMAGE")"
	"$PYTHON" - "$sbom" "$REPO/requirements.lock" "$WORK/logs/freeze.txt" "$BASE" "sha256:${id#sha256:}" <<-'EOF' ||
		import json
		import re
		import sys

		def norm(name):
		    return re.sub(r"[-_.]+", "-", name).lower()

		bom = json.load(open(sys.argv[1]))
		assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6", (bom["bomFormat"], bom["specVersion"])
		listed = {norm(c["name"]): c["version"] for c in bom["components"] if c["type"] == "library"}
		torch = re.search(r"^torch==(\S+)", open(sys.argv[2]).read(), re.M)[1]
		assert listed["torch"].split("+")[0] == torch, f"SBOM torch {listed['torch']}, requirements.lock {torch}"
		freeze = {norm(n): v for n, _, v in (line.partition("==") for line in open(sys.argv[3]).read().split())}
		assert listed == freeze, f"SBOM != pip freeze: {sorted(set(listed.items()) ^ set(freeze.items()))}"
		props = {p["name"]: p["value"] for p in bom["metadata"]["properties"]}
		assert props["mlm-trainer:base-image"] == sys.argv[4], props
		assert props["mlm-trainer:image.id"] == sys.argv[5], (props["mlm-trainer:image.id"], sys.argv[5])
		base = next(c for c in bom["components"] if c["bom-ref"] == "base-image")
		print(f"SBOM: {len(listed)} Python packages (torch {listed['torch']}), base {base['name']}:{base['version']}")
	EOF
		fail "$sbom does not list what the image holds"
	passed "SBOM lists the image's packages (torch at the locked version), its base image and its ID"
}

# The same commit built again with no layer cache gives the same image ID (docker/build.sh dates the image and its
# files by the commit, the Dockerfile leaves nothing that varies). On a difference: which layers, and which files
# in them, so that the step that varies can be found. The second build starts once the first is done and runs while
# the image is exercised (demo, checks, stop): it is mostly unpacking wheels, they are mostly waiting.
start_rebuild() {
	ENGINE=podman BASE_IMAGE="$BASE" WHEELHOUSE="$WORK/wheelhouse" SBOM="$WORK/sbom-again.cdx.json" \
		bash "$REPO/docker/build.sh" "$IMAGE-again" --no-cache >"$WORK/logs/build-again.log" 2>&1 &
	REBUILD=$!
}

check_reproducible() {
	local again="$IMAGE-again" first second
	wait "$REBUILD" ||
		{
			REBUILD=""
			show_log "$WORK/logs/build-again.log"
			fail "the second image build"
		}
	REBUILD=""
	first="$(podman image inspect --format '{{.Id}}' "$IMAGE")"
	second="$(podman image inspect --format '{{.Id}}' "$again")"
	if [[ "$first" != "$second" ]]; then
		differing_layers "$IMAGE" "$again"
		fail "two builds of the same commit differ: image IDs $first and $second"
	fi
	podman rmi "$again" >/dev/null
	passed "a second build with no layer cache has the same image ID (sha256:${first#sha256:})"
}

# differing_layers IMAGE1 IMAGE2: the layers (by position) whose digests differ, and the files that differ in them.
differing_layers() {
	local dir="$WORK/tmp/layers" i
	rm -rf "$dir"
	mkdir -p "$dir"
	podman save --quiet --format docker-dir -o "$dir/a" "$1"
	podman save --quiet --format docker-dir -o "$dir/b" "$2"
	local -a a b
	read -ra a <<<"$(podman image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "$1")"
	read -ra b <<<"$(podman image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "$2")"
	for i in "${!a[@]}"; do
		[[ "${a[i]}" == "${b[i]:-}" ]] && continue
		_log "layer $((i + 1)) of ${#a[@]} differs; files:"
		mkdir -p "$dir/$i/a" "$dir/$i/b"
		tar -xf "$dir/a/${a[i]#sha256:}" -C "$dir/$i/a" 2>/dev/null || true
		tar -xf "$dir/b/${b[i]#sha256:}" -C "$dir/$i/b" 2>/dev/null || true
		diff -rq --no-dereference "$dir/$i/a" "$dir/$i/b" | head -n 20 >&2 || true
	done
	rm -rf "$dir"
}

# `docker stop` mid-training: tini hands SIGTERM to the launcher, the ranks save a checkpoint, exit code 75.
check_stop() {
	local out="$WORK/case/stop" name="mlm-image-test-stop"
	install -d -o "${RUN_AS%%:*}" -g "${RUN_AS#*:}" "$out"
	podman rm --force --ignore --volumes "$name" >/dev/null
	podman run --detach --name "$name" --network none --user "$RUN_AS" "${READ_ONLY[@]}" -v "$out:/output" \
		-e MLM_DEMO_SAMPLES=20000 -e MLM_LOGGING_STEPS=1 -e MLM_LOG_FORMAT=json "$IMAGE" >/dev/null
	local waited=0
	# grep reads the whole log (no -q): under pipefail, -q exiting at the first match would SIGPIPE a podman still
	# writing a long log, and the loop would take the match for a miss until the run had ended.
	until podman logs "$name" 2>&1 | grep '"event": *"train"' >/dev/null; do
		if ((waited >= 300)) || [[ "$(podman inspect --format '{{.State.Running}}' "$name")" != true ]]; then
			podman logs "$name" >"$WORK/logs/stop.log" 2>&1
			podman rm --force --volumes "$name" >/dev/null
			show_log "$WORK/logs/stop.log"
			fail "training did not start within 300 s, or the run ended before it could be stopped"
		fi
		sleep 2
		waited=$((waited + 2))
	done
	podman stop --time 120 "$name" >/dev/null
	local code
	code="$(podman wait "$name")"
	podman logs "$name" >"$WORK/logs/stop.log" 2>&1
	podman rm --volumes "$name" >/dev/null
	if [[ "$code" != 75 ]]; then
		show_log "$WORK/logs/stop.log"
		fail "after docker stop the container exited $code, not 75 (preempted, checkpoint saved)"
	fi
	local checkpoints
	checkpoints="$(find "$out" -mindepth 1 -maxdepth 1 -name 'checkpoint-*' -uid "${RUN_AS%%:*}" | wc -l)"
	((checkpoints > 0)) || fail "docker stop left no checkpoint owned by $RUN_AS in $out"
	passed "docker stop: exit 75 with a checkpoint in /output"
}

# A streamed corpus on S3: moto's S3-compatible server on the host's loopback (from the dev lock), the bucket
# filled with boto3, the container on the host's network with the usual AWS_* variables: the image's s3fs reads
# the gzipped files through fsspec, and the secret key reaches none of the logs.
check_s3() {
	local port secret="image-test-s3-secret-7f3a" out="$WORK/case/s3" server_log="$WORK/logs/moto.log"
	port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
	"$REPO/.venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$server_log" 2>&1 &
	local server=$!
	local -a aws=(-e AWS_ACCESS_KEY_ID=image-test -e "AWS_SECRET_ACCESS_KEY=$secret" -e AWS_DEFAULT_REGION=us-east-1
		-e "AWS_ENDPOINT_URL=http://127.0.0.1:$port")
	if ! AWS_SECRET_ACCESS_KEY="$secret" "$PYTHON" - "http://127.0.0.1:$port" <<-'EOF'; then
		import gzip, json, os, sys, time
		import boto3, botocore.exceptions
		client = boto3.client(
		    "s3", endpoint_url=sys.argv[1], region_name="us-east-1",
		    aws_access_key_id="image-test", aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
		)
		for _ in range(100):  # the server takes a moment to listen
		    try:
		        client.create_bucket(Bucket="corpus")
		        break
		    except botocore.exceptions.EndpointConnectionError:
		        time.sleep(0.2)
		for part in range(2):
		    rows = "".join(json.dumps({"text": f"line {i} of part {part} in the bucket"}) + "\n" for i in range(200))
		    client.put_object(Bucket="corpus", Key=f"train/part-{part}.jsonl.gz", Body=gzip.compress(rows.encode()))
	EOF
		kill "$server"
		fail "could not fill the S3 bucket on the loopback server (log: $server_log)"
	fi
	install -d -o "${RUN_AS%%:*}" -g "${RUN_AS#*:}" "$out"
	local code=0
	podman run --rm --network host --user "$RUN_AS" "${READ_ONLY[@]}" -v "$out:/output" "${aws[@]}" \
		-e "MLM_DATASET=s3://corpus/train/*.jsonl.gz" -e MLM_STREAMING=true -e MLM_MAX_STEPS=4 \
		-e MLM_MAX_EVAL_SAMPLES=8 -e MLM_PER_DEVICE_TRAIN_BATCH_SIZE=8 "$IMAGE" >"$WORK/logs/s3.log" 2>&1 || code=$?
	kill "$server"
	if ((code != 0)); then
		show_log "$WORK/logs/s3.log"
		fail "the streamed S3 corpus run exited $code (log: $WORK/logs/s3.log)"
	fi
	[[ -f "$out/final/model.safetensors" ]] || fail "the S3 run left no final/model.safetensors"
	if grep -rqs -- "$secret" "$WORK/logs/s3.log" "$out"; then
		fail "the S3 secret key reached the log or /output"
	fi
	passed "streamed a gzipped JSON-lines corpus from S3 (loopback server) through the image's s3fs"
}

# Any other UID (OpenShift-style) with no mounts at all: HOME, HF_HOME and /output (anonymous volumes) writable.
check_any_user() {
	# shellcheck disable=SC2016  # expanded by the container's shell
	"${RUN[@]}" --user 4321:4321 "${READ_ONLY[@]}" "$IMAGE" \
		bash -c 'touch "$HOME/.probe" "$HF_HOME/.probe" /output/.probe && [[ "$(id -u)" == 4321 ]]' ||
		fail "as --user 4321:4321, HOME/HF_HOME//output are not writable"
	passed "--user 4321:4321: HOME, HF_HOME and /output writable"
}

_main() {
	[[ $# -eq 0 || ($# -eq 1 && "$1" == base) ]] || {
		echo "usage: bash docker/image-test.sh [base]" >&2
		exit 2
	}
	trap _finish EXIT
	cd "$REPO"
	phase setup
	setup_podman
	phase base
	make_base
	if [[ "${1:-}" == base ]]; then
		passed "base $BASE made"
		return
	fi
	[[ -x "$PYTHON" ]] || fail "$PYTHON is missing: make venv"
	phase wheels
	make_wheelhouse
	phase build
	build_image
	[[ "${IMAGE_TEST_REPRODUCIBLE:-1}" == 0 ]] || start_rebuild
	phase demo
	run_demo
	phase checks
	check_plan
	check_freeze
	check_sbom
	check_any_user
	check_s3
	phase stop
	check_stop
	if [[ "${IMAGE_TEST_REPRODUCIBLE:-1}" != 0 ]]; then
		phase again
		check_reproducible
	fi
	# Images left untagged by earlier builds (the layers of the current one stay: they are its parents).
	podman image prune --force >/dev/null
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	_main "$@"
fi
