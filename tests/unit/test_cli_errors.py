"""Bad input to the `specfleet` command, run as users run it (a separate process): each case ends with
one `error:` message and an exit code, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet import __version__
from support.manifests import ROOT

SOURCES = ["operator", "runtime", "testbed", "sandbox"]


def _specfleet(
    *argv: str, env: dict[str, str] | None = None, path_first: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    paths = ([path_first] if path_first else []) + [str(ROOT / s) for s in SOURCES]
    environment = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-m", "specfleet.cli.main", *argv],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout,
        check=False,
    )


def _fails_with(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: "), result.stderr
    for phrase in phrases:
        assert phrase in result.stderr


@pytest.mark.parametrize(
    ("content", "byte"),
    [(b"\xfc" + os.urandom(256), "0xfc"), (b"name: caf\xe9\n", "0xe9")],  # 0xfc never starts UTF-8
    ids=["random-bytes", "latin-1"],
)
def test_render_of_a_file_that_is_not_utf8(tmp_path: Path, content: bytes, byte: str):
    path = tmp_path / "sd.yaml"
    path.write_bytes(content)
    _fails_with(_specfleet("render", "-f", str(path)), f"cannot read {path}", "not UTF-8", byte)


def test_render_of_a_folder(tmp_path: Path):
    _fails_with(_specfleet("render", "-f", str(tmp_path)), f"cannot read {tmp_path}")


def test_render_of_text_that_is_not_yaml(tmp_path: Path):
    path = tmp_path / "sd.yaml"
    path.write_text("a: [\n")
    _fails_with(_specfleet("render", "-f", str(path)), "not valid YAML")


def test_simulate_of_a_file_that_is_not_utf8(tmp_path: Path):
    path = tmp_path / "sd.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    _fails_with(_specfleet("plan", "-f", str(path), "--trace", str(path)), "not UTF-8")


def test_crd_into_a_missing_folder():
    _fails_with(_specfleet("crd", "-o", "/nonexistent/dir/x.yaml"), "cannot write /nonexistent/dir/x.yaml")


def test_run_without_credentials_names_the_kubeconfig_it_tried(tmp_path: Path):
    env = {"HOME": str(tmp_path), "KUBECONFIG": ""}
    result = _specfleet("run", "--metrics-port", "0", "--liveness-port", "0", env=env)
    _fails_with(result, "no usable cluster credentials", str(tmp_path / ".kube" / "config"), "--kubeconfig")


@pytest.mark.parametrize("text", ["", "[]", "a: [", "apiVersion: v1\n"], ids=repr)
def test_run_with_a_broken_kubeconfig_names_it(tmp_path: Path, text: str):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(text)
    result = _specfleet("run", "--kubeconfig", str(kubeconfig), "--metrics-port", "0", "--liveness-port", "0")
    _fails_with(result, f"kubeconfig {kubeconfig}")


def test_status_with_a_broken_kubeconfig_names_it(tmp_path: Path):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("[]")
    _fails_with(_specfleet("status", "--kubeconfig", str(kubeconfig)), f"kubeconfig {kubeconfig}")


@pytest.fixture
def without_sandbox_extra(tmp_path: Path) -> str:
    """A folder whose sitecustomize hides the sandbox extra (openai, rich) from every Python started
    with it first on PYTHONPATH, as after a plain `pip install .`."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.modules['openai'] = None\nsys.modules['rich'] = None\n"
    )
    return str(tmp_path)


def test_sandbox_help_without_the_sandbox_extra(without_sandbox_extra: str):
    result = _specfleet("sandbox", "--help", path_first=without_sandbox_extra)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0
    assert result.stdout.startswith("usage: specfleet sandbox")


@pytest.mark.parametrize("command", ["load", "demo"])
def test_sandbox_traffic_without_the_sandbox_extra_names_it(
    without_sandbox_extra: str, tmp_path: Path, command: str
):
    result = _specfleet("sandbox", command, "--dir", str(tmp_path / "demo"), path_first=without_sandbox_extra)
    _fails_with(result, "openai", "pip install 'specfleet[sandbox]'")
    assert not (tmp_path / "demo").exists()


def test_version_flag():
    result = _specfleet("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"specfleet {__version__}"


def test_help_is_for_users_not_for_developers():
    result = _specfleet("--help")
    assert result.returncode == 0, result.stderr
    assert ".py" not in result.stdout
    assert "--version" in result.stdout


def test_a_monitoring_label_without_a_value_is_a_usage_error():
    example = str(ROOT / "examples" / "01-minimal-eagle3.yaml")
    result = _specfleet("render", "-f", example, "--monitoring-label", "release")
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    assert "expected KEY=VALUE" in result.stderr
