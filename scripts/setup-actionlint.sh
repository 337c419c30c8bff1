#!/usr/bin/env bash
# actionlint (checks .github/workflows in `make lint`), built once from the Go module proxy into
# $SPECFLEET_CACHE/actionlint-VERSION, outside the checkout. Prints the binary's path as the last line
# of stdout; everything else goes to stderr.
set -euo pipefail
ACTIONLINT_VERSION=v1.7.12
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
out="$cache/actionlint-$ACTIONLINT_VERSION"

if [ ! -f "$out/.complete" ]; then
  # Go from PATH, else where these machines install it (as testbed/build.sh finds it).
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$go" ] || { echo "setup-actionlint: needs Go (set GO=/path/to/go)" >&2; exit 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    echo "setup-actionlint: actionlint $ACTIONLINT_VERSION" >&2
    GOBIN="$out/bin" GOFLAGS=-buildvcs=false "$go" install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" >&2
    "$out/bin/actionlint" -version >&2
    touch "$out/.complete"
  fi
fi
echo "$out/bin/actionlint"
