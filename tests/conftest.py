"""Root test configuration, shared by every tier.

- makes tests/support importable;
- `cluster` (session): the real control plane of testbed/, started once and shared by the cluster
  and e2e tiers; never skipped: if the binaries cannot be built or the cluster cannot start, the
  tests using it error with the reason. SPECFLEET_TESTBED_KEEP=1 keeps its work dir (logs).
- `namespace`: a fresh namespace per test;
- each phase's report is kept on the test item, so fixtures can dump logs when a test failed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

if TYPE_CHECKING:
    from specfleet_testbed import Cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running cluster for the whole session; stopped (and its processes gone) at the end."""
    from specfleet_testbed import Cluster, ensure_binaries

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


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
