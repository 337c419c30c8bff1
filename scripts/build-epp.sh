#!/usr/bin/env bash
# Builds the Gateway API Inference Extension's endpoint picker (cmd/epp) from the Go module proxy,
# once, into $SPECFLEET_CACHE/epp-VERSION/bin/epp; the cluster tier runs it against what specfleet
# renders for gateway mode. VERSION is the one the renderer's default picker image carries
# (specfleet.api.gateway.INFERENCE_EXTENSION_VERSION; a unit test holds them equal). It is built the way
# the upstream Dockerfile builds the image: inside the module with its own go.mod and go.sum (so every
# dependency is the release's), CGO off. (`go install MODULE/cmd/epp@VERSION` fails: the proxy refuses the
# module's version list; `go mod download MODULE@VERSION` of the exact version works.)
# Prints the binary's path as the last line of stdout; everything else goes to stderr.
set -euo pipefail
module=sigs.k8s.io/gateway-api-inference-extension
version=v1.4.0
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
out="$cache/epp-$version"

if [ ! -f "$out/.complete" ]; then
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$go" ] || { echo "build-epp: needs Go (set GO=/path/to/go)" >&2; exit 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    echo "build-epp: $module@$version cmd/epp (a cold build takes minutes)" >&2
    src_dir=$("$go" mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -f "$src_dir/cmd/epp/main.go" ] || { echo "build-epp: module download failed" >&2; exit 1; }
    mkdir -p "$out/bin"
    # The module cache is read-only: build there, write the binary here. GOWORK=off: the module's
    # go.work names a directory (conformance) the module zip does not carry. -mod=readonly: its go.sum
    # must already hold every dependency, as in the release.
    (cd "$src_dir" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 "$go" build -trimpath \
      -ldflags "-X $module/version.BuildRef=$version" -o "$out/bin/epp.partial" ./cmd/epp)
    mv "$out/bin/epp.partial" "$out/bin/epp"
    "$out/bin/epp" --help >/dev/null 2>&1 || { echo "build-epp: the built binary does not run" >&2; exit 1; }
    touch "$out/.complete"
  fi
fi
echo "$out/bin/epp"
