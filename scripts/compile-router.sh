#!/usr/bin/env bash
# Compiles the router's request path with mypyc (part of mypy) into C extensions, the way the image ships
# it, and prints the folder to put first on PYTHONPATH. The source stays plain, type-checked Python:
# mypyc compiles exactly what mypy --strict already checks, and the same unit tests run against both
# (`make test-router-native`).
#
#   bash scripts/compile-router.sh [--python PY] [--out DIR]
#
# --python: an interpreter that has mypy and the product's dependencies (default: the dev venv from
# scripts/bootstrap.sh). --out: where to build (default: a folder under $SPECFLEET_CACHE keyed by the
# runtime package's sources and the mypy version, reused while they are unchanged).
# Cached builds beyond the newest three are deleted when a new one is made.
# The folder holds a copy of the whole specfleet_runtime package with a .so beside each compiled
# module (Python imports the .so first) and mypyc's shared runtime library at its top level.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "compile-router: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$python" ] || python="$(bash "$root/scripts/bootstrap.sh" | tail -n 1)/bin/python"

# The modules every request passes through. Not compiled: serving.py (an async generator, which mypyc does not
# implement), __main__, and what runs only at start-up or on config changes (kube, sources, workers).
modules=(app server message proxy stall classify upstream intake body body_scan body_fields admission backends endpoints affinity
  conversations paths errors
  reply metrics configuration)

if [ -z "$out" ]; then
  cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
  key=$( (cd "$root/runtime" && find specfleet_runtime -name '*.py' -print0 | sort -z | xargs -0 cat;
    "$python" -m mypy --version; echo "${modules[*]}") | sha256sum | cut -c1-12)
  out="$cache/router-native-$key"
  if [ -f "$out/.complete" ]; then
    echo "$out"
    exit 0
  fi
  # One build at a time per cache (the e2e tier, `make test-router-native` and the demo all ask for it),
  # and the same key may be finished by whoever held the lock first.
  mkdir -p "$cache"
  exec 9>"$cache/router-native.lock"
  flock 9
  if [ -f "$out/.complete" ]; then
    echo "$out"
    exit 0
  fi
  pruned=1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/compile-router.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$root/runtime/specfleet_runtime" "$work/"
find "$work" -name '__pycache__' -prune -exec rm -rf {} +
files=()
for module in "${modules[@]}"; do files+=("specfleet_runtime/router/$module.py"); done
echo "compile-router: mypyc ${#files[@]} modules into $out" >&2
if ! (cd "$work" && "$python" -m mypyc "${files[@]}") >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log" >&2
  echo "compile-router: mypyc failed (log above)" >&2
  exit 1
fi
rm -rf "$work/build" "$work/build.log"
mkdir -p "$(dirname "$out")"
rm -rf "$out.tmp" && cp -r "$work" "$out.tmp" && touch "$out.tmp/.complete"
rm -rf "$out" && mv "$out.tmp" "$out"
if [ -n "${pruned:-}" ]; then
  # Keep the newest three cached builds (each ~37 MB; one per source state of the runtime package).
  ls -1dt "$(dirname "$out")"/router-native-*/ 2>/dev/null | tail -n +4 | while read -r old; do
    rm -rf "${old%/}"
  done
fi
echo "$out"
