#!/usr/bin/env bash
# Build the training image from docker/Dockerfile, filling in its metadata from git and the lock files, and write
# its SBOM (build/sbom/).
#
# usage: bash docker/build.sh [IMAGE] [extra build flags...]        (make image IMAGE=...)
#
# Settings (environment, all optional):
#   ENGINE=docker|podman   default: docker when it reaches an engine, else podman
#   BASE_IMAGE=REF         another base than the Dockerfile's pinned nvidia/cuda one
#   WHEELHOUSE=DIR         install the Python packages from DIR only (an offline build: no index, no network)
#   PIP_CA=FILE            CA bundle of a TLS-intercepting proxy, handed to pip as a build secret (never stored)
#   SOURCE=URL             the org.opencontainers.image.source label (default: origin when it is a URL, else
#                          the project's public repository; never a path of the build machine)
#   SBOM=FILE              where the image's SBOM goes (default build/sbom/REPO_TAG.cdx.json): CycloneDX JSON of
#                          its Python packages (tools/sbom.py run inside it) and its base image with the digest
#   SOURCE_DATE_EPOCH=SECS the time the image and every file in its layers is dated (default: the commit's time),
#                          so that the same commit, base and wheels build the same image ID (docs/image.md)
set -Eeuo pipefail

_log() {
	printf '%s build.sh: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2
}

_die() {
	_log "error: $*"
	exit 1
}

# docker when a daemon answers, podman otherwise (the development and CI machines have no Docker engine).
pick_engine() {
	if [[ -n "${ENGINE:-}" ]]; then
		echo "$ENGINE"
	elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
		echo docker
	elif command -v podman >/dev/null; then
		echo podman
	else
		_die "no container engine: install Docker (with BuildKit) or podman, or set ENGINE"
	fi
}

# pinned_version PACKAGE: its version in requirements.lock.
pinned_version() {
	local version
	version="$(sed -n "s/^$1==\([^ ]*\).*/\1/p" requirements.lock)"
	[[ -n "$version" ]] || _die "requirements.lock does not pin $1"
	echo "$version"
}

# The base image: BASE_IMAGE, else the Dockerfile's pinned default (tag and digest; `make pin` refreshes it).
base_image() {
	if [[ -n "${BASE_IMAGE:-}" ]]; then
		echo "$BASE_IMAGE"
		return
	fi
	local line
	line="$(grep -m1 '^ARG BASE_IMAGE=' docker/Dockerfile)" || _die "docker/Dockerfile has no 'ARG BASE_IMAGE=' line"
	echo "${line#ARG BASE_IMAGE=}"
}

# image_id ENGINE REF: the image's ID as sha256:HEX (podman prints the hex alone).
image_id() {
	local id
	id="$("$1" image inspect --format '{{.Id}}' "$2")" || return 1
	echo "sha256:${id#sha256:}"
}

# write_sbom ENGINE IMAGE BASE FILE REVISION CREATED: the CycloneDX SBOM of IMAGE's Python environment, read by
# tools/sbom.py inside it (fed on stdin: no mount, nothing added to the image, and no network for it).
write_sbom() {
	local engine="$1" image="$2" base="$3" file="$4" base_id=""
	[[ "$base" == *@sha256:* ]] || base_id="$(image_id "$engine" "$base" 2>/dev/null)" || base_id=""
	mkdir -p "$(dirname "$file")"
	"$engine" run --rm -i --network none --entrypoint /opt/venv/bin/python "$image" - \
		--image "$image" --image-id "$(image_id "$engine" "$image")" --base-image "$base" --base-image-id "$base_id" \
		--revision "$5" --created "$6" <tools/sbom.py >"$file.tmp" ||
		{
			rm -f "$file.tmp"
			_die "the SBOM of $image could not be written (tools/sbom.py inside the image failed)"
		}
	mv "$file.tmp" "$file"
	_log "SBOM: $file ($(grep -c '"type": "library"' "$file") Python packages; base $base)"
}

# sbom_name REF: a file name for REF (localhost/mlm-trainer:dev -> localhost_mlm-trainer_dev).
sbom_name() {
	local name="${1//\//_}"
	echo "${name//:/_}"
}

# The commit, marked -dirty when tracked files differ from it (what the image holds is then not that commit).
revision() {
	local rev
	rev="$(git rev-parse HEAD 2>/dev/null)" || {
		echo unknown
		return
	}
	git diff --quiet HEAD -- 2>/dev/null || rev+="-dirty"
	echo "$rev"
}

# The commit's time in seconds, the date a reproducible build gives the image and its files (now, outside git).
commit_time() {
	git log -1 --format=%ct 2>/dev/null || date +%s
}

# The origin URL without any credentials in it, when it is one; a local path (a clone of a clone) says nothing
# about where the source lives, so the project's public repository stands in.
PUBLIC_SOURCE=https://github.com/mlm-trainer/mlm-trainer
source_url() {
	local url
	url="$(git remote get-url origin 2>/dev/null)" || url=""
	case "$url" in
	https://* | http://* | ssh://* | git@*) echo "${url/\/\/*@//\/}" ;;
	*) echo "$PUBLIC_SOURCE" ;;
	esac
}

_main() {
	local image="${1:-mlm-trainer:dev}"
	[[ $# -gt 0 ]] && shift
	cd "$(dirname "${BASH_SOURCE[0]}")/.."

	local engine
	engine="$(pick_engine)"
	if [[ -n "${ENGINE:-}" ]]; then
		_log "engine: $engine (ENGINE)"
	else
		_log "engine: $engine ($([[ "$engine" == docker ]] && echo "a Docker engine answered" || echo "no Docker engine answered"))"
	fi
	local epoch created
	epoch="${SOURCE_DATE_EPOCH:-$(commit_time)}"
	[[ "$epoch" =~ ^[0-9]+$ ]] || _die "SOURCE_DATE_EPOCH=$epoch: expected whole seconds since 1970"
	created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
	local rev base
	rev="$(revision)"
	base="$(base_image)"
	local -a args=(
		build --file docker/Dockerfile --tag "$image"
		--build-arg "BASE_IMAGE=$base"
		--build-arg "REVISION=$rev"
		--build-arg "VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
		--build-arg "CREATED=$created"
		--build-arg "SOURCE_DATE_EPOCH=$epoch"
		--build-arg "SOURCE=${SOURCE:-$(source_url)}"
		--build-arg "TORCH_VERSION=$(pinned_version torch)"
		--build-arg "TRANSFORMERS_VERSION=$(pinned_version transformers)"
		--build-arg "DATASETS_VERSION=$(pinned_version datasets)"
		--build-arg "ACCELERATE_VERSION=$(pinned_version accelerate)"
	)
	if [[ -n "${WHEELHOUSE:-}" ]]; then
		[[ -d "$WHEELHOUSE" ]] || _die "WHEELHOUSE=$WHEELHOUSE is not a directory"
		args+=(--build-context "wheelhouse=$(readlink -f "$WHEELHOUSE")")
	fi
	if [[ -n "${PIP_CA:-}" ]]; then
		[[ -r "$PIP_CA" ]] || _die "PIP_CA=$PIP_CA: no such readable file (a PEM CA bundle)"
		args+=(--secret "id=pip_ca,src=$(readlink -f "$PIP_CA")")
	fi

	_log "$engine ${args[*]} $* ."
	if [[ "$engine" == docker ]]; then
		# Secrets, bind mounts from build contexts and --build-context need BuildKit; rewrite-timestamp (BuildKit
		# 0.13, Docker 26) dates every file in the layers by SOURCE_DATE_EPOCH, as podman's --timestamp does.
		DOCKER_BUILDKIT=1 docker "${args[@]}" --output type=docker,rewrite-timestamp=true "$@" .
	else
		# Three things would make two builds of one commit differ with identical layers (found by make
		# image-test's second build): the docker format's configuration records the build container's ID and
		# hostname (so the OCI format, which has neither; the Dockerfile's RUN steps are POSIX sh for it, no
		# SHELL); buildah writes "FROM <intermediate image ID>" into the history's comments (--omit-history);
		# and the dates (--timestamp dates the image, its history and every file in its layers).
		"$engine" "${args[@]}" --format oci --timestamp "$epoch" --omit-history "$@" .
	fi
	_log "built $image ($("$engine" image inspect --format '{{.Size}}' "$image" | numfmt --to=iec) uncompressed)"
	_log "image ID: $(image_id "$engine" "$image") (revision $rev, dated $created)"
	write_sbom "$engine" "$image" "$base" "${SBOM:-build/sbom/$(sbom_name "$image").cdx.json}" "$rev" "$created"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	_main "$@"
fi
