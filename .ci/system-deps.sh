#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when one is missing, so `make test` on a machine that
# already has them costs a dpkg query. Runs as root on Debian 12 (CI) or through sudo where that is available.
# Usage: bash .ci/system-deps.sh
set -Eeuo pipefail

# package -> why the tests need it
PACKAGES=(
	podman         # builds and runs the image without a Docker engine (docker/image-test.sh)
	buildah        # podman build's backend
	runc           # OCI runtime; crun fails here with cgroups in hybrid mode
	debootstrap    # the local Debian 12 base image, since no registry is reachable
	fuse-overlayfs # overlay storage for podman where the kernel overlay is not usable
	uidmap         # newuidmap/newgidmap for --user mappings
	iproute2       # ip netns + veth: several "hosts" on one machine for the multi-node test
	chromium       # renders the report page in its test
	slurm-wlm      # slurmctld + slurmd (and slurmstepd) + the clients: a two-node Slurm cluster for tests/e2e/test_slurm.py
	munge          # Slurm's authentication (auth/munge); the test runs its own munged with its own key
)

missing_packages() {
	local pkg status
	for pkg in "${PACKAGES[@]}"; do
		status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
		if [[ "$status" != installed ]]; then
			printf '%s\n' "$pkg"
		fi
	done
}

_main() {
	local -a missing
	mapfile -t missing < <(missing_packages)
	if ((${#missing[@]} == 0)); then
		echo "system-deps: all present (${PACKAGES[*]})"
		return 0
	fi
	local sudo=()
	if ((EUID != 0)); then
		command -v sudo >/dev/null || {
			echo "system-deps: missing ${missing[*]}; run as root or install them with apt-get" >&2
			return 1
		}
		sudo=(sudo)
	fi
	echo "system-deps: installing ${missing[*]}"
	# Lock timeout: other jobs on a shared machine may be using apt at the same time.
	"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends "${missing[@]}"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	_main "$@"
fi
