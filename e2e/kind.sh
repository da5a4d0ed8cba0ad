#!/usr/bin/env bash
# make e2e-kind: create a kind cluster (one control plane, three workers: e2e/kind-config.yaml),
# load Elastra's images into it, run the e2e suite on it, and delete the cluster again, also
# when the suite fails, times out or is interrupted.
#
# Two ways, chosen by ELASTRA_KIND_IMAGE:
#   local      (default where kind or a docker daemon is missing, as on this project's machines)
#              kind, kubeadm and the node image built offline by `make kind-image`, run by a
#              private docker daemon (e2e/kind/dockerd.py) unless one answers already;
#              e2e/kind/cluster.py removes everything it made (cluster, kind's network,
#              the daemon, /lib/modules when it created it).
#   published  (default where `kind` is on PATH and docker answers) kind's own node image.
#   <image>    any other node image, with the kind found as for `published`.
# The worker and operator images are built from their Dockerfiles by the docker daemon kind
# runs on (e2e/images/docker.py: the offline builder's base and pinned wheels, no registry) and
# checked to hold the offline images' packages; the nodes get the Dockerfiles' images, so the
# chapter trains on what users build (ELASTRA_KIND_IMAGES=offline loads the offline builder's
# instead, e.g. with a docker that cannot build). Run one kind chapter at a time on these 2
# cores: with a second kind cluster on the same daemon, helm's 5 min wait for the operator
# timed out (2026-12-04); alone, the operator was Ready 3 s after it started.
# Environment: KIND (kind binary for published/<image>), KIND_CLUSTER (name), PYTHON,
# ELASTRA_E2E_KIND_TIMEOUT (seconds for the suite, default 3600), ELASTRA_KIND_IMAGES.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${KIND_CLUSTER:-elastra-e2e}
PYTHON=${PYTHON:-.venv/bin/python}
TIMEOUT=${ELASTRA_E2E_KIND_TIMEOUT:-3600}
KIND=${KIND:-kind}
IMAGES=${ELASTRA_KIND_IMAGES:-docker}
case $IMAGES in
  docker | offline) ;;
  *) echo "e2e-kind: ELASTRA_KIND_IMAGES=$IMAGES: expected docker (the default) or offline" >&2; exit 2 ;;
esac

mode=${ELASTRA_KIND_IMAGE:-}
if [[ -z $mode ]]; then
  if command -v "$KIND" >/dev/null 2>&1 && docker version >/dev/null 2>&1; then
    mode=published
  else
    mode=local
  fi
fi
cluster=("$PYTHON" -m e2e.kind.cluster)
if [[ $mode == local ]]; then
  e2e/kind/build.sh >/dev/null
  KIND="$(e2e/kind/build.sh --print-bindir)/kind"
  cluster+=(--image local)
else
  command -v "$KIND" >/dev/null 2>&1 || {
    echo "e2e-kind: '$KIND' not found: install kind (https://kind.sigs.k8s.io) and docker, set" \
         "KIND=/path/to/kind, or use ELASTRA_KIND_IMAGE=local (make kind-image)." >&2
    exit 2
  }
  export ELASTRA_KIND_DOCKERD=0
  cluster+=(--kind "$KIND" --image "$([[ $mode == published ]] && echo "" || echo "$mode")")
fi

work=$(mktemp -d)
cleanup() {
  echo "e2e-kind: deleting cluster $NAME"
  "${cluster[@]}" down --name "$NAME" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "e2e-kind: creating cluster $NAME ($mode node image)"
"${cluster[@]}" up --name "$NAME" --config e2e/kind-config.yaml --kubeconfig "$work/kubeconfig" --wait 5m
eval "$("${cluster[@]}" env --name "$NAME")"  # DOCKER_HOST and PATH of the daemon kind used

echo "e2e-kind: building the worker and operator images from their Dockerfiles and offline"
"$PYTHON" -m e2e.images.docker build worker operator  # builds the offline ones too, compares
# Only into the nodes that run pods, blobs dropped once unpacked (see e2e/kind/images.py).
"$PYTHON" -m e2e.kind.images --name "$NAME" --kind "$KIND" --from "$IMAGES" worker operator
echo "e2e-kind: images in; disk free here: $(df -h --output=avail . | tail -1 | tr -d ' ')"

echo "e2e-kind: running the e2e suite (timeout ${TIMEOUT}s)"
ELASTRA_E2E_KUBECONFIG="$work/kubeconfig" timeout -k 30 "$TIMEOUT" "$PYTHON" -m pytest e2e/suite "$@"
