# mlm-trainer: the front door. `make help` lists the targets; every command of README.md and docs/ is one of them.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
IMAGE ?= mlm-trainer:dev
BASE_IMAGE ?=
GPUS ?= all
DATA_DIR ?= $(CURDIR)/data
OUTPUT_DIR ?= $(CURDIR)/output
CACHE_VOLUME ?= mlm-trainer-cache
PYTEST_ARGS ?=
AUDIT_ARGS ?=
BENCH_ARGS ?=
BENCH_DATA_ARGS ?=
UPGRADE_ARGS ?=

BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/.installed: requirements.lock requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	# PyPI's torch, as in the image: its CUDA build runs on the CPU too (about 3 GB of wheels, 5.6 GB installed).
	# PyTorch's CPU-only wheels live on another index whose files the lock cannot hash from PyPI (docs/image.md).
	@echo "venv: installing the locked stack (torch $$(sed -n 's/^torch==\([^ ]*\).*/\1/p' requirements.lock), PyPI's build) into $(VENV)"
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	touch $@

.PHONY: venv
venv: $(BIN)/.installed ## Create .venv from the lock files

.PHONY: demo
demo: venv ## Train the demo model (CPU when there is no GPU); writes ./output/final
	MLM_CONFIG=$${MLM_CONFIG-configs/demo.yaml} ./entrypoint.sh

.PHONY: system-deps
system-deps: ## Install the OS tools the tests need (podman, debootstrap, chromium...) when missing
	bash .ci/system-deps.sh

.PHONY: test
# One OpenMP thread a rank for the tests that share the cores with other work (the unit and waiting tests beside
# the image test, the end-to-end tests two at a time): a run of one rank would otherwise take a thread per core
# (the launcher's rule, train/launch/plan.py), and threads waiting on busy cores spin. Measured on 2 cores, two
# end-to-end modules two at a time: 72 s with the launcher's threads, 50 s with one. Tests run alone keep the rule.
SHARED_CORES := OMP_NUM_THREADS=1

# The image test's Debian base (debootstrap, about 40 s, mostly waiting on the network and dpkg) is made while .venv
# installs (about 2 minutes, mostly one core unpacking wheels): neither needs the other. Its failure is not the
# run's: the image test makes the base itself when none is there, and fails there, with its log.
.PHONY: test-setup
test-setup: system-deps
	@mkdir -p build
	@bash docker/image-test.sh base >build/image-base.log 2>&1 & base=$$!; \
		$(MAKE) --no-print-directory venv || { kill $$base; wait $$base; exit 1; }; \
		wait $$base || echo "make test: the image's base was not made beforehand: $$(tail -n 1 build/image-base.log)"

test: test-setup ## Set up and run every test: lint, audit, unit + end-to-end, the image
	# Beside lint, audit, the unit tests (one core; two at a time took 556 s, one 615 s the same day and 352 s on
	# an earlier one: not yet compared fairly) and then the end-to-end tests run the image test (a container build:
	# mostly one core unpacking wheels; the longest part, so it starts first) and the end-to-end runs that mostly
	# wait (-m waits: Slurm's scheduling, a timeout); their logs follow. The end-to-end tests run two at a time
	# (about half of a core sat idle while they ran one at a time: launches, servers, signals) as soon as the unit
	# tests end, without waiting for the image test (it took one core alone for minutes), a module's tests on one
	# worker (they share its fixtures), the longest modules first (tests/conftest.py LONGEST_FIRST, kept in that order:
	# --no-loadscope-reorder). Then those that time themselves or work to a deadline (-m alone: a time budget, a stop
	# timeout), one at a time, with nothing else running. A lint or audit failure stops them all.
	@mkdir -p build
	@# Bytecode for our own modules, once: with PYTHONDONTWRITEBYTECODE set (CI's machines set it) every launcher, rank
	@# and test process would compile them again (about 0.4 s of each run from launch to exit).
	@$(BIN)/python -m compileall -q -j 0 train tests bench >/dev/null
	@unit=0 e2e=0 waited=0 built=0; \
		bash docker/image-test.sh >build/image-test.log 2>&1 & image=$$!; \
		$(SHARED_CORES) $(BIN)/python -m pytest -m waits --basetemp=build/pytest-waits --durations=5 $(PYTEST_ARGS) \
			>build/pytest-waits.log 2>&1 & waits=$$!; \
		$(MAKE) --no-print-directory lint audit || { kill $$image $$waits; wait; exit 1; }; \
		$(SHARED_CORES) $(BIN)/python -m pytest -m "not slow" --durations=10 $(PYTEST_ARGS) || unit=$$?; \
		$(SHARED_CORES) $(BIN)/python -m pytest -m "slow and not waits and not alone" -n 2 --dist loadfile \
			--no-loadscope-reorder --durations=25 $(PYTEST_ARGS) || e2e=$$?; \
		wait $$waits || waited=$$?; cat build/pytest-waits.log; \
		wait $$image || built=$$?; cat build/image-test.log; \
		echo "make test: unit tests exit $$unit, end-to-end exit $$e2e, waiting end-to-end tests exit $$waited," \
			"image test exit $$built"; \
		test $$unit -eq 0 -a $$e2e -eq 0 -a $$waited -eq 0 -a $$built -eq 0
	$(BIN)/python -m pytest -m "slow and not waits and alone" --durations=25 $(PYTEST_ARGS)

.PHONY: pytest
pytest: venv ## Run the Python test suite only (and list its 25 slowest tests)
	$(BIN)/python -m pytest --durations=25 $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: venv ## Unit tests only (-m "not slow": no torchrun, image or namespaces), for the edit-test loop
	$(BIN)/python -m pytest -m "not slow" --durations=10 $(PYTEST_ARGS)

.PHONY: lint
lint: venv ## ruff, mypy (train/), shellcheck, hadolint, compose config, the option and model tables in docs/ up to date
	$(BIN)/ruff check .
	$(BIN)/mypy  # pyproject.toml's [tool.mypy]: every function of train/ typed and checked
	$(BIN)/ruff format --check train tests bench docker tools k8s
	$(BIN)/shellcheck entrypoint.sh .ci/run .ci/*.sh docker/*.sh bench/*.sh slurm/*.sbatch
	$(BIN)/hadolint docker/Dockerfile
	$(BIN)/python -c 'import compose, os, sys; os.execv(os.path.join(os.path.dirname(compose.__file__), "docker-compose"), ["docker-compose", "-f", "compose.yaml", "config", "-q"])'
	$(BIN)/python -m tools.options --check docs/options.md
	$(BIN)/python -m tools.models --check docs/models.md

.PHONY: audit
audit: venv ## Known vulnerabilities in the locks (pip-audit); audit-ignore.toml accepts some, with a reason, until a date
	# Offline (or no vulnerability data reachable) it says SKIPPED and passes; AUDIT_ARGS=--strict makes that fail.
	$(BIN)/python -m tools.audit $(AUDIT_ARGS)

.PHONY: options
options: venv ## Regenerate docs/options.md (from the schema) and docs/models.md's table (from the code)
	$(BIN)/python -m tools.options --write docs/options.md
	$(BIN)/python -m tools.models --write docs/models.md

# The Python the locks are resolved with, and why it is not the image's: the first lines of each lock, above
# pip-compile's header (tests/test_supply_chain.py checks them against it and the Dockerfile's base image).
LOCK_NOTE_1 := \# Resolved with Python 3.11 (Debian 12, the development and CI machines); the image runs Python 3.12 (Ubuntu 24.04).
LOCK_NOTE_2 := \# docker/lock_cuda.py resolves requirements.in for 3.12 against this file: a version that would differ fails make lock,
LOCK_NOTE_3 := \# what only 3.12 needs goes to requirements-cuda.lock, and the image installs both with --require-hashes --only-binary.
LOCK_NOTE := $(LOCK_NOTE_1)\n$(LOCK_NOTE_2)\n$(LOCK_NOTE_3)
LOCK_NOTE_DEV := \# Resolved with Python 3.11 (Debian 12, the development and CI machines), where these tools run; not in the image.

LOCK_ENV := env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null

.PHONY: lock
lock: ## Re-resolve requirements.in into requirements.lock (exact versions + hashes)
	# Against PyPI alone (PIP_CONFIG_FILE=/dev/null): a machine's own pip settings (local wheel folders, extra
	# indexes) must not decide what the lock pins or which files' hashes it lists.
	$(LOCK_ENV) $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-find-links \
	  --no-emit-index-url -o requirements.lock requirements.in
	$(LOCK_ENV) $(BIN)/python docker/lock_cuda.py
	$(LOCK_ENV) $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-find-links \
	  --no-emit-index-url -o requirements-dev.lock requirements-dev.in
	sed -i '1i $(LOCK_NOTE)' requirements.lock
	sed -i '1i $(LOCK_NOTE_DEV)' requirements-dev.lock

.PHONY: upgrade-check
upgrade-check: venv ## What the newest torch/transformers/datasets/accelerate... would break: a scratch venv, canaries by touch, fast tests, a short run
	$(BIN)/python -m tools.upgrade_check $(UPGRADE_ARGS)

.PHONY: pin
pin: ## Re-resolve the CUDA base image digest (needs a registry: docker buildx or crane)
	bash docker/pin.sh

.PHONY: image
image: ## Build the image (docker, or podman where there is no Docker engine) and its SBOM (build/sbom/)
	bash docker/build.sh $(IMAGE)

.PHONY: image-test
image-test: venv system-deps ## Build the same Dockerfile on a local Debian base with CPU torch and run it as docker run would
	bash docker/image-test.sh

.PHONY: run
run: ## docker run the image on all GPUs with ./data, ./output and a cache volume (docs/image.md's "full run")
	mkdir -p $(OUTPUT_DIR)
	# MLM_CONFIG empty unless you set it: your MLM_* options on the project's defaults, not the image's demo preset.
	docker run --rm --gpus $(GPUS) --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
	  --user "$$(id -u):$$(id -g)" --read-only --tmpfs /tmp \
	  -v $(DATA_DIR):/data:ro -v $(OUTPUT_DIR):/output -v $(CACHE_VOLUME):/cache \
	  --env-file <(env | grep -E '^(MLM_|HF_)' | grep -v '^MLM_CONFIG=' || true) -e MLM_CONFIG="$${MLM_CONFIG-}" $(IMAGE)

.PHONY: bench
bench: venv ## Benchmark ours against the seed recipe (demo data) and run_mlm.py (real text); bench/results/
	$(BIN)/python -m bench.run $(BENCH_ARGS)

.PHONY: bench-store
bench-store: venv ## What an output_dir in a bucket costs: upload/download per GiB and per save, moto on loopback
	$(BIN)/python -m bench.store $(BENCH_STORE_ARGS)

.PHONY: bench-checkpoints
bench-checkpoints: venv ## What the checkpoints' SHA-256 lists cost a base-size model's saves and resumes (bench/results/)
	$(BIN)/python -m bench.checkpoints $(BENCH_CHECKPOINTS_ARGS)

.PHONY: bench-saves
bench-saves: venv ## What a checkpoint costs the training loop, synchronous or in the background (bench/results/)
	$(BIN)/python -m bench.saves $(BENCH_SAVES_ARGS)

.PHONY: bench-data
bench-data: venv ## Benchmark tokenization + packing as the corpus grows, ours vs run_mlm.py (bench/results/)
	$(BIN)/python -m bench.data $(BENCH_DATA_ARGS)

.PHONY: clean
clean: ## Remove outputs and caches (keeps .venv)
	rm -rf output .pytest_cache .ruff_cache build
