#!/usr/bin/env bash
# mlm-trainer entrypoint: PID-1 duties only, then exec into Python so signals reach the job.
#
# usage: entrypoint.sh [train] [--option value ...]   train (the default; options: docs/options.md)
#        entrypoint.sh plan [--option value ...]      print the launch plan as JSON, train nothing
#        entrypoint.sh prepare [--option value ...]   tokenize the corpus into the cache (HF_HOME), train nothing
#        entrypoint.sh gpus                           list the GPUs this container can use
#        entrypoint.sh doctor                         preflight checks before a long job
#        entrypoint.sh verify DIR_OR_URL              check a final model or checkpoint against its files' digests
#        entrypoint.sh report OUTPUT_DIR              write report.html + loss.png for a run
#        entrypoint.sh COMMAND [ARGS...]              run any other command (e.g. bash)
#
# Configuration: MLM_<OPTION> environment variables, a YAML file (MLM_CONFIG) or --option flags.
set -Eeo pipefail

HERE="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
# The interpreter: MLM_PYTHON, else the checkout's .venv (make venv), else python3 on PATH (the image's /opt/venv).
if [[ -n "${MLM_PYTHON:-}" ]]; then
	PYTHON="$MLM_PYTHON"
elif [[ -x "$HERE/.venv/bin/python" ]]; then
	PYTHON="$HERE/.venv/bin/python"
else
	PYTHON=python3
fi

# Log to stderr with a timestamp; colour only on a terminal, NO_COLOR respected.
_log() {
	local level="$1"
	shift
	local colour="" reset=""
	if [[ -t 2 && -z "${NO_COLOR:-}" ]]; then
		case "$level" in
		ERROR) colour=$'\e[31m' ;;
		WARN) colour=$'\e[33m' ;;
		esac
		[[ -n "$colour" ]] && reset=$'\e[0m'
	fi
	printf '%s%s [%s] mlm-trainer: %s%s\n' "$colour" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$level" "$*" "$reset" >&2
}

# The secrets a run may read from the environment (the hub, the trackers, S3 data), each also accepted as VAR_FILE:
# a file holding it, as Docker and Kubernetes mount secrets.
SECRET_VARS=(HF_TOKEN WANDB_API_KEY MLFLOW_TRACKING_TOKEN MLFLOW_TRACKING_PASSWORD AWS_ACCESS_KEY_ID
	AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN)

# file_env VAR: fill VAR from the file named by VAR_FILE (its trailing newlines dropped); both set, or a file that is
# missing, a directory (the Secret's mount point instead of its key) or empty, is an error.
file_env() {
	local var="$1"
	local file_var="${var}_FILE"
	local value="${!var:-}" file="${!file_var:-}"
	if [[ -n "$value" && -n "$file" ]]; then
		_log ERROR "both $var and $file_var are set; set only one (the value itself, or the file holding it)"
		exit 2
	fi
	if [[ -n "$file" ]]; then
		if [[ ! -f "$file" || ! -r "$file" ]]; then
			_log ERROR "$file_var=$file: no such readable file; expected a file holding $var"
			exit 2
		fi
		value="$(<"$file")"
		value="${value%$'\r'}" # a file written on Windows
		if [[ -z "$value" ]]; then
			_log ERROR "$file_var=$file: the file is empty; expected it to hold $var"
			exit 2
		fi
		export "$var"="$value"
	fi
	unset "$file_var"
}

# withhold_secrets ARGS...: a token given as a flag (--hub_token X, --hub_token=X) moves to MLM_HUB_TOKEN, so no
# process's command line (readable by every user in /proc/PID/cmdline) carries it; the other flags go to ARGS.
withhold_secrets() {
	ARGS=()
	while [[ $# -gt 0 ]]; do
		case "$1" in
		--hub_token=*) export MLM_HUB_TOKEN="${1#*=}" ;;
		--hub_token)
			export MLM_HUB_TOKEN="${2:-}"
			[[ $# -gt 1 ]] && shift
			;;
		*) ARGS+=("$1") ;;
		esac
		shift
	done
}

# wants_help ARGS...: -h or --help among them (no option takes either as its value: train/common/usage.py).
wants_help() {
	local arg
	for arg in "$@"; do
		[[ "$arg" == -h || "$arg" == --help ]] && return 0
	done
	return 1
}

# Sub-command dispatch: our commands go to Python modules; any other program is executed as given.
_main() {
	local var
	for var in "${SECRET_VARS[@]}"; do
		file_env "$var"
	done
	local command="${1:-train}"
	case "$command" in
	train | plan | evaluate | finetune | replay | branch)
		[[ $# -gt 0 ]] && shift
		withhold_secrets "$@"
		wants_help "${ARGS[@]}" && exec "$PYTHON" -m train.common.usage "$command"
		exec "$PYTHON" -m train.launch "$command" "${ARGS[@]}"
		;;
	help | -h | --help)
		shift
		# The option reference needs the config's schema (the launcher's imports); the usage needs nothing.
		[[ "${1:-}" == options ]] && exec "$PYTHON" -m train.launch help "$@"
		exec "$PYTHON" -m train.common.usage "$@"
		;;
	-*)
		withhold_secrets "$@"
		wants_help "${ARGS[@]}" && exec "$PYTHON" -m train.common.usage
		exec "$PYTHON" -m train.launch train "${ARGS[@]}"
		;;
	prepare)
		shift
		withhold_secrets "$@"
		wants_help "${ARGS[@]}" && exec "$PYTHON" -m train.common.usage "$command"
		exec "$PYTHON" -m train.commands.prepare "${ARGS[@]}"
		;;
	gpus)
		shift
		wants_help "$@" && exec "$PYTHON" -m train.common.usage "$command"
		exec "$PYTHON" -m train.machine "$@"
		;;
	doctor | report)
		shift
		wants_help "$@" && exec "$PYTHON" -m train.common.usage "$command"
		exec "$PYTHON" -m "train.$command" "$@"
		;;
	verify)
		shift
		wants_help "$@" && exec "$PYTHON" -m train.common.usage "$command"
		exec "$PYTHON" -m train.outputs.verify "$@"
		;;
	average)
		shift
		wants_help "$@" && exec "$PYTHON" -m train.common.usage "$command"
		exec "$PYTHON" -m train.commands.average "$@"
		;;
	*)
		# A word that is no program on PATH (a mistyped command: trian) gets one line naming the nearest command,
		# exit 2, not the shell's "command not found" (127). A path goes to exec as given: it says what is wrong.
		if [[ "$command" != */* ]] && ! type -P "$command" >/dev/null; then
			exec "$PYTHON" -m train.common.usage --not-a-command "$command"
		fi
		exec "$@"
		;;
	esac
}

# Sourcing the file (tests) defines the functions without running anything.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	# Import the train package from beside this file, whatever the working directory (relative paths stay the user's).
	PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
	export PYTHONPATH
	_main "$@"
fi
