# Elastra: one target per daily task. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PY_SOURCES := operator worker_image tests e2e bench

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing elastra[worker,dev] (first time: torch is large)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[worker,dev]'
	@touch $@

.PHONY: venv
venv: $(STAMP) ## Create .venv with the project and its extras

.PHONY: test
test: $(STAMP) ## Run every test (unit, worker, integration on the real local control plane)
	$(BIN)/python -m pytest tests

.PHONY: bench
bench: $(STAMP) ## Run the benchmarks (each prints ratios measured in one run)
	$(BIN)/python bench/run_all.py

.PHONY: lint
lint: $(STAMP) ## ruff (lint + format check), mypy --strict, import-linter
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(BIN)/mypy operator/elastra worker_image/elastra_worker
	$(BIN)/lint-imports

.PHONY: fmt
fmt: $(STAMP) ## Format and autofix with ruff
	$(BIN)/ruff format $(PY_SOURCES)
	$(BIN)/ruff check --fix $(PY_SOURCES)

.PHONY: crds
crds: $(STAMP) ## Regenerate crds/ from the pydantic models
	$(BIN)/elastra crds > crds/trainingjobs.elastra.dev.yaml

.PHONY: clean
clean: ## Remove the virtualenv and caches (not the toolchain cache)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
