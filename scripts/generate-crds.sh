#!/usr/bin/env bash
# Generates a project's CRDs from its Go API module with controller-gen, both from the Go module proxy,
# once, into $SPECFLEET_CACHE/NAME-VERSION/crds; the cluster tier installs them to check what specfleet
# renders against the real schema. No YAML is copied from the project: the schema is generated from its
# types, as its own build does. Prints the directory holding the CRD files as the last line of stdout;
# everything else goes to stderr.
#
#   generate-crds.sh NAME MODULE VERSION CHECK_FILE PACKAGE...
#
# PACKAGE: controller-gen `paths=` inside the module (e.g. ./v1/...); CHECK_FILE: a CRD file that must
# result. CONTROLLER_GEN_GOFLAGS is passed to controller-gen's package loading (e.g. -mod=mod).
set -euo pipefail
[ $# -ge 5 ] || { echo "usage: $0 NAME MODULE VERSION CHECK_FILE PACKAGE..." >&2; exit 2; }
name=$1 module=$2 version=$3 check=$4
shift 4
CONTROLLER_TOOLS_VERSION=v0.20.0
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
out="$cache/$name-crds-$version"

if [ ! -f "$out/.complete" ]; then
  # Go from PATH, else where these machines install it (as testbed/build.sh finds it).
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$go" ] || { echo "setup-$name-crds: needs Go (set GO=/path/to/go)" >&2; exit 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    echo "setup-$name-crds: controller-gen $CONTROLLER_TOOLS_VERSION, $module@$version" >&2
    GOBIN="$out/bin" GOFLAGS=-buildvcs=false "$go" install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION" >&2
    src_dir=$("$go" mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$src_dir" ] || { echo "setup-$name-crds: module download failed" >&2; exit 1; }
    rm -rf "$out/src" "$out/crds"
    cp -r "$src_dir" "$out/src"
    chmod -R u+w "$out/src"
    paths=()
    for package in "$@"; do paths+=("paths=$package"); done
    (cd "$out/src" && GOFLAGS=${CONTROLLER_GEN_GOFLAGS:-} "$out/bin/controller-gen" \
      crd:allowDangerousTypes=true,maxDescLen=0 "${paths[@]}" output:crd:dir="$out/crds" >&2)
    ls "$out/crds/$check" >/dev/null
    touch "$out/.complete"
  fi
fi
echo "$out/crds"
