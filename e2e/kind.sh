#!/usr/bin/env bash
# make e2e-kind: create a kind cluster, load Elastra's images into it, run the e2e suite on it,
# delete the cluster (also when the suite fails). Needs kind and a container runtime it can use;
# the images are built without a registry by e2e/images (root: debootstrap) and loaded with
# `kind load image-archive`. Environment: KIND (binary), KIND_CLUSTER (name), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${KIND:-kind}
NAME=${KIND_CLUSTER:-elastra-e2e}
PYTHON=${PYTHON:-.venv/bin/python}
if ! command -v "$KIND" >/dev/null 2>&1; then
  echo "e2e-kind: '$KIND' not found: install kind (https://kind.sigs.k8s.io, or" \
       "'go install sigs.k8s.io/kind@latest') and a container runtime, or set KIND=/path/to/kind." \
       "Without kind, 'make e2e' runs the same suite on the local cluster with the real node." >&2
  exit 2
fi
work=$(mktemp -d)
trap '"$KIND" delete cluster --name "$NAME" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
echo "e2e-kind: creating cluster $NAME"
"$KIND" create cluster --name "$NAME" --config e2e/kind-config.yaml \
  --kubeconfig "$work/kubeconfig" --wait 5m
echo "e2e-kind: building and loading the worker and operator images"
"$PYTHON" -m e2e.images build worker operator
"$PYTHON" -m e2e.images save worker operator --out "$work"
for image in worker operator; do
  "$KIND" load image-archive "$work/$image.tar" --name "$NAME"
  rm -f "$work/$image.tar"
done
echo "e2e-kind: running the e2e suite"
ELASTRA_E2E_KUBECONFIG="$work/kubeconfig" "$PYTHON" -m pytest e2e/suite "$@"
