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

if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "bootstrap: creating $venv" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  # Dependencies only (pinned by constraints.txt); the project itself is linked below.
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[dev]" >&2
  touch "$venv/.complete"
fi
# Re-link the editable install to *this* checkout (CI clones to a new folder each time); no deps, seconds.
if ! "$venv/bin/python" -c "import specfleet, sys; sys.exit(0 if specfleet.__file__.startswith('$root/') else 1)" 2>/dev/null; then
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$root" >&2
fi
echo "$venv"
