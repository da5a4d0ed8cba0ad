#!/usr/bin/env bash
# Build the Kubernetes test toolchain from the official Go modules into a per-user cache.
#
# Why: these machines reach the Go module proxy but no image registry or download site, so
# etcd, the control plane, kubectl, kubelet, kube-proxy, kwok and helm are compiled from their
# published modules. The wrapper modules beside this script (kubernetes/, etcd/, kwok/, helm/)
# pin every version in their go.mod/go.sum; the cache key is a hash of those files, RECIPE below
# and the Go version, so a warm machine skips the build in about a second and a pin change
# builds into a fresh folder. Kueue's manager (kueue/, for the Kueue integration tests) is
# built the same way into a folder of its own, keyed by its own pins, so bumping Kueue never
# rebuilds Kubernetes and the reverse; its CRDs are copied from the module's source beside it.
# Karpenter with its kwok provider (karpenter/, for the autoscaling tests and `up --autoscaler
# karpenter`) is built the same way, but only when asked for (--karpenter): most runs never
# start it, and it costs a cold machine about 10 more minutes.
#
#   e2e/toolchain/build.sh                       build if needed, then print the bin dir last
#   e2e/toolchain/build.sh --print-bindir        print the bin dir (built or not) and exit
#   e2e/toolchain/build.sh --print-kueue-dir     print Kueue's folder (bin/kueue, crds/) and exit
#   e2e/toolchain/build.sh --check               exit 0 when the cache is warm, 1 when not
#   e2e/toolchain/build.sh --karpenter           build Karpenter if needed, print its folder last
#   e2e/toolchain/build.sh --print-karpenter-dir print Karpenter's folder (bin/karpenter, crds/)
#   e2e/toolchain/build.sh --check-karpenter     exit 0 when Karpenter's cache is warm, 1 when not
#
# Cache: ${ELASTRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastra}/toolchain/<key>/bin
#        ${ELASTRA_CACHE:-...}/toolchain/kueue-<version>-<hash>/{bin/kueue,crds/*.yaml}
#        ${ELASTRA_CACHE:-...}/toolchain/karpenter-<version>-<hash>/{bin/karpenter,crds/*.yaml}
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULES=(kubernetes etcd kwok helm)
CACHE_ROOT="${ELASTRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastra}/toolchain"
# Bump when the build flags or the set of binaries change, so caches built the old way are not
# reused (editing comments or messages here does not invalidate the cache).
RECIPE=1
KUEUE_RECIPE=1
KARPENTER_RECIPE=1

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
# Go's compile cache of the project's builds (here, CoreDNS and the kind binaries, which share
# much of it) lives in the project's cache unless the user set GOCACHE: it grows to ~7 GB, and
# e2e/kind/build.sh, the last build `make test` runs, removes it before the kind cluster needs
# the disk.
export GOCACHE="${GOCACHE:-${ELASTRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elastra}/go-build}"

say() { printf 'toolchain: %s\n' "$*" >&2; }
die() { printf 'toolchain: error: %s\n' "$*" >&2; exit 1; }

need_go() {
  command -v go >/dev/null 2>&1 ||
    die "'go' is not on PATH. Install Go >= 1.26 (Debian bookworm's golang package is too old), put it on PATH and retry."
  local have want
  have="$(go env GOVERSION)"          # e.g. go1.26.8
  want="$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$HERE/kubernetes/go.mod")"
  if [[ "$(printf '%s\n%s\n' "go$want" "$have" | sort -V | head -1)" != "go$want" ]]; then
    die "Go $have is older than go$want, which the pinned Kubernetes needs (GOTOOLCHAIN=local: no automatic download). Install a newer Go."
  fi
}

# The key changes whenever a pin, the recipe or the compiler changes.
cache_key() {
  local k8s hash
  k8s="$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p; s/^\tk8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' \
    "$HERE/kubernetes/go.mod" | head -1)"
  [[ -n "$k8s" ]] || die "cannot read the k8s.io/kubernetes version from $HERE/kubernetes/go.mod"
  hash="$( { go env GOVERSION; echo "recipe=$RECIPE";
             for m in "${MODULES[@]}"; do cat "$HERE/$m/go.mod" "$HERE/$m/go.sum"; done; } |
           sha256sum | cut -c1-12)"
  printf 'k8s-%s-%s' "$k8s" "$hash"
}

modversion() {  # modversion DIR MODULE -> version selected in that wrapper module
  (cd "$HERE/$1" && go list -m -f '{{.Version}}' "$2")
}

tools_of() {  # the tool directives of a wrapper module
  (cd "$HERE/$1" && go mod edit -json | python3 -c \
    'import json,sys; print(" ".join(t["Path"] for t in json.load(sys.stdin).get("Tool") or []))')
}

ldflags_for() {
  local m="$1" v major minor
  case "$m" in
    kubernetes)
      v="$(modversion kubernetes k8s.io/kubernetes)"
      major="${v#v}"; major="${major%%.*}"
      minor="$(cut -d. -f2 <<<"$v")"
      local f=""
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        f+=" -X $pkg.gitTreeState=clean"
      done
      printf '%s' "$f" ;;
    etcd)
      v="$(modversion etcd go.etcd.io/etcd/server/v3)"
      printf ' -X go.etcd.io/etcd/api/v3/version.GitSHA=module-%s' "$v" ;;
    kwok)
      v="$(modversion kwok sigs.k8s.io/kwok)"
      printf ' -X sigs.k8s.io/kwok/pkg/consts.Version=%s' "${v#v}" ;;
    helm)
      v="$(modversion helm helm.sh/helm/v3)"
      minor="$(modversion helm k8s.io/client-go | cut -d. -f2)"
      printf ' -X helm.sh/helm/v3/internal/version.version=%s' "$v"
      printf ' -X helm.sh/helm/v3/internal/version.gitTreeState=clean'
      for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        printf ' -X %s.k8sVersionMajor=1 -X %s.k8sVersionMinor=%s' "$pkg" "$pkg" "$minor"
      done ;;
  esac
}

# Needs in GiB: the toolchain (~0.7), the module cache (~2) and the Go build cache (~4.5, up
# to 7); a smaller build passes its own three figures (cache, module cache, build cache).
# Folders on one filesystem add up.
check_disk() {
  local -A need=() where=()
  local dir gib fs free_kib
  for spec in "$CACHE_ROOT:${1:-1}" "$(go env GOMODCACHE):${2:-3}" "$(go env GOCACHE):${3:-5}"; do
    dir="${spec%:*}"; gib="${spec##*:}"
    mkdir -p "$dir"
    fs="$(df -P "$dir" | awk 'NR==2 {print $6}')"
    need[$fs]=$(( ${need[$fs]:-0} + gib ))
    where[$fs]="${where[$fs]:+${where[$fs]}, }$dir"
  done
  for fs in "${!need[@]}"; do
    free_kib="$(df -Pk "$fs" | awk 'NR==2 {print $4}')"
    if (( free_kib < need[$fs] * 1024 * 1024 )); then
      die "only $((free_kib / 1024 / 1024)) GiB free on $fs (${where[$fs]}); a cold build needs about ${need[$fs]} GiB there. Free some disk (e.g. 'go clean -cache') or point ELASTRA_CACHE, GOCACHE or GOMODCACHE elsewhere."
    fi
  done
}

explain_failure() {  # explain_failure LOG WHAT
  local log="$1" what="$2"
  if grep -q 'no space left on device' "$log"; then
    die "$what failed: the disk is full (see $log). Free space or set ELASTRA_CACHE/GOCACHE to a bigger disk."
  elif grep -Eq 'dial tcp|lookup .*(no such host|server misbehaving)|proxyconnect|i/o timeout|TLS handshake|connection refused' "$log"; then
    die "$what failed: the Go module proxy ($(go env GOPROXY)) is unreachable (see $log). Check the network or GOPROXY, then retry."
  fi
  tail -n 20 "$log" >&2
  die "$what failed; full log: $log"
}

# Prints a heartbeat while a long step runs, so a cold build never looks hung.
with_heartbeat() {  # with_heartbeat LOG LABEL CMD...
  local log="$1" label="$2" start=$SECONDS pid rc=0
  shift 2
  "$@" >>"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null &&
      say "  ... $label: $((SECONDS - start))s, $(grep -c '' "$log") log lines"
  done
  wait "$pid" || rc=$?
  return "$rc"
}

build() {
  local key="$1" dest="$CACHE_ROOT/$1" stage log started=$SECONDS
  check_disk
  stage="$CACHE_ROOT/.build-$key-$$"
  rm -rf "$stage"; mkdir -p "$stage/bin"
  log="$CACHE_ROOT/build-$key.log"   # outside $stage: it must outlive a failed build
  : >"$log"
  trap 'rm -rf "$stage"' EXIT
  say "cold cache: building into $dest (log: $log; 20-30 min on 2 cores)"
  local i=0 m
  for m in "${MODULES[@]}"; do
    i=$((i + 1))
    say "[$i/${#MODULES[@]}] $m: downloading modules"
    (cd "$HERE/$m" && with_heartbeat "$log" "$m download" go mod download) ||
      explain_failure "$log" "downloading the $m modules"
    local flags tools t
    flags="-s -w$(ldflags_for "$m")"
    read -r -a tools <<<"$(tools_of "$m")"
    for t in "${tools[@]}"; do
      say "[$i/${#MODULES[@]}] $m: go build $(basename "$t")"
      (cd "$HERE/$m" && with_heartbeat "$log" "$(basename "$t")" \
        go build -v -p 2 -trimpath -ldflags "$flags" -o "$stage/bin/" "$t") ||
        explain_failure "$log" "building $t"
    done
  done
  # etcd's main package is go.etcd.io/etcd/server/v3, which go build names "server".
  mv "$stage/bin/server" "$stage/bin/etcd"
  "$stage/bin/kube-apiserver" --version >>"$log" 2>&1 || explain_failure "$log" "kube-apiserver --version"
  {
    echo "key=$key"; echo "go=$(go env GOVERSION)"; echo "built=$(date -u +%FT%TZ)"
    echo "seconds=$((SECONDS - started))"
    for m in "${MODULES[@]}"; do
      case "$m" in
        kubernetes) echo "kubernetes=$(modversion kubernetes k8s.io/kubernetes)" ;;
        etcd) echo "etcd=$(modversion etcd go.etcd.io/etcd/server/v3)" ;;
        kwok) echo "kwok=$(modversion kwok sigs.k8s.io/kwok)" ;;
        helm) echo "helm=$(modversion helm helm.sh/helm/v3)" ;;
      esac
    done
  } >"$stage/MANIFEST"
  mv "$log" "$stage/build.log"
  rm -rf "$dest"
  mv "$stage" "$dest"
  trap - EXIT
  say "built in $((SECONDS - started))s: $(ls "$dest/bin" | tr '\n' ' ')"
}

# --- Go tools with a folder and key of their own (Kueue, Karpenter) ------------------------

# tool_key NAME MODULE RECIPE -> NAME-<MODULE's version>-<hash of $HERE/NAME's pins and RECIPE>
tool_key() {
  local name="$1" module="$2" recipe="$3" v hash
  v="$(modversion "$name" "$module")" || die "cannot read the $module version from $HERE/$name/go.mod"
  hash="$( { go env GOVERSION; echo "recipe=$recipe";
             cat "$HERE/$name/go.mod" "$HERE/$name/go.sum"; } | sha256sum | cut -c1-12)"
  printf '%s-%s-%s' "$name" "$v" "$hash"
}

# build_tool KEY NAME LABEL MODULE PACKAGE VERSION_VAR CRD...
# One Go tool built from the wrapper module $HERE/NAME into its own cache folder KEY: bin/NAME
# from PACKAGE, with VERSION_VAR (an -X path) set to MODULE's version, and crds/ the CRD files
# (paths or globs relative to MODULE's source in the module cache) copied from the same
# module, so the CRDs always match the binary. Nothing of the tool's is committed here.
build_tool() {
  local key="$1" name="$2" label="$3" module="$4" pkg="$5" version_var="$6"
  shift 6
  local dest="$CACHE_ROOT/$key" stage log started=$SECONDS v src crd
  local -a crds=()
  stage="$CACHE_ROOT/.build-$key-$$"
  rm -rf "$stage"; mkdir -p "$stage/bin" "$stage/crds"
  log="$CACHE_ROOT/build-$key.log"
  : >"$log"
  trap 'rm -rf "$stage"' EXIT
  v="$(modversion "$name" "$module")"
  say "cold $label cache: building $label $v ($pkg) into $dest (log: $log; about 10 min on 2 cores)"
  say "[1/2] $name: downloading modules"
  (cd "$HERE/$name" && with_heartbeat "$log" "$name download" go mod download) ||
    explain_failure "$log" "downloading the $name modules"
  say "[2/2] $name: go build $pkg"
  (cd "$HERE/$name" && with_heartbeat "$log" "$name" \
    go build -v -p 2 -trimpath -ldflags "-s -w -X $version_var=$v" \
      -o "$stage/bin/$name" "$pkg") ||
    explain_failure "$log" "building $pkg"
  src="$(cd "$HERE/$name" && go list -m -f '{{.Dir}}' "$module")"
  for crd in "$@"; do
    # shellcheck disable=SC2206  # a CRD path may be a glob: expanded here, on purpose
    crds+=("$src"/$crd)
  done
  cp "${crds[@]}" "$stage/crds/" || die "$label's CRDs are not where $src had them: $*"
  chmod u+w "$stage"/crds/*.yaml  # the module cache is read-only
  {
    echo "key=$key"; echo "go=$(go env GOVERSION)"; echo "built=$(date -u +%FT%TZ)"
    echo "seconds=$((SECONDS - started))"; echo "$name=$v"
  } >"$stage/MANIFEST"
  mv "$log" "$stage/build.log"
  rm -rf "$dest"
  mv "$stage" "$dest"
  trap - EXIT
  say "built $label in $((SECONDS - started))s: $dest/bin/$name, $(ls "$dest/crds" | wc -l) CRDs"
}

# --- Kueue: its own folder and key ------------------------------------------------------------

kueue_key() { tool_key kueue sigs.k8s.io/kueue "$KUEUE_RECIPE"; }

# Kueue's manager, and its CRDs (config/components/crd/bases in the module zip).
build_kueue() {  # build_kueue KEY
  build_tool "$1" kueue Kueue sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue \
    sigs.k8s.io/kueue/pkg/version.GitVersion 'config/components/crd/bases/*.yaml'
}

# --- Karpenter: its own folder and key, built only on request --------------------------------

karpenter_key() { tool_key karpenter sigs.k8s.io/karpenter "$KARPENTER_RECIPE"; }

# The kwok provider's main package (sigs.k8s.io/karpenter/kwok: Karpenter's controllers with a
# cloud provider that creates Node objects for NodeClaims), and the CRDs it needs from the same
# module's source: NodePool and NodeClaim as the provider's chart ships them (they reserve the
# karpenter.kwok.sh label domain) and KWOKNodeClass. NodeOverlay and CapacityBuffer are left
# out: their controllers run only behind feature gates that are off by default, and
# CapacityBuffer's group (autoscaling.x-k8s.io) is the one ProvisioningRequest is served in.
build_karpenter() {  # build_karpenter KEY
  build_tool "$1" karpenter Karpenter sigs.k8s.io/karpenter sigs.k8s.io/karpenter/kwok \
    sigs.k8s.io/karpenter/pkg/operator.Version \
    kwok/charts/crds/karpenter.sh_nodepools.yaml kwok/charts/crds/karpenter.sh_nodeclaims.yaml \
    kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml
}

# One build at a time per cache (two checkouts, or make -j, may call this together).
take_lock() {
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  if ! flock -n 9; then
    say "another build holds $CACHE_ROOT/.lock; waiting for it"
    flock 9
  fi
}

karpenter_main() {  # karpenter_main MODE
  local kpkey kpdir
  kpkey="$(karpenter_key)"
  kpdir="$CACHE_ROOT/$kpkey"
  case "$1" in
    print-karpenter) echo "$kpdir"; return ;;
    check-karpenter) [[ -f "$kpdir/MANIFEST" ]]; return ;;
  esac
  take_lock
  if [[ -f "$kpdir/MANIFEST" ]]; then
    say "warm Karpenter cache: $kpdir"
  else
    check_disk 1 1 2
    build_karpenter "$kpkey"
  fi
  echo "$kpdir"
}

main() {
  local mode="build"
  case "${1:-}" in
    --print-bindir) mode="print" ;;
    --check) mode="check" ;;
    --print-kueue-dir) mode="print-kueue" ;;
    --karpenter) mode="karpenter" ;;
    --print-karpenter-dir) mode="print-karpenter" ;;
    --check-karpenter) mode="check-karpenter" ;;
    -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
  need_go
  if [[ "$mode" == *karpenter ]]; then
    karpenter_main "$mode"
    return
  fi
  local key bindir kkey
  key="$(cache_key)"
  kkey="$(kueue_key)"
  bindir="$CACHE_ROOT/$key/bin"
  case "$mode" in
    print) echo "$bindir"; return ;;
    print-kueue) echo "$CACHE_ROOT/$kkey"; return ;;
    check) [[ -f "$CACHE_ROOT/$key/MANIFEST" && -f "$CACHE_ROOT/$kkey/MANIFEST" ]]; return ;;
  esac
  take_lock
  if [[ -f "$CACHE_ROOT/$key/MANIFEST" ]]; then
    say "warm cache: $bindir"
  else
    build "$key"
  fi
  if [[ -f "$CACHE_ROOT/$kkey/MANIFEST" ]]; then
    say "warm Kueue cache: $CACHE_ROOT/$kkey"
  else
    check_disk
    build_kueue "$kkey"
  fi
  echo "$bindir"
}

main "$@"
