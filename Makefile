# Elastra: one target per daily task. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# checkov (the chart and worker-pod scan in tests/unit/test_checkov.py) lives in a venv of its
# own: it pins boto3, packaging and networkx exactly, below what constraints.txt holds.
CHECKOV_VENV := $(VENV)/checkov
PY_SOURCES := operator worker_image tests e2e bench

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml constraints.txt constraints-checkov.txt
	@echo "==> creating $(VENV) and installing elastra[worker,dev] (first time: torch is large)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar off -c constraints.txt -e '.[worker,dev]'
	@echo "==> checkov into $(CHECKOV_VENV) (pins in constraints-checkov.txt)"
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/pip install --progress-bar off -c constraints-checkov.txt checkov
	@touch $@

.PHONY: venv
venv: $(STAMP) ## Create .venv with the project and its extras

.PHONY: demo
demo: $(STAMP) toolchain ## Local cluster + real node, Helm install, cpu-tiny trained and scaled 3->2->3; one summary line
	$(BIN)/python -m e2e.demo $(DEMO_ARGS)

# The kind chapter runs before the real node's suite: on a fresh machine the real node has not
# yet unpacked the worker image (5.9 GB) when kind's nodes unpack theirs, the run's peak of disk.
.PHONY: test
test: $(STAMP) toolchain ## Run every test: unit, worker, integration (real control plane), a kind node lost, e2e (real pods)
	@PYTHON=$(BIN)/python tests/run.sh

.PHONY: e2e
e2e: $(STAMP) toolchain ## The e2e suite alone: real pods on a local cluster with the real node (or ELASTRA_E2E_KUBECONFIG)
	$(BIN)/python -m pytest e2e/suite $(PYTEST_ARGS)

.PHONY: kind-image
kind-image: $(STAMP) toolchain ## Build kind, kubeadm and kind's node image offline (cached per user; root)
	@PYTHON=$(BIN)/python e2e/kind/build.sh

.PHONY: e2e-kind
e2e-kind: $(STAMP) toolchain ## kind cluster (1+3 nodes; offline: make kind-image's), load the images, run the e2e suite, delete it
	PYTHON=$(BIN)/python e2e/kind.sh $(PYTEST_ARGS)

FLEET ?= hetero-small
CLUSTER_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

.PHONY: toolchain
toolchain: ## Build (or reuse from cache) etcd, kube-*, kubectl, kubelet, kwok, helm and Kueue's manager from Go modules
	@e2e/toolchain/build.sh >/dev/null

REAL_NODE ?=
NODE_IMAGES ?= python,worker
AUTOSCALER ?=

.PHONY: cluster-up
cluster-up: $(STAMP) toolchain ## Start the local control plane + kwok nodes (FLEET=hetero-small; REAL_NODE=1: + a real node; AUTOSCALER=karpenter)
	$(BIN)/python -m e2e.cluster up --fleet $(FLEET)$(if $(REAL_NODE), --real-node --images $(NODE_IMAGES))$(if $(AUTOSCALER), --autoscaler $(AUTOSCALER))

.PHONY: images
images: $(STAMP) ## Build (or reuse from cache) the pause, python, worker and operator images, no registry
	$(BIN)/python -m e2e.images build pause python worker operator

.PHONY: images-docker
images-docker: $(STAMP) ## Build operator/ and worker_image/Dockerfile with docker (offline base, cached wheels), compare with make images
	$(BIN)/python -m e2e.images.docker build worker operator

.PHONY: torch-cuda-check
torch-cuda-check: $(STAMP) ## pip's resolver, dry run: the worker Dockerfile's torch resolves to the CUDA build the README names
	$(BIN)/python -m e2e.images.cuda

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

.PHONY: docs
docs: $(STAMP) ## Regenerate docs/api.md from the pydantic models; a test fails when it is stale
	$(BIN)/python -m elastra.api.reference > docs/api.md

.PHONY: helm-lint
helm-lint: toolchain ## helm lint --strict and a helm template of the chart (also in make test)
	@helm="$$(e2e/toolchain/build.sh --print-bindir)/helm"; \
	  $$helm lint --strict helm/elastra && $$helm template elastra helm/elastra >/dev/null && \
	  echo "helm-lint: OK"

.PHONY: lock
lock: $(STAMP) ## Re-pin constraints.txt and constraints-checkov.txt to what the venvs resolved (commit them)
	$(BIN)/pip freeze --exclude-editable | grep -v '^elastra' > constraints.txt
	$(CHECKOV_VENV)/bin/pip freeze > constraints-checkov.txt

.PHONY: clean
clean: ## Remove the virtualenv and caches (not the toolchain cache)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
