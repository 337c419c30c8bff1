#!/usr/bin/env bash
# Copies the CRDs a Go module ships as YAML (under SUBDIR) from the Go module proxy, once, into
# $SPECFLEET_CACHE/NAME-crds-VERSION/crds; the cluster tier installs them to check what specfleet renders
# against the real schema. For projects whose published CRDs are not plain controller-gen output of their
# types (the Gateway API's standard channel is cut by its own generator, which drops experimental
# fields), so generate-crds.sh would produce a different schema. Prints the directory holding the CRD
# files as the last line of stdout; everything else goes to stderr.
#
#   fetch-module-crds.sh NAME MODULE VERSION SUBDIR CHECK_FILE
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 NAME MODULE VERSION SUBDIR CHECK_FILE" >&2; exit 2; }
name=$1 module=$2 version=$3 subdir=$4 check=$5
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
out="$cache/$name-crds-$version"

if [ ! -f "$out/.complete" ]; then
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$go" ] || { echo "setup-$name-crds: needs Go (set GO=/path/to/go)" >&2; exit 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    echo "setup-$name-crds: $module@$version ($subdir)" >&2
    src_dir=$("$go" mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$src_dir/$subdir" ] || { echo "setup-$name-crds: module download failed" >&2; exit 1; }
    rm -rf "$out/crds"
    mkdir -p "$out/crds"
    cp "$src_dir/$subdir"/*.yaml "$out/crds/"
    chmod -R u+w "$out/crds"
    ls "$out/crds/$check" >/dev/null
    touch "$out/.complete"
  fi
fi
echo "$out/crds"
