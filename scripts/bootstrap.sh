#!/usr/bin/env bash
# Creates (once) the project's Python environment outside the checkout and points it at this checkout.
# The venv is keyed by the dependency files, so a second run or a fresh clone on the same machine is fast.
# Prints the venv path as the last line of stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
# Keyed on what gets installed (dependency lists and pins), not on the rest of pyproject.toml.
deps=$("$python" -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]; print(p["dependencies"], p["optional-dependencies"])' "$root/pyproject.toml")
key=$( (echo "$deps"; "$python" --version; cat "$root/constraints.txt") | sha256sum | cut -c1-12)
venv="$cache/venv-$key"

create() {
  rm -rf "$venv"
  "$python" -m venv "$venv" &&
    "$venv/bin/python" -m pip install -q --upgrade pip >&2 &&
    # Pinned by constraints.txt; the project itself is linked (editable) to this checkout.
    "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[dev]" >&2
}
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  mkdir -p "$cache"
  # One creator at a time: two make runs starting together would delete each other's venv.
  exec 8>"$venv.lock"
  flock 8
  if [ ! -f "$venv/.complete" ]; then
    echo "bootstrap: creating $venv" >&2
    # A registry hiccup should not fail a CI run: one more try from scratch.
    create || { echo "bootstrap: install failed, retrying once" >&2; sleep 5; create; }
    touch "$venv/.complete"
  fi
  exec 8>&-
fi
# Re-link the editable install to *this* checkout (CI clones to a new folder each time); no deps, seconds.
if ! "$venv/bin/python" -c "import specfleet, sys; sys.exit(0 if specfleet.__file__.startswith('$root/') else 1)" 2>/dev/null; then
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$root" >&2
fi
echo "$venv"
