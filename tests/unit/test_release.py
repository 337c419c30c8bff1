"""How a user gets the image: `make image` (scripts/build-image.sh) and the release workflow."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-image.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
BASH = shutil.which("bash") or "bash"


def _build_image(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(BUILD)], env={"PATH": str(path), **env}, capture_output=True, text=True, check=False
    )


def test_make_image_without_a_container_tool_says_so(tmp_path: Path) -> None:
    result = _build_image(tmp_path)
    assert result.returncode == 1
    assert "make image: needs docker, podman or buildah on PATH" in result.stderr
    assert _build_image(tmp_path, CONTAINER_TOOL="nerdctl").returncode == 1


@pytest.mark.parametrize(("tool", "verb"), [("docker", "build"), ("podman", "build"), ("buildah", "bud")])
def test_make_image_builds_the_dockerfile_with_the_tool_present(tmp_path: Path, tool: str, verb: str) -> None:
    # A stand-in for the tool (none is installed here) that records how it was called.
    calls = tmp_path / "calls"
    stub = tmp_path / tool
    stub.write_text(f'#!{BASH}\nprintf "%s\\n" "$*" >> {calls}\n')
    stub.chmod(0o755)
    result = _build_image(tmp_path)
    assert result.returncode == 0, result.stderr
    version = yaml.safe_load((ROOT / "charts" / "specfleet" / "Chart.yaml").read_text())["appVersion"]
    image = f"ghcr.io/specfleet/specfleet:{version}"  # the chart's default image and tag
    assert calls.read_text() == f"{verb} -t {image} -f Dockerfile .\n"
    assert result.stdout.splitlines()[-1] == image
    assert _build_image(tmp_path, IMAGE="registry.example/me/specfleet:dev").stdout.endswith(
        "registry.example/me/specfleet:dev\n"
    )


def _steps(job: str) -> list[dict[str, object]]:
    steps: list[dict[str, object]] = yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]
    return steps


def test_release_builds_both_architectures_and_pushes_the_chart_on_version_tags() -> None:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as a boolean
    build = next(s for s in _steps("image") if str(s.get("uses", "")).startswith("docker/build-push-action"))
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"  # type: ignore[index]
    assert any("helm push" in str(s.get("run", "")) for s in _steps("chart"))


@pytest.mark.parametrize(("tag", "agrees"), [("v{version}", True), ("v9.9.9", False)])
def test_release_refuses_a_tag_that_differs_from_the_versions(tag: str, agrees: bool) -> None:
    version = yaml.safe_load((ROOT / "charts" / "specfleet" / "Chart.yaml").read_text())["appVersion"]
    check = next(s for s in _steps("image") if "must agree" in str(s.get("run", "")))
    result = subprocess.run(
        [BASH, "-eo", "pipefail", "-c", str(check["run"])],
        cwd=ROOT,
        env={**os.environ, "TAG": tag.format(version=version)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode == 0) is agrees, result.stdout


def test_release_publishes_the_guide_strictly_built_where_condition_messages_link() -> None:
    from specfleet.api.constants import DOCS_URL

    steps = _steps("docs")
    assert any("mkdocs build --strict" in str(s.get("run", "")) for s in steps)
    assert any(str(s.get("uses", "")).startswith("actions/deploy-pages@") for s in steps)
    # GitHub Pages serves a project site of owner/specfleet at https://owner.github.io/specfleet/.
    image = yaml.safe_load((ROOT / "charts" / "specfleet" / "values.yaml").read_text())["image"]["repository"]
    owner = image.split("/")[1]
    assert DOCS_URL.startswith(f"https://{owner}.github.io/specfleet/")
