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

$(STAMP): pyproject.toml constraints.txt
	@echo "==> creating $(VENV) and installing elastra[worker,dev] (first time: torch is large)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar off -c constraints.txt -e '.[worker,dev]'
	@touch $@

.PHONY: venv
venv: $(STAMP) ## Create .venv with the project and its extras

.PHONY: demo
demo: ## Bring up a local cluster and run an elastic job end to end (not yet: says what is missing)
	@echo "demo: FAILED not implemented yet: the operator, the real node and the Helm install"
	@echo "      are still being built (see the feature status table in README.md)."
	@exit 1

.PHONY: test
test: $(STAMP) toolchain ## Run every test (unit, worker, integration on the real local control plane)
	$(BIN)/python -m pytest tests; status=$$?; \
	  if [ $$status -eq 5 ]; then echo "make test: no tests collected"; status=0; fi; exit $$status

FLEET ?= hetero-small
CLUSTER_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

.PHONY: toolchain
toolchain: ## Build (or reuse from cache) etcd, kube-*, kubectl, kubelet, kwok, helm from Go modules
	@e2e/toolchain/build.sh >/dev/null

REAL_NODE ?=
NODE_IMAGES ?= python,worker

.PHONY: cluster-up
cluster-up: $(STAMP) toolchain ## Start the local control plane + kwok nodes (FLEET=hetero-small; REAL_NODE=1: + a real node)
	$(BIN)/python -m e2e.cluster up --fleet $(FLEET)$(if $(REAL_NODE), --real-node --images $(NODE_IMAGES))

.PHONY: images
images: $(STAMP) ## Build (or reuse from cache) the pause, python, worker and operator images, no registry
	$(BIN)/python -m e2e.images build pause python worker operator

.PHONY: cluster-down
cluster-down: ## Stop exactly the processes cluster-up started
	$(CLUSTER_PY) -m e2e.cluster down

.PHONY: fleet
fleet: $(STAMP) ## Make the running cluster's fake nodes match a fleet: make fleet FLEET=hetero-large
	$(BIN)/python -m e2e.cluster apply-fleet $(FLEET)

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
crds: $(STAMP) ## Regenerate crds/ (and the Helm chart's copy) from the pydantic models
	$(BIN)/elastra crds > crds/trainingjobs.elastra.dev.yaml
	cp crds/trainingjobs.elastra.dev.yaml helm/elastra/crds/

.PHONY: helm-lint
helm-lint: toolchain ## helm lint --strict and a helm template of the chart (also in make test)
	@helm="$$(e2e/toolchain/build.sh --print-bindir)/helm"; \
	  $$helm lint --strict helm/elastra && $$helm template elastra helm/elastra >/dev/null && \
	  echo "helm-lint: OK"

.PHONY: lock
lock: $(STAMP) ## Re-pin constraints.txt to what .venv resolved (commit the result)
	$(BIN)/pip freeze --exclude-editable | grep -v '^elastra' > constraints.txt

.PHONY: clean
clean: ## Remove the virtualenv and caches (not the toolchain cache)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
