"""Fixtures for the cluster tier: a real control plane (testbed/) shared by the whole session.

- ``cluster``: the running ``specfleet_testbed.Cluster`` (``.kubeconfig``, ``.bin_dir``,
  ``.kubectl(*args, input=None, check=True)``). Never skipped: if the binaries cannot be built or
  the cluster cannot start, the tests using it fail with the reason.
- ``namespace``: a fresh namespace per test, deleted afterwards (without waiting).

The first run on a machine builds the binaries (20-35 minutes on 2 cores); later runs start a
cluster in about 15 seconds. Set SPECFLEET_TESTBED_KEEP=1 to keep the work dir (logs) afterwards.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The test bed package lives in testbed/ at the repository root; make it importable without an
# install step (the repository root conftest/pyproject may not set this up).
_TESTBED = Path(__file__).resolve().parents[2] / "testbed"
try:
    import specfleet_testbed  # noqa: F401
except ImportError:
    sys.path.insert(0, str(_TESTBED))

from specfleet_testbed import Cluster, ensure_binaries  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster: needs the local Kubernetes test bed (testbed/, real apiserver)"
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running cluster for the whole session; stopped (and its processes gone) at the end."""
    bin_dir = ensure_binaries()  # raises (so the test errors, not skips) if the build fails
    keep = os.environ.get("SPECFLEET_TESTBED_KEEP") == "1"
    with Cluster(bin_dir, keep=keep) as running:
        yield running


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test (its default ServiceAccount already exists)."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
