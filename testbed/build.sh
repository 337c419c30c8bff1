#!/usr/bin/env bash
# Build the local Kubernetes test bed binaries from the Go module proxy.
#
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok and helm at the
# versions pinned in testbed/versions.env, with CGO_ENABLED=0, into a cache OUTSIDE the checkout:
#
#   ${SPECFLEET_CACHE:-$HOME/.cache/specfleet}/testbed/<key>/bin/
#   ${SPECFLEET_CACHE:-$HOME/.cache/specfleet}/testbed/<key>/share/kwok-stages.yaml
#
# The kwok binary has no stages of its own (only kwokctl embeds them), so the stage YAML is assembled
# from the pinned kwok module (node-initialize, node-heartbeat-with-lease, pod-ready/complete/delete).
#
# where <key> is a hash of the KEY=VALUE lines of versions.env (comments do not count).
# The Go module and build caches live next to it (.../testbed/go/{mod,build,path}) and are shared by
# every key, so a version bump or a fresh clone on the same machine reuses what was downloaded.
#
# A warm run (every binary present and reporting its pinned version) builds nothing and takes about a
# second. The bin dir is the last line of stdout: BIN=$(testbed/build.sh | tail -1). Logs go to stderr.
# Safe to re-run after an interruption: binaries are linked into a staging dir and moved in atomically,
# and a lock keeps two concurrent runs from building the same thing twice.
#
# Environment: SPECFLEET_CACHE (cache root), GO (go binary), GOTOOLCHAIN (default "local"; the one
# approved fallback, should a pin ever need a newer Go, is GOTOOLCHAIN=go1.27.3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSIONS_FILE="${HERE}/versions.env"

log() { printf '[testbed/build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -f "${VERSIONS_FILE}" ]] || die "missing ${VERSIONS_FILE}"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "${VERSIONS_FILE}"
for var in KUBERNETES_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION; do
  [[ -n "${!var:-}" ]] || die "${var} is not set in ${VERSIONS_FILE}"
done

# Find Go: PATH first, then the usual install location on these machines.
GO="${GO:-$(command -v go || true)}"
[[ -n "${GO}" ]] || GO=/usr/local/go/bin/go
[[ -x "${GO}" ]] || die "no Go toolchain found (set GO=/path/to/go)"

CACHE_ROOT="${SPECFLEET_CACHE:-${HOME}/.cache/specfleet}/testbed"
# Hash only the pins, so editing a comment does not trigger a 30-minute rebuild.
KEY="$(grep -E '^[A-Z_]+=' "${VERSIONS_FILE}" | sort | sha256sum | cut -c1-16)"
KEY_DIR="${CACHE_ROOT}/${KEY}"
BIN_DIR="${KEY_DIR}/bin"
KWOK_STAGES="${KEY_DIR}/share/kwok-stages.yaml"

KUBE_SEMVER="${KUBERNETES_VERSION#v}"        # 1.36.3
KUBE_MAJOR="${KUBE_SEMVER%%.*}"              # 1
KUBE_MINOR="$(cut -d. -f2 <<<"${KUBE_SEMVER}")" # 36
STAGING_VERSION="v0.${KUBE_SEMVER#*.}"       # v0.36.3: staging modules track Kubernetes v1.X.Y as v0.X.Y
ETCD_SEMVER="${ETCD_VERSION#v}"

# --- warm check -------------------------------------------------------------------------------------

# version_ok NAME: does bin/NAME exist and report the pinned version?
version_ok() {
  local name="$1" bin="${BIN_DIR}/$1" out
  [[ -x "${bin}" ]] || return 1
  case "${name}" in
    kube-apiserver|kube-controller-manager|kube-scheduler)
      out="$("${bin}" --version 2>&1)" || return 1
      [[ "${out}" == "Kubernetes ${KUBERNETES_VERSION}" ]] ;;
    kubectl)
      out="$("${bin}" version --client 2>&1)" || return 1
      grep -qx "Client Version: ${KUBERNETES_VERSION}" <<<"${out}" ;;
    etcd)
      out="$("${bin}" --version 2>&1)" || return 1
      grep -qx "etcd Version: ${ETCD_SEMVER}" <<<"${out}" ;;
    kwok)
      out="$("${bin}" --version 2>&1)" || return 1
      grep -q "${KWOK_VERSION}\b" <<<"${out}" ;;
    helm)
      out="$("${bin}" version --short 2>&1)" || return 1
      [[ "${out}" == "${HELM_VERSION}"* ]] ;;
    *) return 1 ;;
  esac
}

ALL_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm)

missing_binaries() {
  local name
  for name in "$@"; do
    version_ok "${name}" || printf '%s\n' "${name}"
  done
}

if [[ -z "$(missing_binaries "${ALL_BINARIES[@]}")" && -s "${KWOK_STAGES}" ]]; then
  log "all binaries present and at their pinned versions (warm)"
  echo "${BIN_DIR}"
  exit 0
fi

# --- cold path: build what is missing ---------------------------------------------------------------

mkdir -p "${BIN_DIR}" "${KEY_DIR}/src"
# One build at a time per cache: a second caller waits, then finds everything warm.
exec 9>"${CACHE_ROOT}/build.lock"
log "waiting for the build lock ${CACHE_ROOT}/build.lock"
flock 9

export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOPATH="${CACHE_ROOT}/go/path"
export GOMODCACHE="${CACHE_ROOT}/go/mod"
export GOCACHE="${CACHE_ROOT}/go/build"
export GOFLAGS="-buildvcs=false"
export GOWORK=off
# Two cores: at most two packages compile at once, and the linker keeps its memory to itself.
BUILD_FLAGS=(-p 2 -trimpath)
log "go: $("${GO}" version); cache root: ${CACHE_ROOT}; key: ${KEY}"

STAGE="${KEY_DIR}/stage"

# install_staged NAME...: move freshly built binaries from the staging dir into bin/ atomically.
install_staged() {
  local name
  for name in "$@"; do
    mv -f "${STAGE}/${name}" "${BIN_DIR}/${name}"
    version_ok "${name}" || die "${name} was built but does not report its pinned version"
    log "built ${name}"
  done
}

# build_kubernetes NAME...: kube-* and kubectl from k8s.io/kubernetes through a consumer module.
build_kubernetes() {
  local mod_dir="${KEY_DIR}/src/kubernetes" gomod_file staging_replaces name pkgs=()
  mkdir -p "${mod_dir}"
  log "downloading k8s.io/kubernetes@${KUBERNETES_VERSION}"
  gomod_file="$(cd "${mod_dir}" && "${GO}" mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "${gomod_file}" ]] || die "could not download k8s.io/kubernetes@${KUBERNETES_VERSION}"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging/...;
  # a consumer must replace each with the published v0.X.Y. Generate the list from that go.mod.
  staging_replaces="$(sed -n 's|^[[:space:]]*\(k8s\.io/[A-Za-z0-9._/-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*$|\1|p' \
    "${gomod_file}" | sort -u | sed "s|.*|\t& => & ${STAGING_VERSION}|")"
  [[ -n "${staging_replaces}" ]] || die "found no staging replace lines in ${gomod_file}"
  log "replacing $(wc -l <<<"${staging_replaces}") staging modules with ${STAGING_VERSION}"
  for name in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/${name}"); done
  {
    echo "// Generated by testbed/build.sh: builds Kubernetes ${KUBERNETES_VERSION} binaries."
    echo "module specfleet.local/testbed/kubernetes"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
    echo
    echo "replace ("
    echo "${staging_replaces}"
    echo ")"
    echo
    echo "tool ("
    printf '\tk8s.io/kubernetes/cmd/%s\n' kube-apiserver kube-controller-manager kube-scheduler kubectl
    echo ")"
  } >"${mod_dir}/go.mod.new"
  # Only rewrite go.mod (and re-tidy) when its content changed: keeps re-runs cheap.
  if ! cmp -s "${mod_dir}/go.mod.new" "${mod_dir}/go.mod.in" 2>/dev/null || [[ ! -f "${mod_dir}/go.sum" ]]; then
    cp "${mod_dir}/go.mod.new" "${mod_dir}/go.mod"
    log "go mod tidy (kubernetes consumer module)"
    (cd "${mod_dir}" && "${GO}" mod tidy) >&2
    mv -f "${mod_dir}/go.mod.new" "${mod_dir}/go.mod.in"
  fi
  # Same ldflags as hack/lib/version.sh, for both version packages (client-go's is kubectl's).
  local ldflags="-s -w" pkg key val
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    for key in gitVersion gitMajor gitMinor gitTreeState buildDate; do
      case "${key}" in
        gitVersion) val="${KUBERNETES_VERSION}" ;;
        gitMajor) val="${KUBE_MAJOR}" ;;
        gitMinor) val="${KUBE_MINOR}" ;;
        gitTreeState) val="clean" ;;
        buildDate) val="1970-01-01T00:00:00Z" ;; # fixed: rebuilds stay byte-identical and cache-friendly
      esac
      ldflags+=" -X ${pkg}.${key}=${val}"
    done
  done
  rm -rf "${STAGE}" && mkdir -p "${STAGE}"
  log "go build ${pkgs[*]} (20-30 minutes on 2 cores with a cold Go build cache)"
  (cd "${mod_dir}" && "${GO}" build "${BUILD_FLAGS[@]}" -tags=selinux,notest,grpcnotrace \
    -ldflags="${ldflags}" -o "${STAGE}/" "${pkgs[@]}") >&2
  install_staged "$@"
}

# build_etcd: go.etcd.io/etcd/server/v3 (package main) through its own consumer module, because its
# go.mod has replace lines (so `go install ...@version` refuses it) and its dependency versions differ
# from Kubernetes'.
build_etcd() {
  local mod_dir="${KEY_DIR}/src/etcd"
  mkdir -p "${mod_dir}"
  cat >"${mod_dir}/go.mod.new" <<EOF
// Generated by testbed/build.sh: builds etcd ${ETCD_VERSION}.
module specfleet.local/testbed/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}

tool go.etcd.io/etcd/server/v3
EOF
  if ! cmp -s "${mod_dir}/go.mod.new" "${mod_dir}/go.mod.in" 2>/dev/null || [[ ! -f "${mod_dir}/go.sum" ]]; then
    cp "${mod_dir}/go.mod.new" "${mod_dir}/go.mod"
    log "go mod tidy (etcd consumer module)"
    (cd "${mod_dir}" && "${GO}" mod tidy) >&2
    mv -f "${mod_dir}/go.mod.new" "${mod_dir}/go.mod.in"
  fi
  rm -rf "${STAGE}" && mkdir -p "${STAGE}"
  log "go build etcd ${ETCD_VERSION}"
  (cd "${mod_dir}" && "${GO}" build "${BUILD_FLAGS[@]}" -ldflags="-s -w" \
    -o "${STAGE}/etcd" go.etcd.io/etcd/server/v3) >&2
  install_staged etcd
}

# go_install NAME PACKAGE@VERSION LDFLAGS: modules without replace lines install directly.
go_install() {
  local name="$1" pkg="$2" ldflags="$3"
  rm -rf "${STAGE}" && mkdir -p "${STAGE}"
  log "go install ${pkg}"
  (cd "${KEY_DIR}" && GOBIN="${STAGE}" "${GO}" install "${BUILD_FLAGS[@]}" -ldflags="${ldflags}" "${pkg}") >&2
  install_staged "${name}"
}

build_helm() {
  # Helm's Makefile sets the default Kubernetes version (for `helm template` and lint) from the
  # client-go it builds against (v0.X.Y -> 1.X); do the same.
  local gomod client_go minor
  gomod="$(cd "${KEY_DIR}" && "${GO}" mod download -json "helm.sh/helm/v3@${HELM_VERSION}" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  client_go="$(sed -n 's/^[[:space:]]*k8s\.io\/client-go[[:space:]]\+\(v[0-9.]*\).*/\1/p' "${gomod}" | head -1)"
  minor="$(cut -d. -f2 <<<"${client_go}")"
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  ldflags+=" -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  if [[ -n "${minor}" ]]; then
    ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${minor}"
    ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${minor}"
  fi
  go_install helm "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" "${ldflags}"
}

# kwok_stages: the "fast" stages kwokctl uses by default, taken from the pinned kwok module source.
kwok_stages() {
  local dir f
  dir="$(cd "${KEY_DIR}" && "${GO}" mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION}" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "${dir}" ]] || die "could not download sigs.k8s.io/kwok@${KWOK_VERSION}"
  mkdir -p "$(dirname "${KWOK_STAGES}")"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [[ -f "${dir}/kustomize/stage/${f}" ]] || die "kwok ${KWOK_VERSION} has no kustomize/stage/${f}"
    echo "---"
    cat "${dir}/kustomize/stage/${f}"
  done >"${KWOK_STAGES}.tmp"
  mv -f "${KWOK_STAGES}.tmp" "${KWOK_STAGES}"
  log "wrote ${KWOK_STAGES}"
}

build_kwok() {
  go_install kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" \
    "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBERNETES_VERSION}"
}

START=$(date +%s)
mapfile -t MISSING < <(missing_binaries "${ALL_BINARIES[@]}")
log "to build: ${MISSING[*]:-nothing}"
KUBE_MISSING=()
for name in "${MISSING[@]}"; do
  case "${name}" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl) KUBE_MISSING+=("${name}") ;;
  esac
done
# Small ones first, so a failure in them shows up before the long Kubernetes build.
for name in "${MISSING[@]}"; do
  case "${name}" in
    etcd) build_etcd ;;
    kwok) build_kwok ;;
    helm) build_helm ;;
  esac
done
[[ -s "${KWOK_STAGES}" ]] || kwok_stages
if [[ ${#KUBE_MISSING[@]} -gt 0 ]]; then
  build_kubernetes "${KUBE_MISSING[@]}"
fi
rm -rf "${STAGE}"

STILL_MISSING="$(missing_binaries "${ALL_BINARIES[@]}")"
[[ -z "${STILL_MISSING}" ]] || die "still missing or wrong version: ${STILL_MISSING//$'\n'/ }"
log "done in $(( $(date +%s) - START ))s"
echo "${BIN_DIR}"
