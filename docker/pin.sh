#!/usr/bin/env bash
# Re-resolve the digest of the base image in docker/Dockerfile's `ARG BASE_IMAGE=...:TAG@sha256:...` from its
# registry and write it back, so the tag and the digest always name the same image. Needs a registry:
# crane, `docker buildx imagetools` or skopeo (the first one found). Review the diff and rebuild.
#
# usage: bash docker/pin.sh              (make pin) keep the tag, refresh its digest
#        bash docker/pin.sh REPO:TAG     move to another tag, e.g. docker.io/nvidia/cuda:13.0.3-base-ubuntu24.04
set -Eeuo pipefail

DOCKERFILE="${DOCKERFILE:-$(dirname "${BASH_SOURCE[0]}")/Dockerfile}"

_die() {
	echo "pin.sh: error: $*" >&2
	exit 1
}

# The current reference, without its digest.
current_ref() {
	local line
	line="$(grep -m1 '^ARG BASE_IMAGE=' "$DOCKERFILE")" || _die "$DOCKERFILE has no 'ARG BASE_IMAGE=' line"
	line="${line#ARG BASE_IMAGE=}"
	echo "${line%@*}"
}

# digest_of REF: the digest of REF's top manifest (the multi-platform index when there is one), as docker pull
# by digest expects it.
digest_of() {
	local ref="$1"
	if command -v crane >/dev/null; then
		crane digest "$ref"
	elif command -v docker >/dev/null && docker buildx version >/dev/null 2>&1; then
		docker buildx imagetools inspect "$ref" --format '{{json .Manifest}}' |
			sed -n 's/.*"digest": *"\(sha256:[0-9a-f]*\)".*/\1/p'
	elif command -v skopeo >/dev/null; then
		# The digest is the sha256 of the manifest's exact bytes.
		echo "sha256:$(skopeo inspect --raw "docker://$ref" | sha256sum | cut -d' ' -f1)"
	else
		_die "no registry client: install crane (go-containerregistry), docker buildx or skopeo"
	fi
}

_main() {
	local ref="${1:-$(current_ref)}"
	[[ "$ref" != *@* ]] || _die "give the reference without a digest (REPO:TAG), not $ref"
	local digest
	digest="$(digest_of "$ref")" || _die "could not resolve $ref (is the registry reachable from here?)"
	[[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || _die "$ref resolved to '$digest', not a sha256 digest"

	local old new="$ref@$digest"
	old="$(grep -m1 '^ARG BASE_IMAGE=' "$DOCKERFILE")"
	if [[ "$old" == "ARG BASE_IMAGE=$new" ]]; then
		echo "pin.sh: $new is current"
		return
	fi
	local tmp
	tmp="$(mktemp)"
	awk -v line="ARG BASE_IMAGE=$new" '!done && /^ARG BASE_IMAGE=/ { print line; done = 1; next } { print }' \
		"$DOCKERFILE" >"$tmp"
	cat "$tmp" >"$DOCKERFILE"
	rm -f "$tmp"
	echo "pin.sh: ${old#ARG BASE_IMAGE=}"
	echo "     -> $new"
	echo "pin.sh: rebuild (make image) and run it before committing docker/Dockerfile"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	_main "$@"
fi
