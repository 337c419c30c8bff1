#!/usr/bin/env bash
# `make image`: builds the Dockerfile (operator, router and drafter preflight in one image) with whichever
# of docker, podman or buildah is on PATH, in that order; CONTAINER_TOOL picks one, IMAGE names the
# result (default ghcr.io/specfleet/specfleet:<package version>, the chart's default). Prints the image
# name as the last line of stdout. Only bash builtins run before a tool is found, so the message for
# none works on any PATH.
set -euo pipefail
cd "${BASH_SOURCE[0]%/*}/.."

tool=${CONTAINER_TOOL:-}
if [ -z "$tool" ]; then
  for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null; then tool=$candidate; break; fi
  done
fi
if [ -z "$tool" ] || ! command -v "$tool" >/dev/null; then
  echo "make image: needs docker, podman or buildah on PATH${tool:+ (CONTAINER_TOOL=$tool is not)}; install one of them, or build the Dockerfile elsewhere" >&2
  exit 1
fi

version=""
while IFS= read -r line; do
  if [[ $line =~ ^version\ =\ \"(.*)\"$ ]]; then version=${BASH_REMATCH[1]}; break; fi
done < pyproject.toml
image=${IMAGE:-ghcr.io/specfleet/specfleet:$version}

case "${tool##*/}" in
  buildah) "$tool" bud -t "$image" -f Dockerfile . >&2 ;;
  *) "$tool" build -t "$image" -f Dockerfile . >&2 ;;
esac
echo "make image: built $image with ${tool##*/}; push it with: ${tool##*/} push $image" >&2
echo "$image"
