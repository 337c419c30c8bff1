#!/usr/bin/env bash
# Builds the test bed's ext_proc client (testbed/extproc-client, our own program: it plays a gateway's
# data plane against the real endpoint picker) once per source version into
# $SPECFLEET_CACHE/extproc-client-HASH/bin/extproc-client. Its go.mod requires the picker's module at the
# version scripts/build-epp.sh builds, so the ext_proc protocol (go-control-plane), gRPC and protobuf
# resolve to exactly the picker's pins; this script refuses a go.mod whose pins drift from the picker's.
# Built like the picker: go.sum must already hold every dependency (-mod=readonly), CGO off.
# Prints the binary's path as the last line of stdout; everything else goes to stderr.
set -euo pipefail
epp_module=sigs.k8s.io/gateway-api-inference-extension
epp_version=v1.4.0
src=$(cd "$(dirname "$0")/../testbed/extproc-client" && pwd)
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
hash=$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-12)
out="$cache/extproc-client-$hash"

if [ ! -f "$out/.complete" ]; then
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$go" ] || { echo "build-extproc-client: needs Go (set GO=/path/to/go)" >&2; exit 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    grep -qP "^\t$epp_module $epp_version\$" "$src/go.mod" \
      || { echo "build-extproc-client: go.mod must require $epp_module $epp_version" >&2; exit 1; }
    epp_dir=$("$go" mod download -json "$epp_module@$epp_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -f "$epp_dir/go.mod" ] || { echo "build-extproc-client: module download failed" >&2; exit 1; }
    # Every module both go.mods name must have one version: the client speaks the picker's protocol.
    drift=$(awk 'NR==FNR { if ($1 ~ /\./) pin[$1]=$2; next }
                 $1 in pin && pin[$1] != $2 { print $1 " " pin[$1] " (picker: " $2 ")" }' \
      <(sed 's/^\t//' "$src/go.mod") <(sed 's/^\t//' "$epp_dir/go.mod"))
    [ -z "$drift" ] || { echo "build-extproc-client: pins differ from the picker's: $drift" >&2; exit 1; }
    echo "build-extproc-client: $src (against $epp_module@$epp_version's pins)" >&2
    mkdir -p "$out/bin"
    (cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 "$go" build -trimpath \
      -o "$out/bin/extproc-client.partial" .)
    mv "$out/bin/extproc-client.partial" "$out/bin/extproc-client"
    # -h exits 0 with the usage; anything else means the binary does not run here.
    "$out/bin/extproc-client" -h >/dev/null 2>&1 || { echo "build-extproc-client: the built binary does not run" >&2; exit 1; }
    touch "$out/.complete"
  fi
fi
echo "$out/bin/extproc-client"
