#!/usr/bin/env bash
# make kind-image: build kind, kubeadm, CoreDNS and the runc wrapper from their Go modules, then
# kind's node image from them and the toolchain's Kubernetes binaries, with no registry.
#
# Why: kind and its published node image come from download sites and a registry these
# machines cannot reach; the Go module proxy and Debian's packages are reachable. kubeadm is
# built from e2e/kind/kubeadm (the toolchain's Kubernetes pins with kubeadm's go.sum entries
# added) so that it matches the toolchain's Kubernetes version without changing the
# toolchain's own cache key. The node image itself is e2e/kind/nodeimage.py.
#
#   e2e/kind/build.sh                 build if needed; print the node image's tag last
#   e2e/kind/build.sh --print-bindir  print the folder of kind, kubeadm, coredns, runcwrap
#   e2e/kind/build.sh --coredns       build CoreDNS alone if needed (the real node's cluster
#                                     DNS, e2e/node); print the binary's path last
#
# Cache: ${ELASTRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastra}/kind/bin-<key>/ (binaries),
#        .../kind/coredns-<version>-<go version>/coredns (CoreDNS alone, copied into bin-<key>),
#        .../images/layers/kind-*.tar (the node image's layers), .../kind/node-image.json.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${ELASTRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastra}"
CACHE_ROOT="$CACHE/kind"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
KIND_VERSION=v0.33.0
COREDNS_VERSION=v1.14.2   # kubeadm v1.36's CoreDNS (kubeadm config images list)
# Bump when the build flags or the set of binaries change.
RECIPE=1

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
# The project's Go compile cache, shared with e2e/toolchain/build.sh (see there) unless the
# user set GOCACHE. Once the node image is built no build of `make test` needs it, and the kind
# cluster needs the disk: main removes it then (~7 GB after a cold toolchain build).
OWN_GOCACHE=""
[[ -n "${GOCACHE:-}" ]] || OWN_GOCACHE="$CACHE/go-build"
export GOCACHE="${GOCACHE:-$OWN_GOCACHE}"

say() { printf 'kind-image: %s\n' "$*" >&2; }
die() { printf 'kind-image: error: %s\n' "$*" >&2; exit 1; }

k8s_version() {
  (cd "$HERE/kubeadm" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
}

cache_key() {
  local hash
  hash="$( { go env GOVERSION; echo "recipe=$RECIPE kind=$KIND_VERSION coredns=$COREDNS_VERSION";
             cat "$HERE/kubeadm/go.mod" "$HERE/kubeadm/go.sum" "$HERE/runcwrap/go.mod" \
                 "$HERE"/runcwrap/*.go; } | sha256sum | cut -c1-12)"
  printf 'bin-%s' "$hash"
}

# The toolchain's and kubeadm's Kubernetes must be the same release.
check_versions() {
  local tool ours
  tool="$(sed -n 's/^kubernetes=//p' "$(dirname "$TOOLCHAIN_BIN")/MANIFEST")"
  ours="$(k8s_version)"
  [[ "$tool" == "$ours" ]] ||
    die "e2e/kind/kubeadm pins Kubernetes $ours but the toolchain is $tool: regenerate e2e/kind/kubeadm/go.mod from e2e/toolchain/kubernetes (see e2e/kind/NOTES.md)"
}

with_log() {  # with_log LOG LABEL CMD...: run, print a heartbeat every 30 s
  local log="$1" label="$2" start=$SECONDS pid rc=0
  shift 2
  "$@" >>"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && say "  ... $label: $((SECONDS - start))s"
  done
  wait "$pid" || rc=$?
  if (( rc != 0 )); then tail -n 20 "$log" >&2; die "$label failed; full log: $log"; fi
}

build_bins() {
  local key="$1" dest="$CACHE_ROOT/$1" stage log started=$SECONDS v flags=""
  stage="$CACHE_ROOT/.build-$key-$$"
  log="$CACHE_ROOT/build-$key.log"
  rm -rf "$stage"; mkdir -p "$stage"; : >"$log"
  trap 'rm -rf "$stage"' EXIT
  say "building kind $KIND_VERSION, kubeadm $(k8s_version), CoreDNS $COREDNS_VERSION, runcwrap into $dest (log: $log)"
  say "[1/4] kind $KIND_VERSION"
  # go install pkg@version needs no module of ours (kind's go.mod has no replace directives).
  with_log "$log" kind env GOFLAGS= GOBIN="$stage" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kind@$KIND_VERSION"
  say "[2/4] kubeadm $(k8s_version)"
  v="$(k8s_version)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(cut -d. -f2 <<<"$v")"
    flags+=" -X $pkg.gitTreeState=clean"
  done
  (cd "$HERE/kubeadm" && with_log "$log" kubeadm go build -p 2 -trimpath \
    -ldflags "-s -w$flags" -o "$stage/kubeadm" k8s.io/kubernetes/cmd/kubeadm)
  say "[3/4] CoreDNS $COREDNS_VERSION"
  cp "$(coredns_bin)" "$stage/coredns"
  say "[4/4] runcwrap"
  (cd "$HERE/runcwrap" && with_log "$log" runcwrap go build -trimpath -ldflags "-s -w" \
    -o "$stage/runcwrap" .)
  "$stage/kubeadm" version -o short >>"$log"
  mv "$log" "$stage/build.log"
  rm -rf "$dest"; mv "$stage" "$dest"
  trap - EXIT
  say "built in $((SECONDS - started))s: $(ls "$dest" | tr '\n' ' ')"
}

# CoreDNS alone, built once per version and Go release (kind's node image and the real node's
# cluster DNS both use it); prints the binary's path.
coredns_bin() {
  local dir stage
  dir="$CACHE_ROOT/coredns-$COREDNS_VERSION-$(go env GOVERSION)"
  mkdir -p "$CACHE_ROOT"
  exec 8>"$CACHE_ROOT/.coredns.lock"
  flock 8
  if [[ ! -x "$dir/coredns" ]]; then
    stage="$dir.build-$$"
    rm -rf "$stage"; mkdir -p "$stage"
    say "building CoreDNS $COREDNS_VERSION into $dir (a few minutes when cold; log: $stage/build.log)"
    with_log "$stage/build.log" coredns env GOFLAGS= GOBIN="$stage" go install -p 2 -trimpath \
      -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
    rm -rf "$dir"; mv "$stage" "$dir"
  fi
  exec 8>&-
  echo "$dir/coredns"
}

main() {
  command -v go >/dev/null 2>&1 || die "'go' is not on PATH (Go >= 1.26 is needed, as for make toolchain)"
  local key
  key="$(cache_key)"
  if [[ "${1:-}" == "--print-bindir" ]]; then echo "$CACHE_ROOT/$key"; return; fi
  if [[ "${1:-}" == "--coredns" ]]; then coredns_bin; return; fi
  [[ $# -eq 0 ]] || die "unknown option '$1'"
  [[ $EUID -eq 0 ]] || die "the node image needs root (debootstrap, chroot, containerd)"
  TOOLCHAIN_BIN="$("$REPO/e2e/toolchain/build.sh" | tail -1)"
  check_versions
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  if ! flock -n 9; then say "another build holds $CACHE_ROOT/.lock; waiting"; flock 9; fi
  if [[ -f "$CACHE_ROOT/$key/build.log" ]]; then
    say "warm binaries: $CACHE_ROOT/$key"
  else
    build_bins "$key"
  fi
  # Binaries built for other keys are not needed any more.
  find "$CACHE_ROOT" -maxdepth 1 -name 'bin-*' ! -name "$key" -exec rm -rf {} +
  cd "$REPO"
  "$PYTHON" -m e2e.kind.nodeimage build --toolchain-bin "$TOOLCHAIN_BIN" --kind-bin "$CACHE_ROOT/$key"
  if [[ -n "$OWN_GOCACHE" && -d "$OWN_GOCACHE" ]]; then
    say "removing the Go compile cache ($(du -sh "$OWN_GOCACHE" | cut -f1)): every binary is built"
    # Under the toolchain's lock: a toolchain build of another checkout may be using it.
    flock "$CACHE/toolchain/.lock" rm -rf "$OWN_GOCACHE"
  fi
}

main "$@"
